"""Token verification: every attack of the access-control issue, refused at the verifier."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from server.auth import (
    ANONYMOUS,
    EXPIRY_GRACE_S,
    MAX_TOKEN_BYTES,
    AuthError,
    Grant,
    Key,
    KeyRing,
    bearer_token,
    mint_token,
    verify,
    verify_refresh,
)
from sync.errors import UsageError

NOW = 1_800_000_000.0
SECRET = b"a-test-secret-that-is-at-least-32-bytes-long"
OTHER_SECRET = b"another-secret-of-at-least-thirty-two-bytes!!"

EC_PRIVATE = ec.generate_private_key(ec.SECP256R1())
RSA_PRIVATE = rsa.generate_private_key(public_exponent=65537, key_size=2048)
ED_PRIVATE = ed25519.Ed25519PrivateKey.generate()


def public_pem(private: Any) -> bytes:
    """The PEM of a private key's public half, as a hub operator would hold it."""
    key = private.public_key()
    return key.public_bytes(  # type: ignore[no-any-return]
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def b64(data: bytes) -> str:
    """Base64url without padding, as JWS segments are written."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def claims(**overrides: Any) -> dict[str, Any]:
    """Valid claims for `alice`, writing `support-1`, expiring in an hour."""
    base: dict[str, Any] = {
        "sub": "alice",
        "aud": "convsync",
        "iat": int(NOW),
        "exp": int(NOW) + 3600,
        "scope": "read write",
        "convs": ["support-1"],
    }
    base.update(overrides)
    return {name: value for name, value in base.items() if value is not None}


def hs256(payload: dict[str, Any], secret: bytes = SECRET, **headers: Any) -> str:
    """A token signed with a shared secret."""
    return jwt.encode(payload, secret, algorithm="HS256", headers=headers or None)


def refused(token: object, ring: KeyRing, now: float = NOW, **options: Any) -> AuthError:
    """The error `verify` raises for this token; fails the test if it verifies."""
    with pytest.raises(AuthError) as caught:
        verify(token, ring, now=now, **options)
    return caught.value


SECRET_RING = KeyRing.of(Key.secret(SECRET))
EC_RING = KeyRing.of(Key.public_pem(public_pem(EC_PRIVATE)))


# -- the attacks ----------------------------------------------------------------------------


def test_missing_token_is_unauthorized() -> None:
    """No token, an empty one or a non-string one is refused `unauthorized`."""
    for token in (None, "", b"bytes", 42, ["a.b.c"]):
        error = refused(token, SECRET_RING)
        assert (error.code, error.detail) == ("unauthorized", "missing token")


def test_token_signed_with_another_key_is_refused() -> None:
    """A token signed with a secret or private key the hub does not hold is refused."""
    assert refused(hs256(claims(), OTHER_SECRET), SECRET_RING).detail == "bad signature"
    stranger = ec.generate_private_key(ec.SECP256R1())
    token = mint_token(stranger, "alice", ["read"], ["*"], 60, now=NOW)
    assert refused(token, EC_RING).detail == "bad signature"


def test_alg_none_is_refused() -> None:
    """An unsigned token (`alg: none`) is refused whatever key the hub holds."""
    header = b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    token = f"{header}.{b64(json.dumps(claims()).encode())}."
    for ring in (SECRET_RING, EC_RING):
        error = refused(token, ring)
        assert (error.code, error.detail) == ("unauthorized", "algorithm not allowed for this key")


def forge_hs256_with_public_pem(pem: bytes, payload: dict[str, Any], kid: str | None) -> str:
    """An HS256 token whose HMAC secret is a public key's PEM (the confusion attack)."""
    header: dict[str, Any] = {"alg": "HS256", "typ": "JWT"}
    if kid is not None:
        header["kid"] = kid
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(payload).encode())}"
    signature = hmac.new(pem, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(signature)}"


