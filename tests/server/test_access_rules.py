"""The access rules in the pure core and session, without sockets or event loop."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest
from test_core import NOW, frames_to, record

from server.auth import ANONYMOUS, AuthError, Grant, Key, KeyRing, mint_token
from server.core import AppendRecords, Close, CoreConfig, RoomCore
from server.limits import BUDGETS
from server.session import Access, HubSession, Limits
from sync.errors import ProtocolError
from sync.protocol import (
    Auth,
    AuthOk,
    DraftEnd,
    DraftOp,
    Hello,
    PushBatch,
    Reject,
    StatusUpdate,
    Welcome,
)

SECRET = b"rules-secret-0123456789abcdefghijklmn"
T = NOW / 1000  # the same moment in seconds


def grant(sub: str = "alice", scopes: str = "read write", convs: tuple[str, ...] = ("*",)) -> Grant:
    return Grant(sub, frozenset(scopes.split()), convs, exp=T + 600)  # type: ignore[arg-type]


def auth_core() -> RoomCore[str]:
    room: RoomCore[str] = RoomCore("c", CoreConfig(max_frame=1 << 20, auth=True))
    room.load(None)
    return room


def join(room: RoomCore[str], conn: str, client: str, held: Grant) -> list[Any]:
    return room.join(conn, Hello(client, room.lineage, room.revision), NOW, held)


def test_join_needs_read_on_the_conversation() -> None:
    """A grant without the conversation or without `read` is closed `forbidden`; nothing joins."""
    room = auth_core()
    for held in (grant(convs=("other",)), grant(scopes="presence")):
        actions = join(room, "x", "x", held)
        assert [type(a) for a in actions] == [Close]
        assert actions[0].code == "forbidden"
    assert room.subscribers == {} and room.grants == {}


def test_welcome_lists_scopes_and_expires_in() -> None:
    """With auth, `welcome` carries the granted scopes and the seconds left."""
    room = auth_core()
    [welcome] = frames_to(join(room, "a", "w", grant(scopes="read")), "a")
    assert isinstance(welcome, Welcome)
    assert (welcome.scopes, welcome.expires_in) == (["read"], 600)
    assert "auth" in welcome.features


def test_push_without_write_is_rejected_forbidden_before_anything() -> None:
    """A read-only grant's push is `reject forbidden` with no store call and nothing folded;
    after `regrant` to `write` the same push lands."""
    room = auth_core()
    join(room, "a", "w", grant(scopes="read"))
    batch = PushBatch(1, room.lineage, 0, [record("no")])
    actions = room.push("a", batch, NOW)
    [reject] = frames_to(actions, "a")
    assert isinstance(reject, Reject) and reject.reason == "forbidden"
    assert not room.waiting and len(room.conversation) == 0
    [ok] = frames_to(room.regrant("a", grant(), T), "a")
    assert ok == AuthOk(600)
    assert isinstance(room.push("a", batch, NOW)[-1], AppendRecords)


def test_push_after_exp_is_forbidden() -> None:
    """In the grace after `exp` a socket may still refresh, but not push."""
    room = auth_core()
    join(room, "a", "w", grant())
    late = int((T + 601) * 1000)
    [reject] = frames_to(room.push("a", PushBatch(1, room.lineage, 0, [record("x")]), late), "a")
    assert isinstance(reject, Reject) and reject.detail == "token expired"


def test_marks_are_keyed_by_sub_and_client_and_records_stamped_via() -> None:
    """With auth the store key is `sub/client` (a `/` in sub escaped) and `via` is stamped."""
    room = auth_core()
    join(room, "a", "w", grant("team/a"))
    call = room.push("a", PushBatch(1, room.lineage, 0, [record("x")]), NOW)[-1]
    assert isinstance(call, AppendRecords)
    assert call.client == "team%2Fa/w"
    assert msgspec.json.decode(call.records[0])["via"] == {"sub": "team/a", "client": "w"}


def test_without_auth_marks_and_records_are_as_before() -> None:
    """Without auth: the plain client id, no `via` key, and no replacing."""
    room: RoomCore[str] = RoomCore("c", CoreConfig(max_frame=1 << 20))
    room.load(None)
    room.join("a", Hello("w", room.lineage, 0))
    assert frames_to(room.join("b", Hello("w", room.lineage, 0)), "a") == []
    call = room.push("a", PushBatch(1, room.lineage, 0, [record("x")]), NOW)[-1]
    assert isinstance(call, AppendRecords) and call.client == "w"
    assert "via" not in msgspec.json.decode(call.records[0])


def test_same_identity_replaces_and_another_sub_does_not() -> None:
    """A second socket of (sub, client) closes the first `replaced`; another sub with the same
    client id lives beside them."""
    room = auth_core()
    join(room, "a1", "w", grant("alice"))
    assert not any(isinstance(a, Close) for a in join(room, "b1", "w", grant("bob")))
    actions = join(room, "a2", "w", grant("alice"))
    closes = [a for a in actions if isinstance(a, Close)]
    assert [(c.to, c.code) for c in closes] == [("a1", "replaced")]
    assert set(room.subscribers) == {"b1", "a2"}


# ---------------------------------------------------------------------- the session

HELLO = b'{"type":"hello","client":"w","lineage":0,"revision":0}'
PUSH_FRAME = (
    b'{"type":"push","seq":%d,"lineage":0,"revision":0,"records":[{"change":{"type":"push",'
    b'"entries":[{"message":{"role":"user","content":[{"type":"text","text":"x"}]},'
    b'"id":"msg_0190a5b2c3d47e0f8a1b2c3d4e5f6071"}]}}]}'
)


def session(**limits: Any) -> HubSession:
    access = Access(KeyRing.of(Key.secret(SECRET)))
    return HubSession(1 << 20, access=access, conversation_id="c", limits=Limits(**limits), now=T)


def test_session_deadlines_hello_then_expiry() -> None:
    """Before hello the deadline is the hello timeout; after, the token's exp plus the grace."""
    s = session(hello_timeout=5, expiry_grace=30)
    assert s.next_deadline() == T + 5
    assert s.expired(T + 4.9) is None
    late = s.expired(T + 5)
    assert late is not None and late.reason == "no_hello"
    hello = s.receive(HELLO.replace(b"}", b',"token":"%s"}' % _token(60).encode()), T)
    assert isinstance(hello, Hello)
    held = s.authorize(hello, T)
    assert s.next_deadline() == held.exp + 30
    gone = s.expired(held.exp + 30)
    assert gone is not None and gone.reason == "unauthorized"


