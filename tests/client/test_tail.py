"""`convsync tail`: the bottom of a conversation drawn from the end, a redraw bounded by the
screen, a conversation that does not exist yet, and the import progress bar; the command
line tests run the installed console script, on a pipe and on a pseudo-terminal."""

from __future__ import annotations

import asyncio
import fcntl
import io
import os
import pty
import random
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import msgspec
import pytest
from cliproc import CONVSYNC, ROOT, Running, cli_env, convsync
from conftest import bound
from terminal import frames, last_frame, plain

import client.tail
from client.live import Draft, DraftChanged
from client.session import Applied, Disconnected
from client.tail import Bottom, render, tail
from sync import Aside, Author, Conversation, Entry, Message, TurnEnd, decode_record, encode
from sync.changes import ChangeRecord, Reset
from sync.snapshot import ConversationSnapshot

TIMEOUT = bound(20.0)


# ---------------------------------------------------------------------- the bottom lines


def expected(conversation: Conversation, count: int) -> tuple[list[str], int]:
    """What `Bottom.last(count)` must give: the end of `render`, and how many lines above."""
    lines = render(conversation)
    shown = lines[len(lines) - min(count, len(lines)) :] if count > 0 else []
    return shown, len(lines) - len(shown)


def check_bottom(bottom: Bottom, conversation: Conversation) -> None:
    """`bottom` (kept across edits) and a fresh `Bottom` agree with `render` at every count."""
    total = len(render(conversation))
    for count in sorted({0, 1, 2, 3, 5, total - 1, total, total + 2}):
        assert bottom.last(count) == expected(conversation, count), count
        assert Bottom(conversation).last(count) == expected(conversation, count), count


def test_bottom_is_the_end_of_render_through_edits() -> None:
    """`Bottom.last(n)` is `render(...)[-n:]` with the count above, as entries and asides
    come, move, are taken out (their asides drawn first) or are not made yet (drawn last)."""
    elsewhere = Conversation()
    unmade = elsewhere.push(Message.user("made elsewhere"))  # an id this one never had
    conversation = Conversation()
    bottom = Bottom(conversation)
    check_bottom(bottom, conversation)  # "(no entries)"
    conversation.add_aside(Aside.note("first", "before any entry", None))
    conversation.add_aside(Aside("mark", unmade, Author.user(), {"n": 1}))
    check_bottom(bottom, conversation)  # asides only: all drawn before entry 0
    ids = conversation.extend([Message.user(f"question {n}") for n in range(6)])
    check_bottom(bottom, conversation)  # the unmade one after the last entry
    conversation.add_aside(Aside.note("on 2", "after entry 2", ids[2]))
    conversation.add_aside(Aside.note("on 5", "after the last", ids[5]))
    conversation.open_turn()
    answer = conversation.push(Message.assistant("answer"))
    conversation.end_turn(TurnEnd.answered(answer))
    check_bottom(bottom, conversation)
    conversation.splice(slice(2, 4), [Message.user("summary")], Author.user())  # 2 retired
    check_bottom(bottom, conversation)  # the note on 2 now drawn first
    conversation.push(Entry(Message.user("came later"), id=unmade))
    check_bottom(bottom, conversation)  # the mark follows its entry now
    assert conversation.halt("kept")
    check_bottom(bottom, conversation)
    conversation.resume()
    conversation.reset(Conversation.from_messages([Message.user("fresh")]))
    bottom.forget()  # a reset made here: the contract asks for it
    check_bottom(bottom, conversation)


