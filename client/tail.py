"""A conversation in the terminal: one line per entry, aside and halt.

How this works: `render` draws a whole conversation (entries in order, each aside after the
entry it follows, the halt last); `Bottom` gives the last lines of that same drawing working
back from the end, so it describes only the entries it returns; `Watcher` remembers what it
last showed and describes what changed since (new entries, a rewritten tail, asides put,
changed or removed, the halt), one line each. `tail` keeps a replica of a conversation and, as
records arrive, redraws the screen with `rich`'s `Live` display when stdout is a terminal (only
the lines that fit, so a change costs what the screen shows, not what the conversation holds)
or prints only the lines describing each change when it is not (a log file, a pipe). A
conversation the hub has no log for (revision 0: the first append makes revision 1) is
reported as not existing yet. Nothing here edits the conversation.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

import anyio
from rich.console import Console
from rich.live import Live
from rich.text import Text as Styled

from sync import (
    Aside,
    Assistant,
    Author,
    Conversation,
    Document,
    Entry,
    Image,
    Json,
    Reasoning,
    System,
    Text,
    ToolCall,
    ToolResult,
    User,
)
from sync.approvals import APPROVAL_KIND, approval_of
from sync.messages import AnyMessage
from sync.steer import QUEUED_KIND, STEP_KIND, STOP_KIND, queued_entry

from .http import HubError
from .live import Draft, DraftEnded, Presence, PresenceChanged
from .replica import Replica
from .session import Applied, Connected, Disconnected, Event, Rebased, Reset
from .session import Conflict as ConflictEvent
from .signals import on_signals

__all__ = [
    "Bottom",
    "Watcher",
    "describe_aside",
    "describe_drafts",
    "describe_entry",
    "describe_presence",
    "exists",
    "one_line",
    "printable",
    "render",
    "screen",
    "tail",
]

_SPACE = re.compile(r"\s+")
_WIDE = 200  # the longest line printed to something that is not a terminal
# C0 and C1 control characters and DEL: model or tool text holding ESC sequences would
# otherwise reach the terminal (clear the screen, set colours or the window's title).
_CONTROLS = dict.fromkeys([*range(0x20), 0x7F, *range(0x80, 0xA0)], None) | {0x09: " "}


def printable(line: str) -> str:
    """`line` without C0/C1 control characters (a tab becomes a space): safe to print."""
    return line.translate(_CONTROLS)


def one_line(text: str, limit: int = 120) -> str:
    """`text` with every run of whitespace (newlines too) made one space, cut to `limit`
    characters with an ellipsis."""
    head = text[: 4 * limit + 8]  # enough for `limit` characters unless mostly whitespace
    flat = _SPACE.sub(" ", head).strip()
    if len(flat) <= limit and len(head) < len(text):
        flat = _SPACE.sub(" ", text).strip()
    return flat if len(flat) <= limit else flat[: max(limit - 1, 0)] + "…"


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


def _part(part: object) -> str:
    match part:
        case Text(text):
            return one_line(text)
        case ToolCall(id=call_id, name=name, arguments=arguments):
            return f"call {name}({one_line(_json(arguments), 80)}) [{call_id}]"
        case ToolResult(call_id=call_id, name=name, content=content, is_error=is_error):
            body = " ".join(_part(item) for item in content) or "(empty)"
            word = "error" if is_error else "result"
            return f"{word} {name} [{call_id}]: {one_line(body, 100)}"
        case Reasoning(text=text, redacted=redacted):
            return "(thinking, redacted)" if redacted else f"(thinking: {one_line(text, 60)})"
        case Image(media_type=media_type, url=url):
            return f"[image {media_type}{' ' + url if url else ''}]"
        case Document(media_type=media_type, name=name):
            return f"[document {name or media_type}]"
        case Json(value=value):
            return one_line(_json(value), 100)
    return f"[{type(part).__name__.lower()}]"


def _message(message: AnyMessage) -> tuple[str, str]:
    match message:
        case System(content=content):
            return "system", one_line(content)
        case User(content=content):
            return "user", " | ".join(_part(part) for part in content) or "(empty)"
        case Assistant(content=content, stop=stop):
            text = " | ".join(_part(part) for part in content) or "(empty)"
            if stop is not None and stop.reason != "stop":
                detail = f": {one_line(stop.detail, 40)}" if stop.detail else ""
                text += f"  (stop {stop.reason}{detail})"
            return "assistant", text
    return type(message).__name__.lower(), ""


def _author(author: Author | None) -> str:
    if author is None:
        return ""
    name = author.kind + (f":{author.name}" if author.name else "")
    if author.title:
        name += f" “{author.title}”"
    return f" [{name}]"


def describe_entry(index: int, entry: Entry) -> str:
    """One line for entry `index`: `#3 assistant [agent:worker] text | call name(args)`."""
    role, text = _message(entry.message)
    return f"#{index:<3} {role}{_author(entry.author)}  {text}"


def describe_aside(aside: Aside, index_of: Callable[[str], int | None]) -> str:
    """One line for an aside: a turn record, a note, the pins or any other kind (its value
    summarized). `index_of` turns an entry id into its index (None: not here)."""

    def at(id_: object) -> str:
        index = index_of(id_) if isinstance(id_, str) else None
        return f"#{index}" if index is not None else "(gone)"

    value = aside.value
    if aside.kind == "rig.turn" and isinstance(value, dict):
        head = f"turn {value.get('index', '?')} from {at(value.get('start'))}"
        end = value.get("end")
        if not isinstance(end, dict):
            return f"{head}: running"
        how = end.get("how")
        if how == "answered":
            answer = end.get("answer")
            return f"{head}: answered{' by ' + at(answer) if answer else ''}"
        why = end.get("why")
        return f"{head}: {how}{': ' + one_line(str(why), 60) if why else ''}"
    if aside.kind == "note" and isinstance(value, dict):
        title, text = one_line(str(value.get("title", "")), 40), value.get("text", "")
        return f"note “{title}”: {one_line(str(text), 100)}"
    if aside.kind == QUEUED_KIND and isinstance(value, dict):
        entry = queued_entry(aside)
        return f"queued: {_message(entry.message)[1] if entry else '(malformed)'}"
    if aside.kind == STOP_KIND:
        return f"stop requested{_author(aside.author)}"
    if aside.kind == APPROVAL_KIND:
        return _describe_approval(aside)
    if aside.kind == "pins" and isinstance(value, list):
        return "pins " + (" ".join(at(id_) for id_ in value) or "(none)")
    return f"{aside.kind}{_author(aside.author)}: {one_line(_json(value), 80)}"


def _describe_approval(aside: Aside) -> str:
    """An approval or question (SPEC 12): open ones say how to decide them from here."""
    approval = approval_of(aside)
    if approval is None:
        return f"{aside.kind}: (malformed)"
    what = f"call {approval.call}" if approval.call else "question"
    prompt = f" “{one_line(approval.prompt, 80)}”" if approval.prompt else ""
    head = f"approval {approval.key} ({what}, asked by {approval.asked_by}){prompt}"
    if approval.is_open:
        return f"{head}: OPEN (convsync approve ID {approval.key} [--deny])"
    answer = f" {one_line(_json(approval.answer), 60)}" if approval.answer is not None else ""
    who = f" by {approval.decided_by}" if approval.decided_by else ""
    why = f": {one_line(approval.reason, 60)}" if approval.reason else ""
    return f"{head}: {approval.state}{answer}{who}{why}"


def render(conversation: Conversation, title: str = "") -> list[str]:
    """Every line of `conversation`: each entry, each aside after the entry it follows
    (indented with `·`), then the halt if any."""
    lines = [title] if title else []
    refs = list(conversation.entries())
    drawn: dict[int, list[Aside]] = {}
    for _, aside in conversation.asides():
        if aside.kind != STEP_KIND:  # a live marker: the draft line shows the work
            drawn.setdefault(conversation.aside_position(aside), []).append(aside)
    index_of = conversation.index_of
    for at in range(len(refs) + 1):
        for aside in drawn.get(at, []):
            lines.append(f"     · {describe_aside(aside, index_of)}")
        if at < len(refs):
            lines.append(describe_entry(at, refs[at].entry))
    for at in sorted(k for k in drawn if k > len(refs)):
        lines.extend(f"     · {describe_aside(aside, index_of)}" for aside in drawn[at])
    if not refs and not drawn:
        lines.append("(no entries)")
    halt = conversation.halted()
    if halt is not None:
        lines.append(f"     ! halted: {halt.value}")
    return lines


def describe_drafts(drafts: dict[str, Draft], width: int = 120) -> list[str]:
    """Lines of at most `width` characters for the drafts in progress, drawn under the last
    entry: the end of the text as it grows (`▌` marks the cursor), then each tool call's
    arguments so far."""
    lines: list[str] = []
    for draft in drafts.values():
        head = f"...  {draft.role} [{draft.client}]  "
        room = max(width - len(head) - 1, 10)
        if draft.reasoning:
            thinking = _tail_of(draft.reasoning, min(room - 12, 60))
            lines.append(f"{head}(thinking: {thinking})")
        lines.append(f"{head}{_tail_of(draft.text, room)}▌")
        for part, text in draft.parts.items():
            if part.startswith("call:"):
                name = draft.names.get(part, "?")
                lines.append(f"       call {name}({_tail_of(text, 80)}▌ [{part[5:]}]")
    return lines


def _tail_of(text: str, limit: int) -> str:
    """The last `limit` characters of `text` on one line (an ellipsis before them if cut).
    Only the end of `text` is read, so a long draft costs no more than a short one."""
    limit = max(limit, 2)
    end = text[-4 * limit :]
    flat = _SPACE.sub(" ", end)
    if len(end) < len(text) and len(flat) <= limit + 1:  # mostly whitespace: read it all
        flat = _SPACE.sub(" ", text)
    return flat if len(flat) <= limit else "…" + flat[-(limit - 1) :]


def describe_presence(presence: dict[str, Presence]) -> str:
    """One line of who is online: `online: worker (agent, drafting) · ui (user)`."""
    if not presence:
        return "online: (nobody)"
    shown = []
    for client, who in sorted(presence.items()):
        notes = [note for note in (who.kind, who.status) if note]
        label = who.name or client
        shown.append(
            f"{one_line(label, 40)} ({', '.join(notes)})" if notes else one_line(label, 40)
        )
    return "online: " + " · ".join(shown)


class Watcher:
    """Describes, one line each, what changed in a conversation since the last look."""

    def __init__(self) -> None:
        self._entries: list[Entry] = []
        self._asides: dict[str, Aside] = {}
        self._halt: str | None = None

    def changes(self, conversation: Conversation) -> list[str]:
        """The lines for what changed since the last call (all of it the first time), and
        remember `conversation` as seen."""
        # The entries themselves, compared by identity first: a pass over the conversation
        # per change, with no copy of an entry (`entries()` would make two per entry).
        entry = conversation.entry
        entries = [held for at in range(len(conversation)) if (held := entry(at)) is not None]
        lines: list[str] = []
        same = 0
        for old, new in zip(self._entries, entries, strict=False):
            if old is not new and old != new:
                break
            same += 1
        if same < len(self._entries):
            gone = len(self._entries) - same
            lines.append(f"~ from #{same} on rewritten ({gone} out, {len(entries) - same} in)")
        lines.extend(describe_entry(at, entries[at]) for at in range(same, len(entries)))
        self._entries = entries

        asides = {
            id_: aside
            for id_, aside in conversation.asides()
            if aside.saved and aside.kind != STEP_KIND
        }
        index_of = conversation.index_of
        for id_, aside in asides.items():
            old_aside = self._asides.get(id_)
            if old_aside is None:
                lines.append(f"     + {describe_aside(aside, index_of)}")
            elif old_aside != aside:
                lines.append(f"     ~ {describe_aside(aside, index_of)}")
        for id_, aside in self._asides.items():
            if id_ not in asides:
                lines.append(f"     - {describe_aside(aside, index_of)}")
        self._asides = asides

        halt = conversation.halted()
        value = halt.value if halt is not None else None
        if value != self._halt:
            lines.append(f"     ! halted: {value}" if value else "     ! halt cleared")
        self._halt = value
        return lines


class Bottom:
    """The last lines of `render(conversation)`, found from the end of the conversation.

    `last(count)` gives `render(conversation)[-count:]` and describes only the entries and
    asides it returns, so its cost follows `count`, not the conversation's length. It reads
    the entries afresh on every call and keeps, between calls, the asides grouped by the entry
    they follow and those whose entry is not made yet (drawn last). Those are looked at again
    only when the conversation moved (its lineage, revision or length changed): regrouped
    when the asides changed, else only the entries not made yet are looked up, unless a
    reset may have dropped entries without retiring them. Call `forget` after a change none
    of those show, or after a rebase or a reset (`Rebased`, `Reset`): the next call then
    starts afresh.
    """

    def __init__(self, conversation: Conversation) -> None:
        self.conversation = conversation
        self._seen: tuple[int, int, int] | None = None  # (lineage, revision, length) seen
        self._tail: Entry | None = None  # the last entry then
        self._asides: list[tuple[str, Aside]] = []
        # entry id (None: before the first) -> (order put, aside), in the order put
        self._after: dict[str | None, list[tuple[int, Aside]]] = {}
        self._unmade: set[str] = set()  # entry ids asides follow that are neither held nor out
        self._last: list[tuple[int, Aside]] = []  # their asides, in the order put

    def forget(self) -> None:
        """Look at every aside again on the next call."""
        self._seen = None

    def last(self, count: int) -> tuple[list[str], int]:
        """The last `count` lines of `render(conversation)` (all of them when it has fewer),
        and how many lines are above them."""
        self._refresh()
        conversation = self.conversation
        shown: list[str] = []  # from the bottom up
        halt = conversation.halted()
        if halt is not None:
            shown.append(f"     ! halted: {halt.value}")
        length = len(conversation)
        if not length and not self._asides:
            shown.append("(no entries)")
        total = len(shown) + length + len(self._asides)
        index_of = conversation.index_of
        at = length
        while len(shown) < count and at >= 0:
            # Position `at`: the asides drawn before entry `at`, then entry `at`, read upwards.
            for _, aside in reversed(self._before(at, length)):
                if len(shown) >= count:
                    break
                shown.append(f"     · {describe_aside(aside, index_of)}")
            at -= 1
            if at >= 0 and len(shown) < count:
                entry = conversation.entry(at)
                assert entry is not None
                shown.append(describe_entry(at, entry))
        del shown[max(count, 0) :]
        shown.reverse()
        return shown, total - len(shown)

    def _before(self, at: int, length: int) -> list[tuple[int, Aside]]:
        """The asides drawn before entry `at` (after the last entry when `at == length`), in
        the order put: `Conversation.aside_position` worked backwards."""
        if at == 0:
            # Reached only when every entry fits on the screen: a pass over the asides then
            # costs no more than drawing them.
            first = list(self._after.get(None, []))
            is_retired = self.conversation.is_retired
            for after, group in self._after.items():
                if after is not None and is_retired(after):
                    first.extend(group)
            return sorted(first if length else first + self._last, key=_put_order)
        group = self._after.get(self.conversation.id(at - 1), [])
        if at == length and self._last:
            return sorted(group + self._last, key=_put_order)
        return group

    def _refresh(self) -> None:
        conversation = self.conversation
        length = len(conversation)
        seen = (conversation.lineage, conversation.revision, length)
        if seen == self._seen:
            return
        before, self._seen = self._seen, seen
        tail, self._tail = self._tail, conversation.entry(length - 1)
        # A copy of the list, compared by identity first; step markers are live state, not
        # drawn (the draft line shows the work).
        asides = [item for item in conversation.asides() if item[1].kind != STEP_KIND]
        index_of, is_retired = conversation.index_of, conversation.is_retired
        # When the entry that was last is still there, no reset replaced the entries (a reset
        # from the hub brings new objects), so every entry taken out since was retired (its
        # asides are drawn first, found when the top is drawn): an id held before is held or
        # retired now, and only ids not made yet, or new here, need looking up.
        kept = (
            before is not None
            and before[0] == seen[0]
            and conversation.entry(before[2] - 1) is tail
        )
        keys: Iterable[str | None]
        if asides != self._asides:
            self._asides = asides
            grouped: dict[str | None, list[tuple[int, Aside]]] = {}
            for order, (_, aside) in enumerate(asides):
                grouped.setdefault(aside.after, []).append((order, aside))
            old, self._after = self._after, grouped
            keys = [k for k in grouped if k not in old or k in self._unmade] if kept else grouped
        else:
            keys = self._unmade if kept else self._after
        self._unmade = {
            key for key in keys if key is not None and index_of(key) is None and not is_retired(key)
        }
        self._last = sorted(
            (item for key in self._unmade for item in self._after.get(key, [])), key=_put_order
        )


def _put_order(item: tuple[int, Aside]) -> int:
    return item[0]


def _status(event: Event) -> str | None:
    match event:
        case Disconnected(reason=reason) if reason.startswith("refused:"):
            # The replica stopped for good (`Replica._stop_refused`): it will not come back.
            return f"-- disconnected ({one_line(reason, 80)}); not reconnecting"
        case Disconnected(reason=reason):
            return f"-- disconnected ({one_line(reason, 80)}); reconnecting"
        case Connected(revision=revision):
            return f"-- connected at revision {revision}"
        case ConflictEvent(reason=reason, detail=detail):
            return f"-- conflict: {reason} {detail}".rstrip()
        case DraftEnded(id=id_, status=status) if status != "committed":
            return f"-- draft {id_} ended: {status}"
    return None


def exists(replica: Replica) -> bool:
    """Whether the hub has a log for `replica`'s conversation, as of the records the replica
    has seen: the hub welcomes a conversation with no log at revision 0, and the first append
    makes revision 1 (revisions never go back, a rewrite included)."""
    return replica.revision > 0


def _waiting(name: str) -> str:
    return f"waiting for the first entry: the hub has no conversation {name!r} yet"


def _title(replica: Replica, status: str = "") -> str:
    conversation = replica.conversation
    revision = replica.revision
    return f"{replica.conversation_id} · revision {revision} · {len(conversation)} entries{status}"


async def tail(replica: Replica, out: TextIO, *, once: bool, tty: bool) -> None:
    """Show `replica`'s conversation on `out` until cancelled (or once, with `once`).

    With `once`, print a header and the whole conversation. Otherwise, with `tty` (and a
    terminal that is not `TERM=dumb`), keep a live view on the terminal's alternate screen:
    the header, the latest lines that fit, the drafts in progress and who is online, redrawn
    after each change and on a resize. Without `tty`, print the header and the whole
    conversation once, then only the lines for each change. A conversation the hub has no
    log for shows a line saying so until its first record arrives.

    Raises:
        HubError: `no_conversation`, with `once`, when the hub has no log for it.
    """
    if once and not exists(replica):
        raise HubError(
            "no_conversation", f"the hub has no conversation {replica.conversation_id!r} yet"
        )
    replica.events_nowait()  # the connection's own events: the state drawn has them
    if tty and not once:
        console = Console(file=out, force_terminal=True)
        if not console.is_dumb_terminal:
            await _on_screen(replica, console)
            return
    await _in_lines(replica, out, once=once)


def _print(out: TextIO, lines: Sequence[str]) -> None:
    for line in map(printable, lines):
        print(line if len(line) <= _WIDE else line[: _WIDE - 1] + "…", file=out)
    out.flush()


async def _in_lines(replica: Replica, out: TextIO, *, once: bool) -> None:
    """The whole conversation, then (unless `once`) the lines for each change."""
    conversation = replica.conversation
    watcher = Watcher()
    watcher.changes(conversation)  # what is printed below counts as seen
    waiting = not exists(replica)
    body = [_waiting(replica.conversation_id)] if waiting else render(conversation)
    _print(out, [_title(replica), *body])
    if once:
        return
    async for event in replica.events():
        events = [event, *replica.events_nowait()]
        notes = [note for note in map(_status, events) if note is not None]
        if any(isinstance(e, PresenceChanged) for e in events):
            notes.append(describe_presence(replica.presence))
        if any(isinstance(e, Applied | Rebased | Reset) for e in events) or notes:
            _print(out, [*notes, *watcher.changes(conversation)])


# The live view's styles (rich style names); plain text when colour is off (NO_COLOR, a
# terminal without colours).
_STYLES = {"title": "bold", "aside": "dim", "halt": "bold red", "draft": "yellow"}
_STYLES |= {"online": "dim", "note": "magenta", "above": "dim", "waiting": "italic"}
_FRAME = 0.05  # seconds between two redraws at least: a burst of changes makes one


def screen(
    bottom: Bottom, replica: Replica, height: int, width: int, status: str = "", note: str = ""
) -> Styled:
    """The live view for a terminal of `height` x `width`, one line each: the header, the
    latest lines of the conversation that fit (the first of them saying how many are above),
    the drafts in progress, who is online and `note`. Only the lines shown are described."""
    live = [(line, _STYLES["draft"]) for line in describe_drafts(replica.drafts, width)]
    live.append((describe_presence(replica.presence), _STYLES["online"]))
    if note:
        live.append((note, _STYLES["note"]))
    room = max(height - 1 - len(live), 1)
    if not exists(replica):
        body = [(_waiting(replica.conversation_id), _STYLES["waiting"])]
    else:
        shown, above = bottom.last(room)
        body = [(line, _style_of(line)) for line in shown]
        if above:
            body[0] = (f"… {above + 1} lines above", _STYLES["above"])
    view = Styled(no_wrap=True, overflow="ellipsis", end="")
    head = (_title(replica, status), _STYLES["title"])
    for at, (raw, style) in enumerate([head, *body, *live]):
        if at:
            view.append("\n")
        line = printable(raw)
        # Cut here, by characters: rich then only measures lines that fit (or hold wide
        # characters, which it cuts by cells); measuring every long line costs it more.
        view.append(line if len(line) <= width else line[: max(width - 1, 1)] + "…", style)
    return view


def _style_of(line: str) -> str:
    if line.startswith("     ·"):
        return _STYLES["aside"]
    if line.startswith("     !"):
        return _STYLES["halt"]
    return ""


async def _on_screen(replica: Replica, console: Console) -> None:
    """The live view on `console` until cancelled; bursts of events make one redraw."""
    bottom = Bottom(replica.conversation)
    status = ""
    arrived: list[Event] = []
    wake = anyio.Event()

    def frame(note: str = "") -> Styled:
        width, height = console.size
        return screen(bottom, replica, height, width, status, note)

    async def read() -> None:
        async for event in replica.events():
            arrived.append(event)
            wake.set()

    def resized() -> None:
        wake.set()

    with (
        Live(
            frame(),
            console=console,
            screen=True,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,
        ) as live,
        on_signals(("SIGWINCH",), resized),  # the terminal was resized
    ):
        async with anyio.create_task_group() as group:
            group.start_soon(read)
            while True:
                await wake.wait()
                wake = anyio.Event()
                events, arrived[:] = list(arrived), []
                notes = [note for note in map(_status, events) if note is not None]
                if any(isinstance(e, Disconnected) for e in events):
                    status = " · disconnected, " + (
                        "not reconnecting" if replica.refused is not None else "reconnecting"
                    )
                if any(isinstance(e, Connected) for e in events):
                    status = ""
                if any(isinstance(e, Rebased | Reset) for e in events):
                    bottom.forget()
                live.update(frame(notes[-1] if notes else ""), refresh=True)
                await anyio.sleep(_FRAME)  # what arrives meanwhile goes in the next frame