def _token(ttl: float, sub: str = "alice") -> str:
    return mint_token(SECRET, sub, ["write"], ["*"], ttl, now=T)


def test_session_refresh_same_sub_only() -> None:
    """`refresh` takes a token of the same sub and refuses another sub as `unauthorized`."""
    s = session()
    hello = s.receive(HELLO, T)
    assert isinstance(hello, Hello)
    with pytest.raises(AuthError) as missing:
        s.authorize(hello, T)  # no token anywhere
    assert missing.value.code == "unauthorized"
    s = HubSession(
        1 << 20, access=Access(KeyRing.of(Key.secret(SECRET))), conversation_id="c",
        bearer=_token(60), now=T,
    )  # fmt: skip
    s.authorize(s.receive(HELLO, T), T)  # type: ignore[arg-type]
    assert s.refresh(Auth(_token(120)), T).exp == math.ceil(T + 120)
    with pytest.raises(AuthError):
        s.refresh(Auth(_token(120, sub="mallory")), T)


def test_session_first_frame_and_rate_limit() -> None:
    """The first frame is held to its own limit; a push over its budget is slowed (the wait
    the shell must keep before reading on), not refused."""
    s = session(first_frame=1024, rate=1, burst=3)
    with pytest.raises(ProtocolError) as big:
        s.receive(b" " * 2000, T)
    assert big.value.reason == "too_big"
    s = session(rate=1, burst=3)
    s.receive(HELLO, T)
    pushes = [s.receive(PUSH_FRAME % (k + 1), T) for k in range(4)]
    assert [s.throttle(push, T) for push in pushes] == [0.0, 0.0, 0.0, 1.0]  # one token short
    assert s.throttle(pushes[0], T + 2.0) == 0.0  # the debt paid, a token refilled


def test_session_budgets_are_per_kind() -> None:
    """Pings, drafts and statuses spend budgets of their own: a writer at its push budget is
    not slowed by them, and they are not slowed by its pushes."""
    s = session(rate=1, burst=1)
    s.receive(HELLO, T)
    push = s.receive(PUSH_FRAME % 1, T)
    assert s.throttle(push, T) == 0.0
    assert s.throttle(push, T) == 1.0  # pushes: over
    ping = s.receive(b'{"type":"ping"}', T)
    assert all(s.throttle(ping, T) == 0.0 for _ in range(int(BUDGETS["control"].burst)))
    assert s.throttle(ping, T) > 0.0  # control: over, on its own


