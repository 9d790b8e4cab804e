"""The `convsync` command line: serve, send, export, import, tail and the demo."""

from __future__ import annotations

import importlib.metadata
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from cliproc import ROOT, SCALE, TIMEOUT, Running, cli_env, convsync, run
from test_transfer import a_turn, an_authored_conversation

from client import connect
from client.http import _get
from client.tail import Watcher, render
from client.transfer import batches
from sync import (
    Aside,
    Assistant,
    Author,
    Conversation,
    Entry,
    Message,
    Stop,
    ToolCall,
    TurnEnd,
    decode_state,
    encode,
)
from sync.frames import MAX_FRAME
from sync.snapshot import ConversationSnapshot

# ---------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The url of a `convsync serve` process on port 0 and a SQLite file, shared by the
    tests of this module (each uses its own conversations)."""
    db = tmp_path_factory.mktemp("hub") / "hub.db"
    proc = Running("serve", "--db", str(db), "--port", "0")
    try:
        yield proc.url()
    finally:
        proc.stop()


def exported(capsys: pytest.CaptureFixture[str], url: str, id_: str, tmp_path: Path) -> bytes:
    out = tmp_path / f"{id_}.export.json"
    code, _, err = run(capsys, "export", id_, "--url", url, "--format", "state", "-o", str(out))
    assert code == 0, err
    return out.read_bytes()


def a_conversation() -> Conversation:
    """Two turns with tool calls, a splice (a retired id), a note, turn records, a halt."""
    conversation = Conversation()
    conversation.extend(a_turn(0))
    conversation.push(Message.user("scratch"))
    conversation.splice(slice(4, 5), [], Author.user())
    conversation.push(Message.user("question 1"))
    conversation.open_turn()
    conversation.push(Assistant([ToolCall("c1", "lookup", {})], stop=Stop("tool_use")))
    conversation.push(Message.tool_result("c1", "lookup", "line one\nline two"))
    answer = conversation.push(Message.assistant("answer 1"))
    conversation.end_turn(TurnEnd.answered(answer))
    conversation.add_aside(Aside.note("todo", "look again", answer))
    conversation.push(Message.user("one more thing"))
    assert conversation.halt("kept")
    return conversation.view()


# ---------------------------------------------------------------------- arguments


@pytest.mark.parametrize("command", ["serve", "tail", "send", "export", "import", "demo"])
def test_every_command_has_help(capsys: pytest.CaptureFixture[str], command: str) -> None:
    """`convsync COMMAND --help` prints that command's usage and exits 0."""
    code, out, _ = run(capsys, command, "--help")
    assert code == 0
    assert out.startswith(f"usage: convsync {command}")


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frob"],
        ["send", "c1"],
        ["send", "c1", ""],
        ["send", "c1", " \n\t"],
        ["send", "bad id!", "hi"],
        ["send", "c1", "hi", "--url", "http://127.0.0.1:1"],
        ["send", "c1", "hi", "--timeout", "-1"],
        ["serve", "--port", "70000"],
        ["export", "c1", "--format", "csv"],
        ["demo", "--turns", "0"],
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """A bad command line exits 2 with one line on stderr, no usage dump, no traceback."""
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert len(err.splitlines()) == 1
    assert ": error: " in err


def test_unreachable_hub_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A hub that is not there gives exit 1 and one line, without waiting out the timeout."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    code, _, err = run(capsys, "send", "c1", "hi", "--url", f"ws://127.0.0.1:{port}")
    assert code == 1
    assert "cannot reach the hub" in err
    assert len(err.splitlines()) == 1
    assert time.monotonic() - started < 5 * SCALE


