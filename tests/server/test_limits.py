"""Rate limits, caps, and the origin, host and bind rules of SPEC §6, driven by a given clock."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import sourcetree

from server.limits import (
    Caps,
    TokenBucket,
    host_allowed,
    is_loopback_bind,
    normalize_origin,
    origin_allowed,
    own_origins,
)
from sync.errors import UsageError


def test_bucket_allows_a_burst_then_refuses() -> None:
    """A full bucket allows `burst` messages at once and refuses the next."""
    bucket = TokenBucket(rate=200, burst=400, now=0.0)
    assert all(bucket.take(0.0) for _ in range(400))
    assert not bucket.take(0.0)
    assert not bucket.take(0.001)  # 0.2 of a token refilled: still not one


def test_bucket_refills_at_its_rate_up_to_burst() -> None:
    """Time refills `rate` tokens a second, never more than `burst`."""
    bucket = TokenBucket(rate=10, burst=5, now=0.0)
    for _ in range(5):
        assert bucket.take(0.0)
    assert not bucket.take(0.0)
    assert bucket.take(0.1)  # one token after 1/rate seconds
    assert not bucket.take(0.1)
    assert bucket.available(100.0) == 5  # an hour idle still holds only a burst
    taken = sum(bucket.take(100.0) for _ in range(50))
    assert taken == 5


def test_bucket_sustains_its_rate_over_time() -> None:
    """Over ten seconds a sender taking as fast as it can gets burst + rate * 10 messages."""
    bucket = TokenBucket(rate=200, burst=400, now=0.0)
    granted = 0
    for step in range(10_001):
        now = step / 1000
        while bucket.take(now):
            granted += 1
    assert 2390 <= granted <= 2401


def test_bucket_ignores_a_clock_going_backwards() -> None:
    """A clock stepping back refills nothing and spends nothing by itself."""
    bucket = TokenBucket(rate=1, burst=2, now=10.0)
    assert bucket.take(10.0) and bucket.take(10.0)
    assert not bucket.take(5.0)
    assert not bucket.take(10.5)
    assert bucket.take(11.0)


def test_bucket_refuses_bad_settings() -> None:
    """A rate of zero or a burst under one is a usage error."""
    with pytest.raises(UsageError):
        TokenBucket(rate=0, burst=10, now=0.0)
    with pytest.raises(UsageError):
        TokenBucket(rate=10, burst=0.5, now=0.0)


def test_caps_count_per_key_up_to_the_limit() -> None:
    """Each key holds at most `limit`; a refused acquire changes nothing; release frees one."""
    caps = Caps(limit=2)
    assert caps.acquire("alice") and caps.acquire("alice")
    assert not caps.acquire("alice")
    assert caps.count("alice") == 2
    assert caps.acquire("bob")
    caps.release("alice")
    assert caps.acquire("alice")
    assert not caps.acquire("alice")


def test_caps_forget_released_keys_and_refuse_double_release() -> None:
    """Keys at zero are dropped (memory follows open sockets); releasing one not held raises."""
    caps = Caps(limit=64)
    for address in range(1000):
        assert caps.acquire(("10.0.0.1", address))
    for address in range(1000):
        caps.release(("10.0.0.1", address))
    assert len(caps) == 0
    with pytest.raises(UsageError):
        caps.release("never-acquired")
    with pytest.raises(UsageError):
        Caps(limit=0)


def test_origin_rules() -> None:
    """No Origin passes; otherwise only the hub's own origins or `--allow-origin` entries."""
    own = own_origins("wss://hub.example.com/", port=8765, tls=False)
    assert origin_allowed(None, [], own)
    assert origin_allowed("https://hub.example.com", [], own)
    assert origin_allowed("http://localhost:8765", [], own)
    assert origin_allowed("http://127.0.0.1:8765", [], own)
    assert origin_allowed("http://[::1]:8765", [], own)
    assert not origin_allowed("http://localhost:3000", [], own)  # another local service
    assert not origin_allowed("https://evil.example", [], own)
    assert not origin_allowed("https://hub.example.com.evil.example", [], own)
    assert not origin_allowed("null", [], own)
    assert not origin_allowed("not an origin", [], own)
    assert origin_allowed("https://app.example.com", ["https://app.example.com/"], own)
    assert origin_allowed("HTTPS://APP.example.com:443", ["https://app.example.com"], own)
    assert not origin_allowed("http://app.example.com", ["https://app.example.com"], own)
    assert origin_allowed("https://anything.example", ["*"], own)
    assert origin_allowed("null", ["*"], own)


def test_normalize_origin() -> None:
    """Origins compare by scheme, host and non-default port; ws(s) maps to http(s)."""
    assert normalize_origin("wss://Hub.Example.com:443/path") == "https://hub.example.com"
    assert normalize_origin("http://localhost:80") == "http://localhost"
    assert normalize_origin("http://[::1]:8765") == "http://[::1]:8765"
    assert normalize_origin("ftp://x") is None
    assert normalize_origin("http://user@x") is None
    assert normalize_origin("http://x:99999") is None
    with pytest.raises(UsageError):
        own_origins("hub.example.com", port=1, tls=False)


def test_host_rules_guard_against_dns_rebinding() -> None:
    """Without auth only loopback names and the public host pass; with auth any host does."""
    for host in ("localhost", "localhost:8765", "127.0.0.1", "127.0.0.1:80", "[::1]", "[::1]:1"):
        assert host_allowed(host, None, auth_on=False), host
    assert host_allowed("LOCALHOST:8765", None, auth_on=False)
    assert host_allowed("hub.example.com", "hub.example.com", auth_on=False)
    assert host_allowed("hub.example.com:443", "Hub.Example.com", auth_on=False)
    for host in (
        "evil.example",
        "evil.example:8765",
        "localhost.evil.example",
        "hub.example.com.evil.example",
        "localhost:80:80",
        "localhost:http",
        "[::1]x",
        "user@localhost",
        "",
        None,
    ):
        assert not host_allowed(host, "hub.example.com", auth_on=False), host
    assert host_allowed("evil.example", None, auth_on=True)


def test_loopback_bind() -> None:
    """Loopback addresses bind without a key; the wildcard and other names do not."""
    for host in ("localhost", "127.0.0.1", "127.0.0.2", "::1", "[::1]"):
        assert is_loopback_bind(host), host
    for host in ("", "0.0.0.0", "::", "192.168.1.5", "hub.example.com", "localhost.evil"):
        assert not is_loopback_bind(host), host


def test_auth_and_limits_import_no_io() -> None:
    """`server/auth.py` and `server/limits.py` import no networking, event loop or file module."""
    forbidden = {"websockets", "anyio", "asyncio", "sqlite3", "socket", "os", "pathlib", "io"}
    root = Path(__file__).resolve().parents[2] / "server"
    for name in ("auth.py", "limits.py"):
        tree = sourcetree.parse(root / name)
        imported = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        } | {
            node.module.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
        }
        assert not imported & forbidden, (name, imported & forbidden)
        assert "server" not in imported, name  # nothing from the hub's shell