def test_algorithm_confusion_is_refused() -> None:
    """An HS256 token signed with the hub's public key PEM as secret never verifies."""
    for private in (EC_PRIVATE, RSA_PRIVATE, ED_PRIVATE):
        pem = public_pem(private)
        ring = KeyRing.of(Key.public_pem(pem))
        error = refused(forge_hs256_with_public_pem(pem, claims(), None), ring)
        assert (error.code, error.detail) == ("unauthorized", "algorithm not allowed for this key")
    # A ring mixing a secret and a public key: the public key's kid still pins its algorithm.
    pem = public_pem(EC_PRIVATE)
    mixed = KeyRing.of(Key.secret(SECRET, kid="s1"), Key.public_pem(pem, kid="e1"))
    assert refused(forge_hs256_with_public_pem(pem, claims(), "e1"), mixed).code == "unauthorized"


def test_expired_token_is_refused() -> None:
    """A token is valid until just before `exp` and refused from `exp` on."""
    token = hs256(claims(exp=int(NOW) + 10))
    assert verify(token, SECRET_RING, now=NOW + 9.9).sub == "alice"
    error = refused(token, SECRET_RING, now=NOW + 10)
    assert (error.code, error.detail) == ("unauthorized", "token expired")


def test_token_not_valid_yet_is_refused() -> None:
    """A token whose `nbf` (or `iat`) is ahead of the clock beyond the leeway is refused."""
    early = hs256(claims(nbf=int(NOW) + 60))
    error = refused(early, SECRET_RING)
    assert (error.code, error.detail) == ("unauthorized", "token not valid yet")
    assert verify(early, SECRET_RING, now=NOW + 60).sub == "alice"
    assert verify(hs256(claims(nbf=int(NOW) + 3)), SECRET_RING, now=NOW).sub == "alice"
    assert refused(hs256(claims(iat=int(NOW) + 60)), SECRET_RING).detail == (
        "token issued in the future"
    )


def test_wrong_audience_is_refused() -> None:
    """`aud` must name the hub's audience; another one, or none, is refused."""
    for aud in ("other-app", ["other-app"], None, 7):
        error = refused(hs256(claims(aud=aud)), SECRET_RING)
        assert (error.code, error.detail) == ("unauthorized", "wrong audience")
    assert verify(hs256(claims(aud=["x", "convsync"])), SECRET_RING, now=NOW).sub == "alice"
    other = hs256(claims(aud="staging"))
    assert verify(other, SECRET_RING, now=NOW, audience="staging").sub == "alice"


def test_conversation_outside_convs_is_forbidden() -> None:
    """A valid token does not open a conversation its `convs` does not list."""
    grant = verify(hs256(claims(convs=["support-1", "sales-*"])), SECRET_RING, now=NOW)
    grant.require("support-1", "read")
    grant.require("sales-9", "write")
    with pytest.raises(AuthError) as caught:
        grant.require("support-2", "read")
    assert (caught.value.code, caught.value.detail) == (
        "forbidden",
        "token does not allow this conversation",
    )


def test_prefix_patterns_match_only_their_prefix() -> None:
    """`support-*` matches `support-1` but not `supportx`; `*` matches everything."""
    grant = verify(hs256(claims(convs=["support-*"])), SECRET_RING, now=NOW)
    assert grant.allows("support-1")
    assert grant.allows("support-")
    assert not grant.allows("supportx")
    assert not grant.allows("support")
    assert not grant.allows("xsupport-1")
    everything = verify(hs256(claims(convs=["*"])), SECRET_RING, now=NOW)
    assert everything.allows("anything") and everything.allows("support-1")
    none = verify(hs256(claims(convs=[])), SECRET_RING, now=NOW)
    assert not none.allows("support-1")


def test_star_anywhere_but_the_end_makes_the_token_invalid() -> None:
    """A pattern with `*` in the middle (or twice, or empty) invalidates the whole token."""
    for convs in (["sup*port"], ["support-1", "*-1"], ["**"], [""], ["a b*"], "support-*", [7]):
        error = refused(hs256(claims(convs=convs)), SECRET_RING)
        assert error.code == "unauthorized"
        assert error.detail in ("bad conversation pattern", "malformed convs")


def test_read_only_token_lacks_write() -> None:
    """A `read` token may subscribe but not push; `write` brings `read` and presence."""
    reader = verify(hs256(claims(scope="read")), SECRET_RING, now=NOW)
    assert reader.can_read and not reader.can_write and not reader.can_presence
    reader.require("support-1", "read")
    with pytest.raises(AuthError) as caught:
        reader.require("support-1", "write")
    assert (caught.value.code, caught.value.detail) == ("forbidden", "token lacks the write scope")
    writer = verify(hs256(claims(scope="write")), SECRET_RING, now=NOW)
    assert writer.scopes == {"read", "write"} and writer.can_presence
    watcher = verify(hs256(claims(scope="presence")), SECRET_RING, now=NOW)
    watcher.require("support-1", "presence")
    with pytest.raises(AuthError):
        watcher.require("support-1", "read")


