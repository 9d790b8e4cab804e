"""The hub's per-connection protocol checks, without sockets."""

from __future__ import annotations

import pytest

from server import HubConfig
from server.session import HubSession, conversation_id_of, is_conversation_id
from sync import UsageError
from sync.errors import ProtocolError
from sync.protocol import Hello, PushBatch

HELLO = b'{"type":"hello","client":"ui","lineage":0,"revision":0}'
PUSH = (
    b'{"type":"push","seq":1,"lineage":0,"revision":0,"records":[{"change":{"type":"halt",'
    b'"halt":null},"by":null,"at":null}]}'
)


def test_hello_then_push() -> None:
    """A hello opens the session; pushes are accepted after it."""
    session = HubSession(1 << 20)
    assert isinstance(session.receive(HELLO), Hello)
    assert isinstance(session.receive(PUSH), PushBatch)
    kind = b'{"type":"hello","client":"ui","lineage":0,"revision":0,"kind":"' + b"k" * 64 + b'"}'
    assert HubSession(1 << 20).receive(kind) == Hello("ui", 0, 0, kind="k" * 64)


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        ([b"{"], "malformed_json"),
        ([b'{"type":"nope"}'], "unknown_type"),
        ([b"[]"], "unknown_type"),
        ([b'{"type":[1]}'], "unknown_type"),  # found by fuzzing: an unhashable type crashed
        ([b'{"type":{"a":1}}'], "unknown_type"),
        ([b"[" * 100_000 + b"]" * 100_000], "malformed_json"),  # found by fuzzing: recursion
        (
            [HELLO, PUSH.replace(b'"halt":null', b'"halt":' + b"[" * 100_000 + b"]" * 100_000)],
            "malformed_json",
        ),
        ([b'{"type":"hello","client":"x","lineage":"0","revision":0}'], "bad_message"),
        ([b'{"type":"hello","client":"","lineage":0,"revision":0}'], "bad_client"),
        ([b'{"type":"hello","client":"x","lineage":-1,"revision":0}'], "bad_message"),
        # `kind` is shown to every presence subscriber: bounded like a client id.
        ([b'{"type":"hello","client":"x","lineage":0,"revision":0,"kind":""}'], "bad_message"),
        (
            [b'{"type":"hello","client":"x","lineage":0,"revision":0,"kind":"' + b"k" * 65 + b'"}'],
            "bad_message",
        ),
        ([b'{"type":"hello","client":"x","lineage":0,"revision":0,"kind":"a\\nb"}'], "bad_message"),
        # Unicode line and format characters split log lines (issue 27): Cc, Cf, Zl, Zp.
        *(
            (
                [b'{"type":"hello","client":"x%s","lineage":0,"revision":0}' % bad],
                "bad_client",
            )
            for bad in (b"\\u0085", b"\\u2028", b"\\u2029", b"\\u202e", b"\\u007f")
        ),
        *(
            (
                [b'{"type":"hello","client":"x","lineage":0,"revision":0,"kind":"k%s"}' % bad],
                "bad_message",
            )
            for bad in (b"\\u0085", b"\\u2028", b"\\u200b")
        ),
        ([HELLO, b'{"type":"status","status":"ok\\u2028INFO forged"}'], "bad_message"),
        ([PUSH], "no_hello"),
        ([HELLO, HELLO], "unexpected"),
        ([HELLO, PUSH.replace(b'"seq":1', b'"seq":0')], "bad_message"),
        ([HELLO, b'{"type":"push","seq":1,"lineage":0,"revision":0,"records":[]}'], "bad_message"),
        ([HELLO, b" " * 500_000], "too_big"),
        # Every integer is bounded to a signed 64-bit column: a seq of 2**63 would be acked
        # by the memory store and fault SQLite as if transient (issue 27).
        ([HELLO, PUSH.replace(b'"seq":1', b'"seq":9223372036854775808')], "bad_message"),
        ([HELLO, PUSH.replace(b'"at":null', b'"at":9223372036854775808')], "bad_message"),
        ([HELLO, PUSH.replace(b'"revision":0', b'"revision":9223372036854775808')], "bad_message"),
        (
            [b'{"type":"hello","client":"x","lineage":0,"revision":9223372036854775808}'],
            "bad_message",
        ),
        (
            [HELLO, b'{"type":"draft","id":"msg_x","op":"append","offset":9223372036854775808}'],
            "bad_message",
        ),
        ([HELLO, b'{"type":"draft","id":"msg_x","op":"open","epoch":-1}'], "bad_message"),
        (
            [HELLO, b'{"type":"draft","id":"msg_x","op":"append","name":"' + b"n" * 129 + b'"}'],
            "bad_message",
        ),
    ],
)
def test_bad_frames_name_their_fault(frames: list[bytes], code: str) -> None:
    """Each kind of bad frame raises `ProtocolError` with the code the hub sends."""
    session = HubSession(400_000)
    with pytest.raises(ProtocolError) as caught:
        for frame in frames:
            session.receive(frame)
    assert caught.value.reason == code


def test_conversation_ids() -> None:
    """Conversation ids are 1-128 chars of [A-Za-z0-9._:-], read from the path."""
    assert is_conversation_id("a.b:c-d_9")
    assert not is_conversation_id("")
    assert not is_conversation_id("x" * 129)
    assert not is_conversation_id("a/b")
    assert conversation_id_of("/v1/conversations/abc?x=1") == "abc"
    assert conversation_id_of("/elsewhere") is None


def test_config_from_env_and_bad_values() -> None:
    """Settings come from CONVSYNC_* variables; a bad value is a clear usage error."""
    config = HubConfig.from_env({"CONVSYNC_MAX_FRAME": "65536", "CONVSYNC_STRICT_PAIRING": "off"})
    assert config.max_frame == 65536 and config.strict_pairing is False
    with pytest.raises(UsageError):
        HubConfig.from_env({"CONVSYNC_SEND_QUEUE": "many"})
    with pytest.raises(UsageError):
        HubConfig(max_frame=10)