@pytest.mark.parametrize("seed", range(12))
def test_bottom_is_the_end_of_render_after_random_edits(seed: int) -> None:
    """Random pushes, splices, asides put, replaced and removed, halts, resets from the hub:
    a `Bottom` kept all along stays equal to the end of `render`."""
    rng = random.Random(seed)
    elsewhere = Conversation()
    strangers = [elsewhere.push(Message.user(f"s{n}")) for n in range(3)]
    conversation = Conversation()
    bottom = Bottom(conversation)
    for step in range(60):
        ids = [conversation.id(at) for at in range(len(conversation))]
        asides = [id_ for id_, _ in conversation.asides()]
        op = rng.randrange(7)
        if op <= 1 or not ids:
            conversation.push(Message.user(f"step {step}"))
        elif op == 2:
            start = rng.randrange(len(ids))
            stop = min(start + rng.randrange(3), len(ids))
            new = [Message.user(f"put {step}")] * rng.randrange(3)
            conversation.splice(slice(start, stop), new, Author.user())
        elif op == 3:
            retired = [id_ for id_ in strangers + ids if conversation.is_retired(id_)]
            after = rng.choice([None, *ids, *strangers, *retired])
            conversation.add_aside(Aside.note(f"n{step}", "text", after))
        elif op == 4 and asides:
            after = rng.choice([None, *ids, *strangers])
            conversation.replace_aside(rng.choice(asides), Aside.note("moved", "x", after))
        elif op == 5 and asides:
            conversation.remove_aside(rng.choice(asides))
        elif op == 6:
            if not conversation.halt("stopped"):
                conversation.resume()
        if rng.random() < 0.1:
            conversation.push(Entry(Message.user("a stranger"), id=rng.choice(strangers)))
        if rng.random() < 0.08 and len(conversation) > 1:
            # A reset from the hub (decoded: new objects) that drops an entry without
            # retiring it: the asides after it are drawn last now. No `forget`: a record.
            state = conversation.state()
            dropped = rng.randrange(len(state.entries) - 1)
            entries = state.entries[:dropped] + state.entries[dropped + 1 :]
            record = ChangeRecord(Reset(msgspec.structs.replace(state, entries=entries)))
            conversation.apply(decode_record(encode(record)))
        for count in (0, 1, 4, 9, 200):
            assert bottom.last(count) == expected(conversation, count), (step, count)


# ---------------------------------------------------------------------- drawing is bounded


class StandIn:
    """What `tail` reads of a replica: a real conversation, drafts, presence and events."""

    conversation_id = "big"

    def __init__(self, conversation: Conversation) -> None:
        self.conversation = conversation
        self.drafts: dict[str, Draft] = {}
        self.presence: dict[str, Any] = {}
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.session = SimpleNamespace(confirmed=conversation)

    @property
    def revision(self) -> int:
        return self.conversation.revision

    async def events(self) -> AsyncIterator[Any]:
        while True:
            yield await self.queue.get()

    def events_nowait(self) -> list[Any]:
        taken = []
        while not self.queue.empty():
            taken.append(self.queue.get_nowait())
        return taken


class Screen(io.StringIO):
    """A terminal's stdout that counts the frames flushed to it."""

    def __init__(self) -> None:
        super().__init__()
        self.drawn = 0
        self.frame = asyncio.Event()

    def isatty(self) -> bool:
        return True

    def flush(self) -> None:
        if "entries" in self.getvalue().rsplit("\x1b[H", 1)[-1]:
            self.drawn += 1
            self.frame.set()

    async def next_frame(self) -> list[str]:
        with anyio.fail_after(TIMEOUT):
            await self.frame.wait()
        self.frame.clear()
        return last_frame(self.getvalue())


