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

import anyio
import pytest
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
from client.transfer import encode_conversation, read_conversation
from server import Hub
from sync import (
    Aside,
    Assistant,
    Author,
    Conversation,
    Message,
    Stop,
    Text,
    ToolCall,
    decode_state,
    encode,
)
from sync.snapshot import ConversationSnapshot

ROOT = Path(__file__).resolve().parents[1]


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# ---------------------------------------------------------------------- layering


def _imported_modules(path: Path) -> set[str]:
    """The modules a file of `client` imports, relative imports made absolute."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
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


async def test_export_gives_a_snapshot_or_the_whole_state(hub: Hub) -> None:
    """`export_conversation` encodes the hub's copy as snapshot v1 or state, with revision."""
    source = a_conversation()
    await import_conversation(hub.url, encode(source), "exported")
    snapshot = await export_conversation(hub.url, "exported")
    assert ConversationSnapshot.decode(snapshot.data).messages == source.messages()
    state = await export_conversation(hub.url, "exported", format="state")
    assert state.data == encode(source)
    assert state.messages == len(source)
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


def test_state_export_is_a_state_file() -> None:
    """The state format decodes back to the same conversation (the import's input)."""
    source = a_conversation()
    assert decode_state(encode_conversation(source, "state")) == source
    assert read_conversation(encode_conversation(source, "snapshot")).messages() == (
        source.messages()
    )
