"""Import, export and the hub's HTTP read as library functions (`client.http`,
`client.transfer`), called from Python against a real hub on loopback; and the layering of
`client` (nothing but the command imports the command)."""

from __future__ import annotations

import ast
import http.server
import io
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import anyio
import pytest
import sourcetree
from conftest import bound

from client import (
    HubError,
    ImportRefused,
    TransferError,
    connect,
    export_conversation,
    fetch_conversation,
    import_conversation,
)
from client.http import HubView
from client.transfer import encode_conversation, read_conversation, snapshot_leaves_out
from server import Hub
from sync import (
    Aside,
    Assistant,
    Author,
    Conversation,
    Entry,
    Message,
    Stop,
    Text,
    ToolCall,
    TurnEnd,
    decode_state,
    encode,
)
from sync.snapshot import ConversationSnapshot

ROOT = Path(__file__).resolve().parents[2]


def a_turn(n: int) -> list[Message]:
    call = ToolCall(f"call_{n}", "lookup", {"n": n})
    return [
        Message.user(f"question {n}"),
        Assistant([Text("checking"), call], stop=Stop("tool_use")),
        Message.tool_result(call.id, "lookup", f"result {n}"),
        Message.assistant(f"answer {n}"),
    ]


def a_conversation() -> Conversation:
    """Two turns, a splice (so a retired id) and a note."""
    conversation = Conversation()
    conversation.extend(a_turn(0))
    conversation.push(Message.user("scratch"))
    conversation.splice(slice(4, 5), [], Author.user())
    answers = conversation.extend(a_turn(1))
    conversation.add_aside(Aside.note("todo", "look again", answers[-1]))
    return conversation.view()


def an_authored_conversation() -> Conversation:
    """Entries by several authors, with a source id, a turn record, a note, pins, a halt and a
    retired id: everything a state holds and a snapshot does not."""
    conversation = Conversation()
    conversation.extend(a_turn(0))
    conversation.push(Message.user("scratch"))
    conversation.splice(slice(4, 5), [], Author.user())
    conversation.push(Entry(Message.user("from the planner"), author=Author.agent("planner")))
    conversation.push(Entry(Message.user("imported"), author=Author.plugin("mail"), source_id="m1"))
    conversation.open_turn()
    answer = conversation.push(Message.assistant("done"))
    conversation.end_turn(TurnEnd.answered(answer))
    conversation.add_aside(Aside.note("todo", "look again", answer))
    conversation.add_aside(Aside("pins", None, Author.user(), [answer]))
    conversation.push(Message.user("one more thing"))
    assert conversation.halt("kept")
    return conversation.view()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# ---------------------------------------------------------------------- layering