def test_session_held_at_a_budget_too_long_is_a_flood() -> None:
    """A socket held at its budget without a break for `flood_after` seconds is cut
    `rate_limited`, naming the limit; one that gets a break in time is not."""
    s = session(rate=10, burst=1, flood_after=2)
    s.receive(HELLO, T)
    push = s.receive(PUSH_FRAME % 1, T)
    now = T
    assert s.throttle(push, now) == 0.0
    while now < T + 1.9:  # read as fast as the budget lets it: held, not yet a flood
        wait = s.throttle(push, now)
        assert wait > 0.0
        now += wait
    now += 1.0  # a break: the bucket refills
    assert s.throttle(push, now) == 0.0
    start = now
    with pytest.raises(ProtocolError) as flood:
        while now < start + 3:
            now += s.throttle(push, now)
    assert flood.value.reason == "rate_limited"
    assert "limit of 10 push messages/s" in flood.value.message
    assert now - start >= 2


def test_session_without_access_is_anonymous_and_refuses_auth() -> None:
    """Without keys every socket is `ANONYMOUS` and an `auth` message is `unexpected`."""
    s = HubSession(1 << 20)
    hello = s.receive(HELLO)
    assert isinstance(hello, Hello) and s.authorize(hello, T) is ANONYMOUS
    assert s.next_deadline() == math.inf
    with pytest.raises(ProtocolError) as unexpected:
        s.receive(b'{"type":"auth","token":"x"}')
    assert unexpected.value.reason == "unexpected"


# ---------------------------------------------------------------------- drafts and presence


def test_drafts_need_write_and_presence_shows_the_token() -> None:
    """A read-only grant's draft `open` is refused; presence lists the token's `sub`, kind and
    name (not what the hello claims); a status needs `presence` or `write`."""
    room = auth_core()
    reader = Grant("alice", frozenset({"read"}), ("*",), kind="ui", name="Alice", exp=T + 600)
    hello = Hello("ui", room.lineage, 0, features=["drafts", "presence"], kind="agent")
    room.join("r", hello, NOW, reader)
    op = DraftOp("msg_0190a5b2c3d47e0f8a1b2c3d4e5f6071", "open")
    [end] = frames_to(room.draft("r", op, NOW), "r")
    assert isinstance(end, DraftEnd) and end.status == "refused"
    assert not room.drafts.drafts
    [entry] = room.presence.entries.values()
    assert (entry.principal, entry.client, entry.kind, entry.name) == ("alice", "ui", "ui", "Alice")
    room.status("r", StatusUpdate("looking", None), NOW)
    assert entry.status is None  # `read` alone may not publish a status
    room.regrant("r", grant("alice", scopes="read presence"), T)
    room.status("r", StatusUpdate("looking", None), NOW)
    assert entry.status == "looking"


def test_a_downgrade_ends_the_connections_drafts_and_a_reader_cannot_take_one_over() -> None:
    """After `auth` to a read-only token the connection's drafts end `aborted` for everyone
    and its later appends are refused, not broadcast; a new read-only socket of the same
    (sub, client) can neither append to nor take over an orphaned draft (issue 27)."""
    features = ["drafts", "presence"]
    room = auth_core()
    room.join("w", Hello("agent", room.lineage, 0, features=features), NOW, grant())
    room.join("ui", Hello("ui", room.lineage, 0, features=features), NOW, grant("bob", "read"))
    d, e = "msg_0190a5b2c3d47e0f8a1b2c3d4e5f6071", "msg_0190a5b2c3d47e0f8a1b2c3d4e5f6072"
    room.draft("w", DraftOp(d, "open"), NOW)
    room.draft("w", DraftOp(d, "append", text="so far"), NOW)
    actions = room.regrant("w", grant(scopes="read"), T)
    assert DraftEnd(d, "aborted", "the producer may no longer write") in frames_to(actions, "ui")
    assert d not in room.drafts
    refused = frames_to(room.draft("w", DraftOp(d, "append", offset=6, text="!"), NOW), "ui")
    assert refused == [] and d not in room.drafts
    # An orphaned draft of the same owner: a read-only socket may not resume it.
    room.regrant("w", grant(), T)
    room.draft("w", DraftOp(e, "open"), NOW)
    room.draft("w", DraftOp(e, "append", text="abc"), NOW)
    room.leave("w", NOW)
    room.join("w2", Hello("agent", room.lineage, 0, features=features), NOW, grant(scopes="read"))
    for op in (DraftOp(e, "append", offset=3, text="x"), DraftOp(e, "keep"),
               DraftOp(e, "open", epoch=5)):  # fmt: skip
        actions = room.draft("w2", op, NOW)
        assert frames_to(actions, "ui") == []
        [end] = frames_to(actions, "w2")
        assert end == DraftEnd(e, "refused", "this connection may not write")
    assert room.drafts.text(e) == "abc" and room.drafts.drafts[e].conn is None