def test_unknown_scope_or_kind_is_refused() -> None:
    """Scopes and kinds come from fixed lists; anything else makes the token invalid."""
    assert refused(hs256(claims(scope="read root")), SECRET_RING).detail == "unknown scope"
    assert refused(hs256(claims(scope=["read"])), SECRET_RING).detail == "malformed scope"
    assert refused(hs256(claims(kind="robot")), SECRET_RING).detail == "unknown kind"
    grant = verify(hs256(claims(kind="agent", name="Writer")), SECRET_RING, now=NOW)
    assert (grant.kind, grant.name) == ("agent", "Writer")


LINE_BREAKERS = ["\x85", "\u2028", "\u2029", "\u202e", "\u200b", "\x7f", "\n"]
"""Cc, Zl, Zp and Cf characters: each splits or disguises a log line (issue 27)."""


def test_a_sub_or_name_with_a_line_or_format_character_is_refused() -> None:
    """`sub` and `name` promise no control characters: NEL, LINE and PARAGRAPH SEPARATOR,
    a bidi override or a zero-width space (Cc, Zl, Zp, Cf) in either makes the token
    invalid, and `mint_token` refuses them; other non-ASCII text is taken."""
    for bad in LINE_BREAKERS:
        assert refused(hs256(claims(sub=f"alice{bad}INFO x")), SECRET_RING).detail == (
            "token needs a sub"
        ), repr(bad)
        assert refused(hs256(claims(name=f"W{bad}r")), SECRET_RING).detail == "malformed name"
        with pytest.raises(UsageError):
            mint_token(SECRET, f"a{bad}b", ["read"], ["*"], 60, now=NOW)
    grant = verify(hs256(claims(sub="zoë", name="Ünïcode 写")), SECRET_RING, now=NOW)
    assert (grant.sub, grant.name) == ("zoë", "Ünïcode 写")


def test_sub_and_exp_are_required() -> None:
    """A token without `sub` or `exp`, or with a malformed one, is refused."""
    assert refused(hs256(claims(sub=None)), SECRET_RING).detail == "token needs a sub"
    assert refused(hs256(claims(sub="")), SECRET_RING).detail == "token needs a sub"
    assert refused(hs256(claims(sub="a\nb")), SECRET_RING).detail == "token needs a sub"
    assert refused(hs256(claims(exp=None)), SECRET_RING).detail == "token needs an exp"
    assert refused(hs256(claims(exp="soon")), SECRET_RING).detail == "malformed exp"
    assert refused(hs256(claims(exp=True)), SECRET_RING).detail == "malformed exp"


def test_refresh_for_another_sub_is_refused() -> None:
    """A refreshed token must name the same principal and allow the same conversation."""
    current = verify(hs256(claims()), SECRET_RING, now=NOW)
    mallory = hs256(claims(sub="mallory"))
    with pytest.raises(AuthError) as caught:
        verify_refresh(current, mallory, SECRET_RING, "support-1", now=NOW)
    assert caught.value.code == "unauthorized"
    assert caught.value.detail == "refreshed token is for another principal"
    elsewhere = hs256(claims(convs=["sales-1"]))
    with pytest.raises(AuthError) as caught:
        verify_refresh(current, elsewhere, SECRET_RING, "support-1", now=NOW)
    assert caught.value.code == "unauthorized"


def test_refresh_applies_a_downgrade_at_once() -> None:
    """A valid refresh returns the new grant, with its later `exp` and fewer scopes."""
    current = verify(hs256(claims()), SECRET_RING, now=NOW)
    later = hs256(claims(scope="read", exp=int(NOW) + 7200))
    grant = verify_refresh(current, later, SECRET_RING, "support-1", now=NOW + 3000)
    assert not grant.can_write and grant.exp == NOW + 7200
    assert grant.expires_in(NOW + 3000) == 4200
    expired = hs256(claims(exp=int(NOW) + 10))
    with pytest.raises(AuthError):
        verify_refresh(current, expired, SECRET_RING, "support-1", now=NOW + 10)