async def test_a_redraw_describes_only_the_lines_that_fit_the_screen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At 50,000 entries the first draw and each redraw (a new entry, a draft growing)
    describe no more entries than the screen has lines, and show the latest of them."""
    monkeypatch.setenv("LINES", "30")
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("TERM", "xterm")
    described: list[int] = []
    describe = client.tail.describe_entry

    def counted(index: int, entry: Entry) -> str:
        described.append(index)
        return describe(index, entry)

    monkeypatch.setattr(client.tail, "describe_entry", counted)
    conversation = Conversation.from_messages(Message.user(f"q{n}") for n in range(50_000))
    conversation.take_unsaved()
    conversation.continue_log(1, 1)  # as a replica holds it: the log's revision 1
    replica = StandIn(conversation)
    out = Screen()
    async with anyio.create_task_group() as group:
        group.start_soon(partial(tail, replica, out, once=False, tty=True))  # type: ignore[arg-type]
        screen = await out.next_frame()
        assert len(described) <= 30
        assert screen[0] == "big · revision 1 · 50000 entries"
        assert screen[1] == "… 49973 lines above"
        assert screen[-2] == "#49999 user  q49999"
        assert len(screen) == 30

        described.clear()
        conversation.push(Message.user("one more"))
        replica.queue.put_nowait(Applied(1, conversation.revision))
        screen = await out.next_frame()
        assert 0 < len(described) <= 30
        assert screen[-2] == "#50000 user  one more"

        described.clear()
        replica.drafts["d1"] = Draft("d1", "assistant", "worker", "worker", 0)
        replica.drafts["d1"].parts["text"] = "Thinking about it"
        replica.queue.put_nowait(DraftChanged("d1"))
        screen = await out.next_frame()
        assert len(described) <= 30
        assert screen[-2] == "...  assistant [worker]  Thinking about it▌"
        assert screen[-3] == "#50000 user  one more"
        group.cancel_scope.cancel()


# ---------------------------------------------------------------------- the command line


class OnTerminal:
    """A console-script process whose stdout and stderr are a pseudo-terminal of a given
    size; a thread collects what it writes."""

    def __init__(self, *args: str, rows: int, columns: int) -> None:
        master, slave = pty.openpty()
        self.master = master
        self.resize(rows, columns)
        self.proc = subprocess.Popen(
            [str(CONVSYNC), *args],
            stdin=subprocess.DEVNULL,
            stdout=slave,
            stderr=slave,
            env=cli_env(TERM="xterm-256color"),
            cwd=ROOT,
            start_new_session=True,
        )
        os.close(slave)
        self._chunks: list[bytes] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read)
        self._reader.start()

    def resize(self, rows: int, columns: int) -> None:
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: the process closed its side
                return
            if not chunk:
                return
            with self._lock:
                self._chunks.append(chunk)

    @property
    def output(self) -> str:
        with self._lock:
            return b"".join(self._chunks).decode(errors="replace")

    def wait_until(self, check: Callable[[str], bool], what: str) -> str:
        """The output once `check(output)` holds (a bounded poll: a terminal gives no event
        to wait on)."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            output = self.output
            if check(output):
                return output
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} in time; last frame: {last_frame(output)}")
            time.sleep(0.02)

    def frame_with(self, text: str) -> list[str]:
        """The latest frame, once one holds `text`."""
        output = self.wait_until(
            lambda out: bool(frames(out)) and any(text in line for line in last_frame(out)),
            f"frame with {text!r}",
        )
        return last_frame(output)

    def stop(self, signalled: bool = True) -> int:
        """SIGTERM (unless not `signalled`: it ends by itself), wait (bounded); the exit
        code."""
        if signalled and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=TIMEOUT)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._reader.join(timeout=TIMEOUT)
            os.close(self.master)


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The url of a `convsync serve` (the console script) on port 0 and a SQLite file."""
    db = tmp_path_factory.mktemp("hub") / "hub.db"
    hub = Running("serve", "--db", str(db), "--port", "0")
    try:
        line = hub.wait_for("convsync hub at ")
        yield line.split(" at ", 1)[1].split()[0]
    finally:
        hub.stop()


def snapshot_file(tmp_path: Path, count: int) -> Path:
    messages = [Message.user(f"question {n}") for n in range(count)]
    path = tmp_path / f"{count}.json"
    path.write_bytes(ConversationSnapshot.new(messages, [False] * count).encode())
    return path


def test_tail_once_of_a_conversation_that_does_not_exist_fails(url: str) -> None:
    """`tail --once` of an id the hub has no log for says so on one line and exits 1,
    printing nothing on stdout."""
    done = convsync("tail", "nobody-yet", "--url", url, "--once")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        "convsync: error: the hub has no conversation 'nobody-yet' yet "
        "(without --once, tail waits for it)\n"
    )


def test_tail_once_of_an_emptied_conversation_shows_it_empty(url: str) -> None:
    """A conversation that exists but holds no entry is not "missing": `--once` prints it."""
    assert convsync("send", "emptied", "hello", "--url", url).returncode == 0
    ids = subprocess.run(  # take the one entry out through a replica (no command does)
        [sys.executable, "-c", EMPTY_IT, url],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=ROOT,
        timeout=TIMEOUT,
        check=False,
    )
    assert ids.returncode == 0, ids.stderr
    done = convsync("tail", "emptied", "--url", url, "--once")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["emptied · revision 2 · 0 entries", "(no entries)"]


EMPTY_IT = """
import asyncio, sys
from client import connect
async def main():
    async with connect(sys.argv[1], "emptied") as replica:
        replica.conversation.splice(slice(0, 1), [], None)
        await replica.flush()
