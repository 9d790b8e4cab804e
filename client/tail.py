"""A conversation in the terminal: one line per entry, aside and halt.

How this works: `render` draws a whole conversation (entries in order, each aside after the
entry it follows, the halt last); `Watcher` remembers what it last showed and describes what
changed since (new entries, a rewritten tail, asides put, changed or removed, the halt), one
line each. `tail` keeps a replica of a conversation and, as records arrive, redraws the screen
when stdout is a terminal or prints only the lines describing each change when it is not (a
log file, a pipe). Nothing here edits the conversation.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Sequence
from typing import Any, TextIO

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
from sync.messages import AnyMessage

from .live import Draft, DraftEnded, Presence, PresenceChanged
from .replica import Replica
from .session import Applied, Connected, Disconnected, Event, Rebased, Reset
from .session import Conflict as ConflictEvent

__all__ = [
    "Watcher",
    "describe_aside",
    "describe_drafts",
    "describe_entry",
    "describe_presence",
    "one_line",
    "render",
    "tail",
]

_SPACE = re.compile(r"\s+")
_CLEAR = "\x1b[H\x1b[2J"
_WIDE = 200  # the longest line printed to something that is not a terminal


def one_line(text: str, limit: int = 120) -> str:
    """`text` with every run of whitespace (newlines too) made one space, cut to `limit`
    characters with an ellipsis."""
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
        return f"note “{one_line(str(value.get('title', '')), 40)}”: {value.get('text', '')}"
    if aside.kind == "pins" and isinstance(value, list):
        return "pins " + (" ".join(at(id_) for id_ in value) or "(none)")
    return f"{aside.kind}{_author(aside.author)}: {one_line(_json(value), 80)}"


def render(conversation: Conversation, title: str = "") -> list[str]:
    """Every line of `conversation`: each entry, each aside after the entry it follows
    (indented with `·`), then the halt if any."""
    lines = [title] if title else []
    refs = list(conversation.entries())
    drawn: dict[int, list[Aside]] = {}
    for _, aside in conversation.asides():
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
    """Lines for the drafts in progress, drawn under the last entry: the tail of the text as it
    grows (`▌` marks the cursor), then each tool call's arguments so far."""
    lines: list[str] = []
    for draft in drafts.values():
        who = f" [{draft.client}]"
        if draft.reasoning:
            lines.append(f"...  {draft.role}{who}  (thinking: {_tail_of(draft.reasoning, 60)})")
        lines.append(f"...  {draft.role}{who}  {_tail_of(draft.text, width)}▌")
        for part, text in draft.parts.items():
            if part.startswith("call:"):
                name = draft.names.get(part, "?")
                lines.append(f"       call {name}({_tail_of(text, 80)}▌ [{part[5:]}]")
    return lines


def _tail_of(text: str, limit: int) -> str:
    """The last `limit` characters of `text` on one line (an ellipsis before them if cut)."""
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
        entries = [ref.entry for ref in conversation.entries()]
        lines: list[str] = []
        same = 0
        for old, new in zip(self._entries, entries, strict=False):
            if old != new:
                break
            same += 1
        if same < len(self._entries):
            gone = len(self._entries) - same
            lines.append(f"~ from #{same} on rewritten ({gone} out, {len(entries) - same} in)")
        lines.extend(describe_entry(at, entries[at]) for at in range(same, len(entries)))
        self._entries = entries

        asides = {id_: aside for id_, aside in conversation.asides() if aside.saved}
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


def _fit(lines: Sequence[str], width: int) -> list[str]:
    return [line if len(line) <= width else line[: max(width - 1, 1)] + "…" for line in lines]


def _status(event: Event) -> str | None:
    match event:
        case Disconnected(reason=reason):
            return f"-- disconnected ({one_line(reason, 80)}); reconnecting"
        case Connected(revision=revision):
            return f"-- connected at revision {revision}"
        case ConflictEvent(reason=reason, detail=detail):
            return f"-- conflict: {reason} {detail}".rstrip()
        case DraftEnded(id=id_, status=status) if status != "committed":
            return f"-- draft {id_} ended: {status}"
    return None


async def tail(replica: Replica, out: TextIO, *, once: bool, tty: bool) -> None:
    """Show `replica`'s conversation on `out` until cancelled (or once, with `once`).

    With `tty`, every change redraws the screen (the latest lines that fit); otherwise the
    whole conversation is printed once and then only the lines for each change.
    """
    conversation = replica.conversation
    name = replica.conversation_id

    def title(status: str) -> str:
        revision = replica.session.confirmed.revision
        return f"{name} · revision {revision} · {len(conversation)} entries{status}"

    watcher = Watcher()
    watcher.changes(conversation)  # what is drawn below counts as seen
    replica.events_nowait()  # the connection's own events: the state drawn has them
    if once or not tty:
        for line in _fit([title(""), *render(conversation)], _WIDE):
            print(line, file=out)
        out.flush()
        if once:
            return
    status = ""

    def live() -> list[str]:
        return [*describe_drafts(replica.drafts), describe_presence(replica.presence)]

    if tty:
        _redraw(out, [title(status), *render(conversation), *live()])
    async for event in replica.events():
        events = [event, *replica.events_nowait()]
        notes = [note for note in map(_status, events) if note is not None]
        if any(isinstance(e, Disconnected) for e in events):
            status = " · disconnected, reconnecting"
        if any(isinstance(e, Connected) for e in events):
            status = ""
        if tty:
            # The drafts grow in place under the last entry; the presence line follows.
            _redraw(out, [title(status), *render(conversation), *live(), *notes[-1:]])
            continue
        if any(isinstance(e, PresenceChanged) for e in events):
            notes.append(describe_presence(replica.presence))
        if any(isinstance(e, Applied | Rebased | Reset) for e in events) or notes:
            for line in _fit([*notes, *watcher.changes(conversation)], _WIDE):
                print(line, file=out)
            out.flush()


def _redraw(out: TextIO, lines: list[str]) -> None:
    size = shutil.get_terminal_size()
    body = lines[1:]
    room = max(size.lines - 2, 1)
    if len(body) > room:
        body = [f"… {len(body) - room + 1} lines above", *body[-(room - 1) :]]
    out.write(_CLEAR + "\n".join(_fit([lines[0], *body], size.columns)) + "\n")
    out.flush()