def test_a_token_that_is_not_ascii_is_malformed() -> None:
    """A JWT is base64url and dots: a lone surrogate (which PyJWT cannot encode, and which
    closed a summary feed 1011 with a traceback) or any other non-ASCII character anywhere in
    it is refused `unauthorized`, "malformed token" (issue 27)."""
    good = hs256(claims())
    head, body, signature = good.split(".")
    for token in ("\ud800", head + "\ud800." + body + "." + signature, good + "\ud800", good + "é"):
        error = refused(token, SECRET_RING)
        assert (error.code, error.detail) == ("unauthorized", "malformed token")


def test_huge_token_is_refused_before_parsing() -> None:
    """A 1 MiB token is refused as too large, even one correctly signed."""
    garbage = "x" * (1 << 20)
    assert refused(garbage, SECRET_RING).detail == "token too large"
    signed = hs256(claims(name="n" * (1 << 20)))
    assert refused(signed, SECRET_RING).detail == "token too large"
    # The cap alone refuses it: the same token passes the signature check with a larger cap
    # (and then fails on its oversized name, a claim check that comes later).
    assert refused(signed, SECRET_RING, max_bytes=2 << 20).detail == "malformed name"
    just_fits = hs256(claims())
    assert len(just_fits) < MAX_TOKEN_BYTES
    assert verify(just_fits, SECRET_RING, now=NOW, max_bytes=len(just_fits)).sub == "alice"


def test_key_rotation_by_kid() -> None:
    """Two keys active at once both verify; once one is removed its tokens no longer do."""
    old, new = Key.secret(SECRET, kid="2026-01"), Key.public_pem(public_pem(EC_PRIVATE), kid="k2")
    both = KeyRing.of(old, new)
    by_old = mint_token(SECRET, "alice", ["read"], ["*"], 600, kid="2026-01", now=NOW)
    by_new = mint_token(EC_PRIVATE, "alice", ["read"], ["*"], 600, kid="k2", now=NOW)
    assert verify(by_old, both, now=NOW).kid == "2026-01"
    assert verify(by_new, both, now=NOW).kid == "k2"
    rotated = KeyRing.of(new)
    error = refused(by_old, rotated)
    assert (error.code, error.detail) == ("unauthorized", "unknown key id")
    assert verify(by_new, rotated, now=NOW).sub == "alice"
    # A kid names exactly one key: a token claiming the new kid but signed by the old key fails.
    liar = mint_token(SECRET, "alice", ["read"], ["*"], 600, kid="k2", now=NOW)
    assert refused(liar, both).code == "unauthorized"
    # No kid: only the unnamed key is used, never each key in turn.
    assert refused(hs256(claims()), both).detail == "token needs a key id"


def test_each_public_key_type_verifies_its_own_algorithm() -> None:
    """ES256, RS256 and EdDSA tokens verify against their public keys."""
    for private, algorithm in (
        (EC_PRIVATE, "ES256"),
        (RSA_PRIVATE, "RS256"),
        (ED_PRIVATE, "EdDSA"),
    ):
        key = Key.public_pem(public_pem(private))
        assert key.algorithm == algorithm
        token = mint_token(private, "svc", ["read", "write"], ["a*"], 60, kind="service", now=NOW)
        assert jwt.get_unverified_header(token)["alg"] == algorithm
        grant = verify(token, KeyRing.of(key), now=NOW)
        assert (grant.sub, grant.kind, grant.can_write, grant.allows("abc")) == (
            "svc",
            "service",
            True,
            True,
        )


def test_errors_never_contain_the_token() -> None:
    """Neither an error's text nor the exception it chains quotes the token."""
    tokens = [
        hs256(claims(), OTHER_SECRET),
        hs256(claims(exp=int(NOW) - 1)),
        hs256(claims(aud="x")),
        hs256(claims(convs=["a*b"])),
        hs256(claims(), kid="nope"),
        "not.a.token",
        "x" * 10_000,
    ]
    for token in tokens:
        error = refused(token, SECRET_RING)
        texts = [str(error), error.detail, repr(error), str(error.__cause__)]
        for part in token.split("."):
            if len(part) >= 8:
                assert all(part not in text for text in texts), (error.detail, part)


