"""The hub's log as `convsync serve` writes it: text lines or JSON lines, never a secret."""

from __future__ import annotations

import json
import logging
import sys

from cliproc import Running, convsync

from server.auth import mint_token
from server.logs import JsonFormatter, TextFormatter

SECRET = "log-format-secret-0123456789abcdefghij"
TEXT = "the words of a message that stay out of logs"
FIELDS = {"time", "level", "logger", "message"}


def _record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            info = sys.exc_info()
    return logging.LogRecord("convsync.hub", logging.INFO, __file__, 1, message, args, info)


def test_a_json_line_holds_the_fields_of_the_text_line() -> None:
    """Time, level, logger and message, the same in both forms; a traceback goes with them;
    nothing else of the record (its `extra` attributes) goes out."""
    record = _record("closed %s for %r", "conv", "a reason")
    record.token = "an extra attribute"
    line = JsonFormatter().format(record)
    entry = json.loads(line)
    assert set(entry) == FIELDS
    text = TextFormatter().format(record)
    assert text == f"{entry['time']} INFO convsync.hub: closed conv for 'a reason'"
    assert entry["message"] == "closed conv for 'a reason'" and entry["level"] == "INFO"
    assert entry["time"].endswith("Z") and len(entry["time"]) == len("2026-12-02T01:40:00.123Z")
    assert "an extra attribute" not in line + text
    failed = json.loads(JsonFormatter().format(_record("failed", exc=True)))
    assert set(failed) == FIELDS | {"exception"} and "ValueError: boom" in failed["exception"]


def test_no_character_of_a_field_splits_a_json_line() -> None:
    """Line breaks, U+2028, U+0085 and a forged level in a message stay in one line."""
    forged = "x\nINFO forged\u2028line\u0085end\r"
    line = JsonFormatter().format(_record("client %s", forged))
    assert len(line.splitlines()) == 1 and line.isascii()
    assert json.loads(line)["message"] == f"client {forged}"


def test_serve_writes_json_lines_without_tokens_or_message_text() -> None:
    """`convsync serve --log-format json --log-level debug` with auth: a session of writes
    and refusals leaves one JSON object per stderr line, with the four fields, and no token,
    signature, secret or message text in any of them."""
    good = mint_token(SECRET, "alice", ["write"], ["*"], 300)
    other = mint_token(SECRET, "bob", ["read"], ["elsewhere"], 300)
    wrong = mint_token(SECRET + "x", "mallory", ["write"], ["*"], 300)
    hub = Running(
        "serve", "--db", ":memory:", "--port", "0", "--log-format", "json", "--log-level",
        "debug", env={"CONVSYNC_AUTH_SECRET": SECRET},
    )  # fmt: skip
    try:
        url = hub.url()
        assert convsync("send", "logs", TEXT, "--url", url, "--token", good).returncode == 0
        assert convsync("send", "logs", "no", "--url", url, "--token", other).returncode != 0
        assert convsync("send", "logs", "no", "--url", url, "--token", wrong).returncode != 0
    finally:
        code, err = hub.stop()
    assert code == 0, err
    entries = [json.loads(line) for line in err.splitlines()]
    assert all(FIELDS <= set(e) <= FIELDS | {"exception", "stack"} for e in entries)
    loggers = {e["logger"] for e in entries}
    assert {"convsync.hub", "convsync.serve"} <= loggers, loggers  # joins, refusals, stop
    assert any(e["level"] == "DEBUG" for e in entries)
    for value in (good, other, wrong, SECRET, TEXT):
        assert value not in err
        assert value.rsplit(".", 1)[-1] not in err
    assert "message that stay" not in err


def test_serve_refuses_a_log_format_it_does_not_know() -> None:
    """A bad `CONVSYNC_LOG_FORMAT` exits 2 with one line naming it; nothing is served."""
    result = convsync("serve", "--port", "0", env={"CONVSYNC_LOG_FORMAT": "xml"})
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == "convsync: error: CONVSYNC_LOG_FORMAT='xml': give text or json\n"


async def _refusals_of(frames: list[str]) -> list[dict[str, object]]:
    """Each frame on its own socket to a hub on 127.0.0.1: the hub's `error` answers."""
    import anyio
    from conftest import bound, hub_config
    from websockets.asyncio.client import connect as ws_connect
    from websockets.exceptions import ConnectionClosed

    from server import Hub, MemoryStore
    from sync.protocol import SUBPROTOCOL

    answers: list[dict[str, object]] = []
    async with Hub(MemoryStore(), port=0, config=hub_config()) as hub:
        for frame in frames:
            url = f"{hub.url}/v1/conversations/logged"
            async with ws_connect(url, subprotocols=[SUBPROTOCOL]) as ws:
                await ws.send(frame)
                with anyio.fail_after(bound(5)):
                    try:
                        while True:
                            answer = json.loads(await ws.recv())
                            if answer.get("type") == "error":
                                answers.append(answer)
                    except ConnectionClosed:
                        pass
    return answers


def test_a_refused_frame_s_own_words_reach_the_peer_and_no_log_line(caplog) -> None:  # type: ignore[no-untyped-def]
    """A frame the hub cannot decode (an unknown type, a bad enum value, broken JSON) is
    refused with the decoder's words, which may quote the frame; those words go back to the
    peer and never into the hub's log line about the close."""
    import anyio

    caplog.set_level(logging.DEBUG)
    frames = [
        json.dumps({"type": TEXT}),
        json.dumps(
            {
                "type": "hello",
                "client": "c",
                "lineage": 0,
                "revision": 0,
                "kind": 7,
                "state_format": TEXT,
            }
        ),
        '{"type": "hello", "client": "' + TEXT + '"',
    ]
    answers = anyio.run(_refusals_of, frames)
    assert len(answers) == 3 and any(TEXT in str(a.get("detail", a)) for a in answers), answers
    ours = [r for r in caplog.records if r.name.startswith("convsync")]
    closes = [r for r in ours if r.getMessage().startswith("closing a socket")]
    assert len(closes) == 3, [r.getMessage() for r in ours]
    forms = (TextFormatter(), JsonFormatter())
    for record in ours:
        assert TEXT not in " ".join(form.format(record) for form in forms)