def _imported_modules(path: Path) -> set[str]:
    """The modules a file of `client` imports, relative imports made absolute."""
    names: set[str] = set()
    for node in ast.walk(sourcetree.parse(path)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "client." * (node.level > 0) + (node.module or "")
            base = base.rstrip(".")
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_nothing_in_client_imports_the_command() -> None:
    """No module of `client` but `cli` imports `client.cli`: the command sits on top."""
    modules = sorted((ROOT / "client").glob("*.py"))
    assert len(modules) > 5
    offenders = [
        path.name
        for path in modules
        if path.stem != "cli" and "client.cli" in _imported_modules(path)
    ]
    assert offenders == []


# ---------------------------------------------------------------------- reading a hub


async def test_fetch_conversation_gives_the_hubs_copy(hub: Hub) -> None:
    """`fetch_conversation` returns the lineage, revision and value the replicas agree on."""
    async with connect(hub.url, "fetched", client="w") as replica:
        replica.conversation.extend(a_turn(0))
        with anyio.fail_after(bound(10)):
            await replica.flush()
        fetched = await fetch_conversation(hub.url, "fetched")
        assert fetched.revision == replica.session.confirmed.revision == 1
        assert fetched.lineage == replica.session.confirmed.lineage
        assert fetched.conversation == replica.conversation
        lineage, revision, conversation = fetched  # a plain tuple too
        assert (lineage, revision, conversation.messages()) == (
            fetched.lineage,
            1,
            a_turn(0),
        )


async def test_fetch_of_a_missing_conversation_is_no_conversation(hub: Hub) -> None:
    """A conversation the hub has no log for is `HubError` reason `no_conversation`."""
    with pytest.raises(HubError) as missing:
        await fetch_conversation(hub.url, "nobody-here")
    assert missing.value.reason == "no_conversation"
    assert "'nobody-here'" in missing.value.message


async def test_fetch_from_nothing_listening_is_unreachable() -> None:
    """A refused connection is `HubError` reason `unreachable`, at once."""
    with anyio.fail_after(bound(5)):
        with pytest.raises(HubError) as refused:
            await fetch_conversation(f"ws://127.0.0.1:{free_port()}", "c1")
    assert refused.value.reason == "unreachable"
    assert "cannot reach the hub" in refused.value.message


@pytest.fixture
def impostor() -> Iterator[str]:
    """A ws:// url whose HTTP server answers 200 "not json" to everything but /teapot paths."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status = 418 if "teapot" in self.path else 200
            body = b"not json" if status == 200 else b"short and stout"
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        yield f"ws://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=bound(10))


async def test_fetch_of_a_bad_answer_is_a_clear_error(impostor: str) -> None:
    """A body that is not a conversation is `bad_answer`; another status is `bad_status`."""
    with pytest.raises(HubError) as bad:
        await fetch_conversation(impostor, "c1")
    assert bad.value.reason == "bad_answer"
    assert "not a conversation" in bad.value.message
    with pytest.raises(HubError) as teapot:
        await fetch_conversation(impostor, "teapot")
    assert teapot.value.reason == "bad_status"
    assert "418" in teapot.value.message


# ---------------------------------------------------------------------- export


async def test_export_gives_the_whole_state_or_a_snapshot(hub: Hub) -> None:
    """`export_conversation` encodes the hub's copy as its state by default (nothing left
    out) or, asked for by name, as snapshot v1, saying what that left out."""
    source = a_conversation()
    await import_conversation(hub.url, encode(source), "exported")
    state = await export_conversation(hub.url, "exported")
    assert state.data == encode(source)
    assert state.messages == len(source)
    assert state.left_out == ()
    snapshot = await export_conversation(hub.url, "exported", format="snapshot")
    assert ConversationSnapshot.decode(snapshot.data).messages == source.messages()
    assert snapshot.left_out == ("entry ids", "1 note", "1 retired id")
    fetched = await fetch_conversation(hub.url, "exported")
    assert (state.lineage, state.revision) == (fetched.lineage, fetched.revision)
    with pytest.raises(HubError) as missing:
        await export_conversation(hub.url, "not-there")
    assert missing.value.reason == "no_conversation"


# ---------------------------------------------------------------------- import


async def test_import_of_bytes_goes_in_batches_and_reports_progress(hub: Hub) -> None:
    """A large import calls `progress(done, total)` before the first batch and after each."""
    messages = [m for n in range(300) for m in a_turn(n)]  # 1200 messages
    data = ConversationSnapshot.new(messages, [False] * len(messages)).encode()
    calls: list[tuple[int, int]] = []
    imported = await import_conversation(
        hub.url, data, "big", progress=lambda done, total: calls.append((done, total))
    )
    assert calls == [(0, 1200), (500, 1200), (1000, 1200), (1200, 1200)]
    assert imported == (1200, 0, 3, False)
    fetched = await fetch_conversation(hub.url, "big")
    assert fetched.conversation.messages() == messages


async def test_import_batches_are_filled_to_the_fill_size_not_the_frame_limit(hub: Hub) -> None:
    """Batches hold about `FRAME_FILL` bytes (1 MiB) whatever the frame limit (16 MiB by
    default); an entry larger than that still goes, alone."""
    messages = [Message.user(str(n) * 300_000) for n in range(6)] + [Message.user("z" * 2**21)]
    data = ConversationSnapshot.new(messages, [False] * len(messages)).encode()
    calls: list[tuple[int, int]] = []
    await import_conversation(
        hub.url, data, "fill", progress=lambda done, total: calls.append((done, total))
    )
    assert calls == [(0, 7), (3, 7), (6, 7), (7, 7)]  # 3 x 300 KB per batch, then 2 MiB alone
    fetched = await fetch_conversation(hub.url, "fill")
    assert fetched.conversation.messages() == messages


async def test_import_reads_a_path_or_a_file(hub: Hub, tmp_path: Path) -> None:
    """`source` may be a path (str or Path) or a binary file, as well as bytes."""
    data = encode(a_conversation())
    path = tmp_path / "state.json"
    path.write_bytes(data)
    await import_conversation(hub.url, path, "from-path")
    await import_conversation(hub.url, str(path), "from-str")
    await import_conversation(hub.url, io.BytesIO(data), "from-file")
    for target in ("from-path", "from-str", "from-file"):
        assert (await export_conversation(hub.url, target, format="state")).data == data
    with pytest.raises(ImportRefused) as missing:
        await import_conversation(hub.url, tmp_path / "nope.json", "never")
    assert missing.value.reason == "unreadable"
    assert "nope.json" in missing.value.message


async def test_bad_input_is_refused_before_the_hub_is_asked() -> None:
    """A bad file is `ImportRefused` even with no hub there: it is checked before connecting."""
    url = f"ws://127.0.0.1:{free_port()}"
    cases = [
        (b"not json", "bad_file"),
        (b'{"version": 9, "messages": [], "pinned": []}', "bad_file"),
        (
            ConversationSnapshot.new([Message.tool_result("x", "t", "r")], [False]).encode(),
            "unpairable",
        ),
        (ConversationSnapshot.new([Message.user("x" * 5000)], [False]).encode(), "too_large"),
    ]
    for data, reason in cases:
        with pytest.raises(ImportRefused) as refused:
            await import_conversation(url, data, "c1", max_frame=4096 + 1000, where="mine")
        assert refused.value.reason == reason
        assert refused.value.message.startswith("mine: ")
        assert refused.value.imported == 0
    with pytest.raises(HubError) as unreachable:
        await import_conversation(url, encode(a_conversation()), "c1")
    assert unreachable.value.reason == "unreachable"


async def test_import_into_a_busy_conversation_needs_replace(hub: Hub) -> None:
    """A conversation that is not empty is refused unchanged; `replace=True` resets it."""
    async with connect(hub.url, "busy", client="w") as replica:
        replica.conversation.push(Message.user("already here"))
        with anyio.fail_after(bound(10)):
            await replica.flush()
    data = ConversationSnapshot.new(a_turn(0), [False] * 4).encode()
    with pytest.raises(ImportRefused) as refused:
        await import_conversation(hub.url, data, "busy")
    assert refused.value.reason == "not_empty"
    before = await fetch_conversation(hub.url, "busy")
    assert before.conversation.messages() == [Message.user("already here")]
    imported = await import_conversation(hub.url, data, "busy", replace=True)
    assert imported.replaced and imported.messages == 4
    after = await fetch_conversation(hub.url, "busy")
    assert after.conversation.messages() == a_turn(0)
    assert after.revision == imported.revision


async def test_a_push_the_hub_refuses_says_how_much_went_in(hub: Hub) -> None:
    """Without the local pairing check, a batch the strict hub rejects is `TransferError`
    `refused` whose `imported` counts the batches that went in before it."""
    messages = [m for n in range(125) for m in a_turn(n)]  # 500: the first batch
    messages.append(Message.tool_result("orphan", "lookup", "answers nothing"))
    data = ConversationSnapshot.new(messages, [False] * len(messages)).encode()
    with pytest.raises(TransferError) as refused:
        await import_conversation(hub.url, data, "half", check_pairing=False)
    assert not isinstance(refused.value, ImportRefused)
    assert refused.value.reason == "refused"
    assert refused.value.imported == 500
    assert "(500 of 501 messages were imported)" in refused.value.message
    fetched = await fetch_conversation(hub.url, "half")
    assert fetched.conversation.messages() == messages[:500]


async def test_default_export_then_import_gives_an_equal_conversation(hub: Hub) -> None:
    """What `export_conversation` writes by default imports into a new conversation as an
    equal one: ids, authors, source ids, turn records, notes, pins, halt and retired ids."""
    source = an_authored_conversation()
    await import_conversation(hub.url, encode(source), "original")
    exported = await export_conversation(hub.url, "original")
    await import_conversation(hub.url, exported.data, "copy")
    copy = (await fetch_conversation(hub.url, "copy")).conversation
    assert copy == source
    assert copy.state() == source.state()
    assert [ref.author for ref in copy.entries()] == [ref.author for ref in source.entries()]
    assert copy.turns() and copy.halted() == "kept"


def test_snapshot_leaves_out_names_each_loss() -> None:
    """`snapshot_leaves_out` lists what a snapshot v1 drops (the pins it keeps are not
    listed), and nothing for a conversation it holds whole."""
    assert snapshot_leaves_out(an_authored_conversation()) == [
        "entry ids",
        "the authors of 2 entries",
        "the source ids of 1 entry",
        "1 turn record",
        "1 note",
        "the halt (kept)",
        "1 retired id",
    ]
    assert snapshot_leaves_out(Conversation()) == []
    snapshot = ConversationSnapshot.new(a_turn(0), [True, False, False, False])
    assert snapshot_leaves_out(snapshot.to_conversation()) == ["entry ids"]


def test_read_tells_the_three_documents_apart() -> None:
    """Without a format, a state, a snapshot v1 and a hub answer are each read as what they
    are; `state` also takes a hub answer (it holds a state)."""
    source = an_authored_conversation()
    view = HubView(7, 3, source.state())
    assert read_conversation(encode(source)) == source
    assert read_conversation(encode(view)) == source
    assert read_conversation(encode(view), "state") == source
    snapshot = ConversationSnapshot.from_conversation(source).encode()
    assert read_conversation(snapshot).messages() == source.messages()
    assert read_conversation(snapshot, "snapshot").messages() == source.messages()


EXPECTED_ANY = (
    "expected a state (entries, asides, halt, retired), a snapshot v1 (version, messages, "
    "pinned) or a hub answer (lineage, revision, state)"
)


@pytest.mark.parametrize(
    ("data", "format", "reason", "says"),
    [
        (
            b'{"messages": [{"role": "user", "content": "hi"}]}',
            "auto",
            "bad_file",
            "found keys 'messages' (a snapshot v1 also needs version 1 and a pinned flag per "
            f"message); {EXPECTED_ANY}",
        ),
        (b"{}", "auto", "bad_file", f"found an empty object; {EXPECTED_ANY}"),
        (b'{"foo": 1}', "auto", "bad_file", f"found keys 'foo'; {EXPECTED_ANY}"),
        (
            b'{"foo": 1}',
            "state",
            "bad_file",
            "found keys 'foo'; expected a state (entries, asides, halt, retired)",
        ),
        (
            ConversationSnapshot.new(a_turn(0), [False] * 4).encode(),
            "state",
            "wrong_format",
            "expected a state (entries, asides, halt, retired), found a snapshot v1 "
            "(version, messages, pinned)",
        ),
        (
            encode(a_conversation()),
            "snapshot",
            "wrong_format",
            "expected a snapshot v1 (version, messages, pinned), found a state (entries, "
            "asides, halt, retired)",
        ),
        (
            b'{"lineage": 1, "revision": 0, "state": {}}',
            "snapshot",
            "wrong_format",
            "found a hub answer (lineage, revision, state)",
        ),
        (
            b'{"entries": [], "messages": []}',
            "auto",
            "bad_file",
            "unknown key $.messages in a state (entries, asides, halt, retired); importing "
            "would drop it",
        ),
        (
            b'{"version": 1, "pinned": [false], "messages": [{"role": "user", "content": '
            b'[{"type": "text", "text": "hi", "lang": "en"}]}]}',
            "auto",
            "bad_file",
            "unknown key $.messages[0].content[0].lang in a snapshot v1",
        ),
        (
            b'{"lineage": 1, "revision": 0, "at": 5, "state": {}}',
            "state",
            "bad_file",
            "unknown key $.at in a hub answer",
        ),
    ],
)
def test_read_refuses_what_it_does_not_understand(
    data: bytes, format: Literal["auto", "state", "snapshot"], reason: str, says: str
) -> None:
    """A document of no known shape, of another format than the one asked for, or holding a
    key its format does not know, is refused saying what was found and what was expected."""
    with pytest.raises(ImportRefused) as refused:
        read_conversation(data, format, "f.json")
    assert refused.value.reason == reason
    assert refused.value.message.startswith("f.json: ")
    assert says in refused.value.message


def test_free_form_values_may_hold_any_key() -> None:
    """Tool call arguments, JSON results and aside values are not checked for keys."""
    conversation = Conversation()
    call = ToolCall("c1", "lookup", {"anything": {"nested": 1}})
    conversation.extend([Message.user("q"), Assistant([call], stop=Stop("tool_use"))])
    conversation.add_aside(Aside("custom", None, Author.user(), {"whatever": [{"x": 1}]}))
    assert read_conversation(encode(conversation)) == conversation


def test_state_export_is_a_state_file() -> None:
    """The state format decodes back to the same conversation (the import's input)."""
    source = a_conversation()
    assert decode_state(encode_conversation(source, "state")) == source
    assert read_conversation(encode_conversation(source, "snapshot")).messages() == (
        source.messages()
    )