def test_grant_deadlines_and_anonymous() -> None:
    """`expires_in` counts down to 0, the socket closes `EXPIRY_GRACE_S` later; anonymous is all."""
    grant = verify(hs256(claims()), SECRET_RING, now=NOW)
    assert grant.expires_in(NOW) == 3600
    assert grant.expires_in(NOW + 4000) == 0
    assert grant.closes_at == NOW + 3600 + EXPIRY_GRACE_S
    assert grant.scope_list == ["read", "write"]
    ANONYMOUS.require("any-conversation", "write")
    assert ANONYMOUS.sub == "anonymous" and ANONYMOUS.can_presence
    assert isinstance(ANONYMOUS, Grant)


def test_bearer_token_from_an_authorization_header() -> None:
    """Only `Bearer <token>` yields a token; other schemes or an empty value yield none."""
    assert bearer_token("Bearer abc.def.ghi") == "abc.def.ghi"
    assert bearer_token("bearer  abc.def.ghi ") == "abc.def.ghi"
    for header in (None, "", "Bearer", "Bearer   ", "Basic dXNlcjpwYXNz", "abc.def.ghi"):
        assert bearer_token(header) is None, header


# -- keys and minting -----------------------------------------------------------------------


def test_bad_keys_are_refused_when_loaded() -> None:
    """Short secrets, private or unsupported keys and duplicate kids are usage errors."""
    with pytest.raises(UsageError, match="32 bytes"):
        Key.secret(b"short")
    with pytest.raises(UsageError, match="PEM"):
        Key.secret(public_pem(EC_PRIVATE))
    private_pem = EC_PRIVATE.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    with pytest.raises(UsageError, match="public key"):
        Key.public_pem(private_pem)
    with pytest.raises(UsageError, match="P-256"):
        Key.public_pem(public_pem(ec.generate_private_key(ec.SECP384R1())))
    with pytest.raises(UsageError, match="2048"):
        Key.public_pem(public_pem(rsa.generate_private_key(public_exponent=65537, key_size=1024)))
    with pytest.raises(UsageError, match="key id"):
        Key.secret(SECRET, kid="../etc/passwd")
    with pytest.raises(UsageError, match="share a key id"):
        KeyRing.of(Key.secret(SECRET), Key.secret(OTHER_SECRET))
    with pytest.raises(UsageError):
        KeyRing.of()


def test_key_ring_from_directory_contents() -> None:
    """`<kid>.secret` and `<kid>.pem` files become keys; other names are ignored."""
    files = {
        "team.secret": SECRET + b"\n",
        "edge.pem": public_pem(ED_PRIVATE),
        "retired.pem.old": public_pem(EC_PRIVATE),
        "README": b"keys for the hub",
    }
    ring = KeyRing.from_files(files)
    assert sorted(str(kid) for kid in ring.kids) == ["edge", "team"]
    token = mint_token(SECRET + b"\n", "bob", ["read"], ["*"], 60, kid="team", now=NOW)
    assert verify(token, ring, now=NOW).sub == "bob"
    with pytest.raises(UsageError, match=r"bad\.pem"):
        KeyRing.from_files({"bad.pem": b"not a key"})
    with pytest.raises(UsageError, match="no <kid>"):
        KeyRing.from_files({"README": b""})


def test_mint_token_refuses_what_a_hub_would_refuse() -> None:
    """`mint_token` signs only tokens a hub could accept."""
    bad_calls: list[dict[str, Any]] = [
        {"sub": ""},
        {"scopes": ["root"]},
        {"convs": ["a*b"]},
        {"ttl_s": 0},
        {"ttl_s": float("nan")},
        {"kind": "robot"},
        {"kid": "a/b"},
    ]
    for bad in bad_calls:
        args: dict[str, Any] = {"sub": "a", "scopes": ["read"], "convs": ["*"], "ttl_s": 60}
        args.update(bad)
        with pytest.raises(UsageError):
            mint_token(SECRET, now=NOW, **args)
    token = mint_token(SECRET, "a", ["write"], ["x-*"], 0.5, kind="ui", now=NOW)
    grant = verify(token, SECRET_RING, now=NOW)
    assert grant.exp > NOW and grant.can_read and grant.kind == "ui"