asyncio.run(main())
"""


def test_tail_piped_waits_visibly_then_prints_lines(url: str) -> None:
    """`tail` on a pipe of a conversation not made yet prints a line saying it waits, then
    one plain line per new entry (no redraw, no escape codes); SIGTERM ends it with 0."""
    proc = Running("tail", "later-1", "--url", url)
    try:
        assert proc.wait_for("later-1 · revision").startswith("later-1 · revision 0 · 0 entries")
        waiting = proc.wait_for("waiting")
        assert waiting == "waiting for the first entry: the hub has no conversation 'later-1' yet\n"
        assert convsync("send", "later-1", "first!", "--url", url).returncode == 0
        assert proc.wait_for("#0") == "#0   user  first!\n"
        assert convsync("send", "later-1", "second", "--url", url).returncode == 0
        assert proc.wait_for("#1") == "#1   user  second\n"
    finally:
        code, err = proc.stop()
    assert code == 0, err
    assert not any("\x1b" in line for line in proc.seen)


def test_tail_on_a_terminal_waits_draws_what_fits_and_follows(url: str, tmp_path: Path) -> None:
    """On a terminal: a line saying it waits for the first entry; then the header and the
    latest entries that fit, the first line counting those above; a new entry is drawn; a
    resize redraws at the new size; SIGTERM leaves the alternate screen and exits 0."""
    view = OnTerminal("tail", "later-2", "--url", url, rows=12, columns=70)
    try:
        screen = view.frame_with("waiting for the first entry")
        assert screen[0] == "later-2 · revision 0 · 0 entries"
        done = convsync("import", str(snapshot_file(tmp_path, 300)), "later-2", "--url", url)
        assert done.returncode == 0, done.stderr
        screen = view.frame_with("#299")
        assert screen[0] == "later-2 · revision 1 · 300 entries"
        assert "\x1b[1mlater-2 · revision 1" in view.output  # styled: the header in bold
        assert screen[1] == "… 291 lines above"
        assert screen[2:11] == [f"#{n} user  question {n}" for n in range(291, 300)]
        assert screen[11].startswith("online: ")  # who is connected (this view too)
        assert len(screen) == 12

        assert convsync("send", "later-2", "and one more", "--url", url).returncode == 0
        screen = view.frame_with("#300")
        assert screen[1] == "… 292 lines above"
        assert screen[10] == "#300 user  and one more"

        view.resize(20, 100)
        view.proc.send_signal(signal.SIGWINCH)
        screen = view.frame_with("… 284 lines above")
        assert screen[-2] == "#300 user  and one more"
        assert len(screen) == 20
    finally:
        code = view.stop()
    assert code == 0
    after_last_frame = view.output.rsplit("\x1b[H", 1)[1]
    assert "\x1b[?1049l" in after_last_frame  # the terminal's own screen is back


def test_import_progress_is_a_bar_on_a_terminal_and_lines_on_a_pipe(
    url: str, tmp_path: Path
) -> None:
    """`import` draws rich's bar on a terminal (ending complete); `--progress` to a pipe
    prints plain lines, the last at 100%, and no carriage returns."""
    source = snapshot_file(tmp_path, 1300)
    view = OnTerminal("import", str(source), "bar-1", "--url", url, rows=10, columns=100)
    code = view.stop(signalled=False)
    assert code == 0
    drawn = plain(view.output)
    assert "imported 1300 messages" in drawn
    assert "1300/1300" in drawn and "100%" in drawn and "━" in drawn

    done = convsync("import", str(source), "bar-2", "--url", url, "--progress")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert "\r" not in done.stderr
    progress = [line for line in lines if line.startswith("import ")]
    assert progress, lines
    assert all(re.fullmatch(r"import +\d+% \d+/1300 messages [\d,]+/s", line) for line in progress)
    assert progress[-1].startswith("import 100% 1300/1300 messages")
    assert lines[-1].startswith("imported 1300 messages")


@pytest.mark.parametrize("seed", range(4))
def test_lines_read_only_the_part_of_a_long_text_they_show(seed: int) -> None:
    """`one_line` and a draft's line read only the head (or the end) of a long text, and
    give what flattening the whole text gives, however the whitespace falls."""
    rng = random.Random(seed)
    space = re.compile(r"\s+")
    for _ in range(300):
        pieces = [rng.choice(["word", "x", " ", "\n\n", " " * rng.randrange(1, 900)])]
        pieces += [rng.choice(["ab", " ", "\t", "long" * 30, " " * 400]) for _ in range(40)]
        text = "".join(pieces[: rng.randrange(1, len(pieces) + 1)])
        limit = rng.choice([5, 20, 60, 120])
        flat = space.sub(" ", text).strip()
        assert client.tail.one_line(text, limit) == (
            flat if len(flat) <= limit else flat[: limit - 1] + "…"
        )
        flat = space.sub(" ", text)
        assert client.tail._tail_of(text, limit) == (
            flat if len(flat) <= limit else "…" + flat[-(limit - 1) :]
        )


def test_a_refusal_is_not_announced_as_reconnecting() -> None:
    """The replica stops for good when the hub refuses it: the status line says so."""
    assert client.tail._status(Disconnected("refused: forbidden: no write")) == (
        "-- disconnected (refused: forbidden: no write); not reconnecting"
    )
    assert client.tail._status(Disconnected("keepalive timed out")) == (
        "-- disconnected (keepalive timed out); reconnecting"
    )


def test_tail_strips_control_characters_from_model_and_tool_text(url: str) -> None:
    """Text holding terminal escapes (ESC and C1 sequences: clear screen, colours, window
    title, bell) reaches `tail`'s output without a control character; the rest is kept."""
    hostile = "a\x1b[2J\x1b]0;owned\x07b\x9b31mc\x7fd\x01e"
    assert convsync("send", "hostile-1", hostile, "--url", url).returncode == 0
    done = convsync("tail", "hostile-1", "--url", url, "--once")
    assert done.returncode == 0, done.stderr
    controls = [
        ch for ch in done.stdout if (ord(ch) < 0x20 and ch != "\n") or 0x7F <= ord(ch) < 0xA0
    ]
    assert controls == []
    assert "#0   user  a[2J]0;ownedb31mcde" in done.stdout


def test_the_live_view_strips_control_characters() -> None:
    """The terminal view draws no control character of an entry, a draft or a status."""
    conversation = Conversation()
    conversation.push(Message.user("x\x1b[31my\x9bz"))
    replica = SimpleNamespace(
        conversation=conversation,
        conversation_id="c",
        drafts={},
        presence={},
        revision=conversation.revision,
        lineage=conversation.lineage,
        connected=True,
    )
    stand_in: Any = replica
    view = client.tail.screen(Bottom(conversation), stand_in, 10, 80, "live\x1b]0;t\x07")
    text = view.plain
    assert "\x1b" not in text and "\x9b" not in text and "\x07" not in text
    assert "x[31myz" in text