@pytest.mark.parametrize("command", [["tail", "c1", "--once"], ["send", "c1", "hi"]])
def test_unreachable_hub_is_named_as_typed(
    capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """The error names the URL the user typed, not the health check's address behind it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code, _, err = run(capsys, *command, "--url", f"ws://127.0.0.1:{port}")
    assert code == 1
    assert f"cannot reach the hub at ws://127.0.0.1:{port}:" in err
    assert "healthz" not in err and "http://" not in err


# ---------------------------------------------------------------------- rendering


def test_render_draws_one_line_per_entry_and_aside() -> None:
    """`render` draws one flat line per entry, asides after their entry, the halt last."""
    lines = render(a_conversation())
    assert lines[0] == "#0   user  question 0"
    assert 'call lookup({"n":0}) [call_0]' in lines[1]
    assert "(stop tool_use)" in lines[1]
    assert any("result lookup [c1]: line one line two" in line for line in lines)
    assert any("turn 0 from #4: answered by #7" in line for line in lines)
    assert any("note “todo”: look again" in line for line in lines)
    assert lines[-1].endswith("! halted: kept")
    assert len(lines) == 9 + 2 + 1  # 9 entries, a turn record and a note, the halt


def test_watcher_describes_only_what_changed() -> None:
    """A `Watcher` reports new entries, changed asides and a rewritten tail, nothing twice."""
    conversation = Conversation()
    watcher = Watcher()
    conversation.push(Message.user("hi"))
    assert watcher.changes(conversation) == ["#0   user  hi"]
    assert watcher.changes(conversation) == []
    conversation.open_turn()
    answer = conversation.push(Message.assistant("hello"))
    conversation.end_turn(TurnEnd.answered(answer))
    assert watcher.changes(conversation) == [
        "#1   assistant  hello",
        "     + turn 0 from #0: answered by #1",
    ]
    conversation.splice(slice(1, 2), [Message.assistant("hey")], None)
    changed = watcher.changes(conversation)
    assert changed[0] == "~ from #1 on rewritten (1 out, 1 in)"
    assert changed[1] == "#1   assistant  hey"


def test_batches_fit_the_count_and_the_size() -> None:
    """Import batches hold at most the count and the byte budget (a lone big entry alone)."""
    entries = [Entry(Message.user("x" * 100)) for _ in range(10)]
    entries.insert(3, Entry(Message.user("y" * 5000)))
    size = len(encode(entries[0])) + 1
    runs = batches(entries, budget=3 * size, count=2)
    assert [len(run) for run in runs] == [2, 1, 1, 2, 2, 2, 1]
    assert [entry for run in runs for entry in run] == entries


# ---------------------------------------------------------------------- against a hub


def test_send_then_export_round_trips_a_message(
    capsys: pytest.CaptureFixture[str], url: str, tmp_path: Path
) -> None:
    """`send` prints the revision the message landed at; `export` gives it back."""
    code, out, err = run(capsys, "send", "room-1", "hello\nworld", "--url", url)
    assert (code, out, err) == (0, "1\n", "")
    code, out, _ = run(capsys, "send", "room-1", "again", "--url", url, "--client", "me")
    assert (code, out) == (0, "2\n")
    code, out, _ = run(capsys, "export", "room-1", "--url", url)
    assert code == 0
    assert decode_state(out).messages() == [Message.user("hello\nworld"), Message.user("again")]
    code, out, _ = run(capsys, "export", "room-1", "--url", url, "--format", "snapshot")
    assert code == 0
    snapshot = ConversationSnapshot.decode(out)
    assert snapshot.messages == [Message.user("hello\nworld"), Message.user("again")]
    assert snapshot.pinned == [False, False]


def test_export_of_a_missing_conversation_fails(
    capsys: pytest.CaptureFixture[str], url: str
) -> None:
    """Exporting a conversation the hub has no log for is an error, not an empty file."""
    code, out, err = run(capsys, "export", "nobody-here", "--url", url)
    assert (code, out) == (1, "")
    assert "no conversation 'nobody-here'" in err


def test_import_snapshot_then_export_gives_the_same_snapshot(
    capsys: pytest.CaptureFixture[str], url: str, tmp_path: Path
) -> None:
    """A snapshot imported into a new conversation exports as the same messages and pins."""
    messages = a_turn(0) + a_turn(1)
    snapshot = ConversationSnapshot.new(messages, [i == 1 for i in range(len(messages))])
    source = tmp_path / "in.json"
    source.write_bytes(snapshot.encode())
    code, _, err = run(capsys, "import", str(source), "imported-1", "--url", url)
    assert code == 0, err
    assert "imported 8 messages" in err
    code, out, _ = run(capsys, "export", "imported-1", "--url", url, "--format", "snapshot")
    assert code == 0
    assert ConversationSnapshot.decode(out) == snapshot


def test_import_state_keeps_ids_asides_halt_and_retired_ids(
    capsys: pytest.CaptureFixture[str], url: str, tmp_path: Path
) -> None:
    """An imported state file exports byte for byte: ids, authors, asides, halt, retired."""
    data = encode(a_conversation())
    source = tmp_path / "state.json"
    source.write_bytes(data)
    code, _, err = run(capsys, "import", str(source), "imported-2", "--url", url)
    assert code == 0, err
    assert exported(capsys, url, "imported-2", tmp_path).strip() == data
    assert decode_state(data).state().retired  # the case is meaningful


def test_import_of_a_large_file_goes_in_batches_with_progress(
    capsys: pytest.CaptureFixture[str], url: str, tmp_path: Path
) -> None:
    """A large file goes in several push records and shows a progress bar reaching 100%."""
    messages = [m for n in range(325) for m in a_turn(n)]  # 1300 messages
    source = tmp_path / "big.json"
    source.write_bytes(ConversationSnapshot.new(messages, [False] * len(messages)).encode())
    code, _, err = run(capsys, "import", str(source), "big-1", "--url", url, "--progress")
    assert code == 0, err
    assert "100% 1300/1300 messages" in err
    state = decode_state(exported(capsys, url, "big-1", tmp_path))
    assert state.messages() == messages
    code, out, _ = run(capsys, "tail", "big-1", "--url", url, "--once")
    assert out.splitlines()[0] == "big-1 · revision 3 · 1300 entries"  # 500 + 500 + 300


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"version": 2, "messages": [], "pinned": []}', "version 2 is not supported"),
        (b'{"version": 1, "messages": [], "pinned": [true]}', "0 messages but 1 pin flags"),
        (b'{"version": 1, "messages": [{"role": "robot"}], "pinned": [false]}', "robot"),
        (b'{"entries": [{"message": 3}]}', "$.entries[0].message"),
        (
            ConversationSnapshot.new([Message.tool_result("x", "t", "r")], [False]).encode(),
            "answers no waiting call",
        ),
    ],
)
def test_bad_import_file_exits_2_and_changes_nothing(
    capsys: pytest.CaptureFixture[str], url: str, tmp_path: Path, content: bytes, says: str
) -> None:
    """A malformed or unpairable file exits 2 with one line and changes no conversation."""
    kept, fresh = f"kept-{uuid.uuid4().hex[:8]}", f"fresh-{uuid.uuid4().hex[:8]}"
    assert run(capsys, "send", kept, "before", "--url", url)[0] == 0
    before = exported(capsys, url, kept, tmp_path)
    source = tmp_path / "bad.json"
    source.write_bytes(content)
    for target in (kept, fresh):
        code, out, err = run(capsys, "import", str(source), target, "--url", url, "--replace")
        assert (code, out) == (2, "")
        assert says in err
        assert len(err.splitlines()) == 1
    assert exported(capsys, url, kept, tmp_path) == before
    assert run(capsys, "export", fresh, "--url", url)[0] == 1


def test_import_refuses_a_conversation_that_is_not_empty_unless_replace(
    capsys: pytest.CaptureFixture[str], url: str, tmp_path: Path
) -> None:
    """Importing over existing entries is refused; with `--replace` one reset replaces them."""
    assert run(capsys, "send", "busy", "already here", "--url", url)[0] == 0
    source = tmp_path / "in.json"
    source.write_bytes(ConversationSnapshot.new(a_turn(0), [False] * 4).encode())
    code, _, err = run(capsys, "import", str(source), "busy", "--url", url)
    assert code == 2
    assert "not empty" in err and "--replace" in err
    code, _, err = run(capsys, "import", str(source), "busy", "--url", url, "--replace")
    assert code == 0, err
    assert decode_state(exported(capsys, url, "busy", tmp_path)).messages() == a_turn(0)


def test_import_refuses_a_message_over_the_frame_limit(
    capsys: pytest.CaptureFixture[str], url: str, tmp_path: Path
) -> None:
    """A message no frame can carry is refused before anything is sent."""
    messages = [Message.user("small"), Message.user("x" * MAX_FRAME)]  # the default limit
    source = tmp_path / "huge.json"
    source.write_bytes(ConversationSnapshot.new(messages, [False, False]).encode())
    code, _, err = run(capsys, "import", str(source), "huge", "--url", url)
    assert code == 2
    assert "message 1" in err and "frame limit" in err
    assert run(capsys, "export", "huge", "--url", url)[0] == 1


# ---------------------------------------------------------------------- the console script


def test_version_prints_the_installed_version() -> None:
    """`convsync --version` prints the installed package's version and exits 0."""
    result = convsync("--version")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"convsync {importlib.metadata.version('convsync')}\n"


def test_send_dash_reads_stdin_and_an_empty_message_is_refused(url: str) -> None:
    """`send ID -` pushes what stdin holds (less its final line break); an empty or blank
    message, given or piped, or stdin that is not UTF-8, exits 2 with one line and pushes
    nothing."""
    result = convsync("send", "piped", "-", "--url", url, stdin=b"first line\nsecond line\n")
    assert (result.returncode, result.stdout, result.stderr) == (0, "1\n", "")
    for text, stdin in [("-", b""), ("-", b" \n\n"), ("", b"ignored"), ("  ", b"")]:
        refused = convsync("send", "piped", text, "--url", url, stdin=stdin)
        assert (refused.returncode, refused.stdout) == (2, "")
        assert refused.stderr.startswith("convsync: error: the message")
        assert "is empty or only whitespace" in refused.stderr
        assert len(refused.stderr.splitlines()) == 1
    garbled = convsync("send", "piped", "-", "--url", url, stdin=b"caf\xe9\n")
    assert garbled.returncode == 2
    assert (
        garbled.stderr
        == "convsync: error: stdin is not UTF-8 text: invalid continuation byte at byte 3\n"
    )
    exported = convsync("export", "piped", "--url", url)
    assert decode_state(exported.stdout).messages() == [Message.user("first line\nsecond line")]


def test_default_export_then_import_gives_an_equal_state(url: str, tmp_path: Path) -> None:
    """`export ID -o FILE` without a format, then `import FILE NEW`, gives NEW a state equal
    to ID's (entry ids, authors, source ids, turn records, notes, pins, halt, retired ids),
    and the export reports no loss."""
    source = an_authored_conversation()
    seed = tmp_path / "seed.json"
    seed.write_bytes(encode(source))
    assert convsync("import", str(seed), "trip-a", "--url", url).returncode == 0
    saved = tmp_path / "trip.json"
    result = convsync("export", "trip-a", "--url", url, "-o", str(saved))
    assert result.returncode == 0, result.stderr
    [said] = result.stderr.splitlines()  # no word of a loss
    assert said.startswith(f"exported {len(source)} messages of trip-a at revision ")
    assert said.endswith(f" to {saved} (state)")
    result = convsync("import", str(saved), "trip-b", "--url", url)
    assert result.returncode == 0, result.stderr
    copy = decode_state(convsync("export", "trip-b", "--url", url).stdout)
    assert copy == source
    assert copy.state() == source.state()  # ids, authors, asides, halt, retired


def test_snapshot_export_says_what_it_left_out(url: str, tmp_path: Path) -> None:
    """`export --format snapshot` writes snapshot v1 and one line on stderr naming what it
    left out; `export --help` says the default keeps everything and what a snapshot drops."""
    source = an_authored_conversation()
    seed = tmp_path / "seed.json"
    seed.write_bytes(encode(source))
    assert convsync("import", str(seed), "lossy", "--url", url).returncode == 0
    result = convsync("export", "lossy", "--url", url, "--format", "snapshot")
    assert result.returncode == 0
    assert ConversationSnapshot.decode(result.stdout) == ConversationSnapshot.from_conversation(
        source
    )
    assert result.stderr == (
        "convsync: snapshot v1 left out entry ids, the authors of 2 entries, the source ids "
        "of 1 entry, 1 turn record, 1 note, the halt (kept) and 1 retired id (the default "
        "format, state, keeps them)\n"
    )
    shown = " ".join(convsync("export", "--help").stdout.split())
    assert "The default format, state, keeps everything the log holds" in shown
    assert "messages and pins only; it leaves out ids, authors, turn records, notes" in shown


@pytest.mark.parametrize(
    ("content", "argv", "says"),
    [
        (
            b'{"messages": [{"role": "user", "content": "hi"}]}',
            [],
            "found keys 'messages' (a snapshot v1 also needs version 1",
        ),
        (b"{}", [], "found an empty object; expected a state (entries, asides, halt, retired),"),
        (b'{"foo": 1}', [], "found keys 'foo'; expected a state"),
        (
            ConversationSnapshot.new(a_turn(0), [False] * 4).encode(),
            ["--format", "state"],
            "expected a state (entries, asides, halt, retired), found a snapshot v1 (version, "
            "messages, pinned) (--format auto reads either)",
        ),
    ],
)
def test_import_refuses_a_file_it_does_not_understand(
    url: str, tmp_path: Path, content: bytes, argv: list[str], says: str
) -> None:
    """A file of no known shape, or of another format than `--format` names, exits 2 with one
    line saying what was found and what was expected, and imports nothing."""
    target = f"never-{uuid.uuid4().hex[:8]}"
    source = tmp_path / "odd.json"
    source.write_bytes(content)
    result = convsync("import", str(source), target, "--url", url, *argv)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(f"convsync: error: {source}: ")
    assert says in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert convsync("export", target, "--url", url).returncode == 1  # no such conversation


def test_tail_once_prints_the_entries(
    capsys: pytest.CaptureFixture[str], url: str, tmp_path: Path
) -> None:
    """`tail --once` prints a header and one line per entry and aside, then exits."""
    source = tmp_path / "state.json"
    source.write_bytes(encode(a_conversation()))
    assert run(capsys, "import", str(source), "watched", "--url", url)[0] == 0
    code, out, _ = run(capsys, "tail", "watched", "--url", url, "--once")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("watched · revision ")
    assert lines[1:] == render(decode_state(encode(a_conversation())))


def test_tail_follows_changes_and_stops_on_sigterm(
    capsys: pytest.CaptureFixture[str], url: str
) -> None:
    """`tail` off a terminal prints a line per new entry; SIGTERM ends it with exit 0."""
    assert run(capsys, "send", "live", "first", "--url", url)[0] == 0
    proc = Running("tail", "live", "--url", url)
    try:
        proc.wait_for("#0   user  first")
        assert run(capsys, "send", "live", "second", "--url", url)[0] == 0
        proc.wait_for("#1   user  second")
    finally:
        code, err = proc.stop()
    assert code == 0, err


async def test_serve_stops_cleanly_on_sigterm_and_keeps_the_log(tmp_path: Path) -> None:
    """SIGTERM stops `serve` promptly with exit 0; acknowledged records survive a restart."""
    db = str(tmp_path / "durable.db")
    proc = Running("serve", "--db", db, "--port", "0")
    try:
        url = await anyio.to_thread.run_sync(proc.url)
        async with connect(url, "durable", client="t", backoff=5.0) as replica:
            replica.conversation.push(Message.user("keep me"))
            with anyio.fail_after(TIMEOUT):
                await replica.flush()
            started = time.monotonic()
            code, err = await anyio.to_thread.run_sync(proc.stop)
            assert code == 0, err
            assert time.monotonic() - started < 5 * SCALE
    finally:
        proc.stop()
    proc = Running("serve", "--db", db, "--port", "0")
    try:
        url = await anyio.to_thread.run_sync(proc.url)
        async with connect(url, "durable") as replica:
            assert replica.conversation.messages() == [Message.user("keep me")]
    finally:
        code, err = await anyio.to_thread.run_sync(proc.stop)
    assert code == 0, err


def test_serve_on_a_taken_port_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """`serve` on a port already bound exits 1 with one line."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        code, _, err = run(capsys, "serve", "--db", ":memory:", "--port", str(port))
    assert code == 1
    assert "cannot serve on 127.0.0.1" in err
    assert len(err.splitlines()) == 1


def test_second_serve_on_one_sqlite_file_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A second `serve` on a SQLite file a running hub holds exits 1 with one line naming the
    file and the holder; the first hub keeps serving."""
    db = str(tmp_path / "shared.db")
    first = Running("serve", "--db", db, "--port", "0")
    try:
        url = first.url()
        second = subprocess.run(
            [sys.executable, "-m", "client.cli", "serve", "--db", db, "--port", "0"],
            capture_output=True,
            text=True,
            env=cli_env(),
            cwd=ROOT,
            timeout=TIMEOUT,
        )
        assert (second.returncode, second.stdout) == (1, "")
        assert len(second.stderr.splitlines()) == 1, second.stderr
        assert second.stderr.startswith("convsync: error: locked: ")
        assert repr(db) in second.stderr
        assert f"{first.proc.pid}@{socket.gethostname()}" in second.stderr
        assert run(capsys, "send", "still-here", "hi", "--url", url)[:2] == (0, "1\n")
    finally:
        code, err = first.stop()
    assert code == 0, err


# ---------------------------------------------------------------------- the demo


def test_demo_mirrors_the_worker_and_checks_the_hub(tmp_path: Path) -> None:
    """`demo --fast` shows the UI mirroring the worker live and exits 0 with both checks."""
    result = subprocess.run(
        [sys.executable, "-m", "client.cli", "demo", "--fast", "--db", str(tmp_path / "d.db")],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=ROOT,
        timeout=3 * TIMEOUT,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "check: worker == hub: True" in lines
    assert "check: ui == hub: True" in lines
    ui = [line for line in lines if line.startswith("ui   |")]
    assert any("call weather(" in line for line in ui)
    # The worker asks before its weather tool; the UI approves it (SPEC 12).
    assert "ui   | user approves call_0_weather" in lines
    assert "agent| weather approved by anonymous: looks safe" in lines
    assert any("user types mid-turn" in line for line in ui)
    assert any("(Noted: Also: keep the answers short" in line for line in ui)
    assert any(line.startswith("agent|") for line in lines)
    assert result.stderr == ""
    # Answers stream as drafts; the UI stops the last one midway.
    assert any(line.startswith("ui   | … assistant is typing: It") for line in ui)
    assert "ui   | draft ended: stopped" in lines
    assert any(line.startswith("agent| stopped by the ui after") for line in lines)


def test_demo_serve_keeps_the_hub_up_and_prints_the_viewers_address(tmp_path: Path) -> None:
    """`demo --serve` prints the viewer's address of its conversation, runs the demo, then
    keeps serving it (the page and the conversation's log answer) until SIGTERM: exit 0."""
    demo = Running("demo", "--fast", "--serve", "--port", "0", "--db", str(tmp_path / "d.db"))
    try:
        line = demo.wait_for("in a browser")
        address = line.split("open ", 1)[1].split(" in a browser")[0]
        assert address.startswith("http://127.0.0.1:") and "/c/demo-" in address
        demo.wait_for("check: ui == hub: True", within=3 * TIMEOUT)
        demo.wait_for("still serving")
        base, conversation_id = address.split("/c/")
        status, page = _get(address, TIMEOUT)
        assert status == 200 and b"<html" in page.lower()
        status, _ = _get(f"{base}/v1/conversations/{conversation_id}", TIMEOUT)
        assert status == 200
    finally:
        code, err = demo.stop()
    assert code == 0, err


def test_token_protected_serve_with_send_tail_export_and_import(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`serve --auth-secret-file`: `send`/`export`/`import`/`tail` work with a token from
    `convsync token` and are refused with one line without one or with a read-only one."""
    secret = tmp_path / "hub.secret"
    secret.write_text("a-secret-of-at-least-thirty-two-bytes\n")
    code, writer, err = run(
        capsys, "token", "--secret-file", str(secret), "--sub", "w", "--scope", "write"
    )
    assert code == 0, err
    writer = writer.strip()
    code, reader, _ = run(
        capsys, "token", "--secret-file", str(secret), "--sub", "r", "--conv", "auth-*"
    )
    reader = reader.strip()
    proc = Running("serve", "--db", ":memory:", "--port", "0", "--auth-secret-file", str(secret))
    try:
        url = proc.url()
        code, out, err = run(capsys, "send", "auth-1", "hi", "--url", url, "--token", writer)
        assert (code, out.strip()) == (0, "1"), err
        code, _, err = run(capsys, "send", "auth-1", "no", "--url", url)
        assert code == 1
        assert "the hub refused: unauthorized" in err
        code, _, err = run(capsys, "send", "auth-1", "no", "--url", url, "--token", reader)
        assert code == 1 and "forbidden" in err
        code, out, err = run(capsys, "tail", "auth-1", "--once", "--url", url, "--token", reader)
        assert code == 0 and "hi" in out, err
        code, _, err = run(capsys, "export", "auth-1", "--url", url)
        assert code == 1 and "401" in err
        target = tmp_path / "auth.json"
        code, _, err = run(
            capsys, "export", "auth-1", "--url", url, "--token", reader, "-o", str(target)
        )
        assert code == 0, err
        code, _, err = run(capsys, "import", str(target), "auth-2", "--url", url, "--token", writer)
        assert code == 0, err
        code, out, err = run(capsys, "tail", "auth-2", "--once", "--url", url, "--token", reader)
        assert code == 0 and "hi" in out, err
    finally:
        proc.stop()


def test_serve_refuses_a_public_bind_without_a_key_and_token_needs_a_secret(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`serve --host 0.0.0.0` without a key exits 2 naming `--insecure`; `token` without a
    secret exits 2."""
    monkeypatch.delenv("CONVSYNC_AUTH_SECRET", raising=False)
    code, _, err = run(capsys, "serve", "--host", "0.0.0.0", "--port", "0", "--db", ":memory:")
    assert code == 2 and "--insecure" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "token", "--sub", "x")
    assert code == 2 and "CONVSYNC_AUTH_SECRET" in err


def test_cli_over_wss_with_a_private_ca(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`serve --tls-cert/--tls-key` serves wss://; `send`, `export` and `tail` reach it with
    `--ca-file`, and without it fail with one line."""
    from certs import self_signed

    cert, key = self_signed(tmp_path)
    secret = tmp_path / "hub.secret"
    secret.write_text("a-secret-of-at-least-thirty-two-bytes\n")
    _, minted, _ = run(
        capsys, "token", "--secret-file", str(secret), "--sub", "w", "--scope", "write"
    )
    token = minted.strip()
    proc = Running(
        "serve", "--db", ":memory:", "--port", "0", "--auth-secret-file", str(secret),
        "--tls-cert", cert, "--tls-key", key,
    )  # fmt: skip
    try:
        url = proc.url()
        assert url.startswith("wss://127.0.0.1:")
        tls = ["--url", url, "--token", token, "--ca-file", cert]
        code, out, err = run(capsys, "send", "tls-1", "over tls", *tls)
        assert (code, out.strip()) == (0, "1"), err
        code, out, err = run(capsys, "export", "tls-1", *tls)
        assert code == 0 and "over tls" in out, err
        code, out, err = run(capsys, "tail", "tls-1", "--once", *tls)
        assert code == 0 and "over tls" in out, err
        code, _, err = run(capsys, "send", "tls-1", "no", "--url", url, "--token", token)
        assert code == 1 and len(err.strip().splitlines()) == 1
    finally:
        proc.stop()
