"""Access tokens: verify a JWT against the hub's keys and say what its bearer may do.

How this works: a `KeyRing` holds the keys the hub trusts, each with the one algorithm its type
allows (an HS256 secret, or an ES256, RS256 or EdDSA public key), optionally named by a key id
(`kid`). `verify` checks a token's size before parsing anything, picks the key by the token's
`kid` header, refuses any algorithm but that key's, lets PyJWT check the signature only, and
then checks every claim itself against the `now` it is given (so the clock is a parameter and a
test can move it). The result is a frozen `Grant`: the principal (`sub`), its scopes, the
conversations it may open, and when it expires. The hub then asks the grant (`require`) before
each action.

Nothing here touches a socket, a file or the clock; key material comes in as bytes or key
objects (`KeyRing.from_files` takes a directory's file contents, not a path).

Every refusal raises `AuthError` with a code from the hub's error table: `unauthorized` (no
token, a bad one, an expired one, another audience, one not valid yet, one too large) or
`forbidden` (a valid token that does not allow the conversation or the action). Its detail is a
fixed short phrase and never quotes the token.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

from sync.errors import ConvsyncError, UsageError
from sync.text import has_control

__all__ = [
    "ANONYMOUS",
    "AUDIENCE",
    "EXPIRY_GRACE_S",
    "KINDS",
    "MAX_TOKEN_BYTES",
    "SCOPES",
    "AuthCode",
    "AuthError",
    "Grant",
    "Key",
    "KeyRing",
    "Kind",
    "Scope",
    "bearer_token",
    "mint_token",
    "verify",
    "verify_refresh",
]

Scope: TypeAlias = Literal["read", "write", "presence", "admin", "approve"]
Kind: TypeAlias = Literal["agent", "ui", "dashboard", "service"]
AuthCode: TypeAlias = Literal["unauthorized", "forbidden"]
Algorithm: TypeAlias = Literal["HS256", "ES256", "RS256", "EdDSA"]

SCOPES: Final[frozenset[str]] = frozenset({"read", "write", "presence", "admin", "approve"})
KINDS: Final[frozenset[str]] = frozenset({"agent", "ui", "dashboard", "service"})
AUDIENCE: Final = "convsync"
MAX_TOKEN_BYTES: Final = 8 * 1024
"""Tokens longer than this are refused before any parsing (a real one is well under 2 KiB)."""
EXPIRY_GRACE_S: Final = 30.0
"""Seconds after `exp` the hub still keeps a socket open, waiting for a refreshed token."""

MIN_SECRET_BYTES: Final = 32
MIN_RSA_BITS: Final = 2048
_MAX_SUB = 256
_MAX_NAME = 128
# Conversation ids are `[A-Za-z0-9._:-]{1,128}` (the hub's rule); a pattern is one of those,
# the same with a `*` at the end (a prefix), or `*` alone.
_PATTERN = re.compile(r"\*|[A-Za-z0-9._:-]{1,128}\*?")
_KID = re.compile(r"[A-Za-z0-9._-]{1,64}")

PublicKey: TypeAlias = (
    ec.EllipticCurvePublicKey | rsa.RSAPublicKey | ed25519.Ed25519PublicKey | ed448.Ed448PublicKey
)
PrivateKey: TypeAlias = (
    ec.EllipticCurvePrivateKey
    | rsa.RSAPrivateKey
    | ed25519.Ed25519PrivateKey
    | ed448.Ed448PrivateKey
)


class AuthError(ConvsyncError):
    """The hub refuses a token or an action; `code` is `unauthorized` or `forbidden`.

    Attributes:
        code: the error code to send (`error {code}`, close 4001 or 4003); same as `reason`.
        detail: a short lower-case phrase safe to send and to log; it never contains the token.
    """

    def __init__(self, code: AuthCode, detail: str) -> None:
        super().__init__(code, detail)
        self.code: AuthCode = code
        self.detail = detail


def _unauthorized(detail: str) -> AuthError:
    return AuthError("unauthorized", detail)


def _forbidden(detail: str) -> AuthError:
    return AuthError("forbidden", detail)


# -- keys -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    """One key the hub trusts, with the only algorithm a token checked by it may use.

    Build it with `Key.secret` or `Key.public_pem`; the algorithm follows from the key's type,
    never from a token.
    """

    algorithm: Algorithm
    material: bytes | PublicKey = field(repr=False)
    kid: str | None = None

    @classmethod
    def secret(cls, data: bytes | str, kid: str | None = None) -> Key:
        """An HS256 key from a shared secret (surrounding whitespace, as a file's newline, dropped).

        Raises:
            UsageError: the secret is shorter than 32 bytes, looks like a PEM key, or `kid` is
                not `[A-Za-z0-9._-]{1,64}`.
        """
        secret = _secret_bytes(data)
        return cls("HS256", secret, _checked_kid(kid))

    @classmethod
    def public_pem(cls, pem: bytes | str, kid: str | None = None) -> Key:
        """A key from a PEM public key: P-256 gives ES256, RSA RS256, Ed25519/Ed448 EdDSA.

        Raises:
            UsageError: the PEM is not a public key of one of those types (a private key is
                refused too: the hub never needs one), or the RSA key is under 2048 bits.
        """
        data = pem.encode() if isinstance(pem, str) else pem
        try:
            public = serialization.load_pem_public_key(data)
        except (ValueError, TypeError) as exc:
            raise UsageError("bad_key", "not a PEM public key") from exc
        if not isinstance(
            public,
            ec.EllipticCurvePublicKey
            | rsa.RSAPublicKey
            | ed25519.Ed25519PublicKey
            | ed448.Ed448PublicKey,
        ):
            raise UsageError("bad_key", "expected an EC P-256, RSA, Ed25519 or Ed448 public key")
        return cls(_algorithm_of(public), public, _checked_kid(kid))


def _secret_bytes(data: bytes | str) -> bytes:
    secret = (data.encode() if isinstance(data, str) else data).strip()
    if len(secret) < MIN_SECRET_BYTES:
        raise UsageError("bad_key", f"an HS256 secret needs at least {MIN_SECRET_BYTES} bytes")
    if secret.startswith(b"-----BEGIN"):
        raise UsageError("bad_key", "a PEM key is not a shared secret; use a public key file")
    return secret


def _checked_kid(kid: str | None) -> str | None:
    if kid is not None and _KID.fullmatch(kid) is None:
        raise UsageError("bad_key", "a key id is 1-64 of A-Z a-z 0-9 . _ -")
    return kid


def _algorithm_of(key: object) -> Algorithm:
    if isinstance(key, ec.EllipticCurvePublicKey | ec.EllipticCurvePrivateKey):
        if not isinstance(key.curve, ec.SECP256R1):
            raise UsageError("bad_key", "an EC key must be on P-256 (ES256)")
        return "ES256"
    if isinstance(key, rsa.RSAPublicKey | rsa.RSAPrivateKey):
        if key.key_size < MIN_RSA_BITS:
            raise UsageError("bad_key", f"an RSA key needs at least {MIN_RSA_BITS} bits")
        return "RS256"
    if isinstance(
        key,
        ed25519.Ed25519PublicKey
        | ed448.Ed448PublicKey
        | ed25519.Ed25519PrivateKey
        | ed448.Ed448PrivateKey,
    ):
        return "EdDSA"
    raise UsageError("bad_key", "expected an EC P-256, RSA, Ed25519 or Ed448 key")


@dataclass(frozen=True)
class KeyRing:
    """The keys a hub trusts at one moment; immutable, so rotating keys means a new ring.

    A token whose header names a `kid` is checked with that key only; a token without `kid`
    with the ring's unnamed key (the single `--auth-secret-file` or `--auth-public-key`).
    No key is ever tried in turn, and a key removed from the ring verifies nothing.
    """

    keys: tuple[Key, ...]

    def __post_init__(self) -> None:
        if not self.keys:
            raise UsageError("bad_key", "a key ring needs at least one key")
        kids = [key.kid for key in self.keys]
        if len(set(kids)) != len(kids):
            raise UsageError("bad_key", "two keys share a key id (or both have none)")

    @classmethod
    def of(cls, *keys: Key) -> KeyRing:
        """A ring of these keys (at most one without `kid`; `kid`s distinct)."""
        return cls(tuple(keys))

    @classmethod
    def from_files(cls, files: Mapping[str, bytes]) -> KeyRing:
        """A ring from a key directory's contents, given as `{file name: bytes}`.

        `<kid>.secret` is an HS256 secret and `<kid>.pem` a public key, both named by `kid`;
        other names (`k1.pem.old`, a README) are ignored, so renaming a file retires its key.

        Raises:
            UsageError: a key file is not a valid key, or no key file is present.
        """
        keys: list[Key] = []
        for name in sorted(files):
            stem, dot, suffix = name.rpartition(".")
            if not dot or suffix not in ("secret", "pem") or name.startswith("."):
                continue
            try:
                if suffix == "secret":
                    keys.append(Key.secret(files[name], kid=stem))
                else:
                    keys.append(Key.public_pem(files[name], kid=stem))
            except UsageError as exc:
                raise UsageError(exc.reason, f"{name}: {exc.message}") from exc
        if not keys:
            raise UsageError("bad_key", "no <kid>.secret or <kid>.pem file found")
        return cls(tuple(keys))

    @property
    def kids(self) -> tuple[str | None, ...]:
        """The key ids in this ring (`None` for the unnamed key), to log at start-up."""
        return tuple(key.kid for key in self.keys)

    def key_for(self, kid: str | None) -> Key | None:
        """The key that checks tokens with this `kid` header, or None."""
        for key in self.keys:
            if key.kid == kid:
                return key
        return None


# -- grants ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grant:
    """What one verified token allows; the hub keeps it per socket until a refresh replaces it.

    Attributes:
        sub: the principal (the token's `sub`); with `client`, the identity of a socket.
        scopes: granted scopes; `write` always comes with `read`.
        convs: conversation patterns: an id, a prefix ending in `*`, or `*` for all.
        kind: `agent`, `ui`, `dashboard` or `service`, if the token says (shown in presence).
        name: a display name, if the token gives one.
        exp: when the token expires (seconds since the epoch; `inf` for `ANONYMOUS`).
        kid: the key id that verified it (to log which key a client used), if any.
    """

    sub: str
    scopes: frozenset[Scope]
    convs: tuple[str, ...]
    kind: Kind | None = None
    name: str | None = None
    exp: float = math.inf
    kid: str | None = None

    def allows(self, conversation_id: str) -> bool:
        """Whether any pattern of `convs` matches this conversation id."""
        for pattern in self.convs:
            if pattern.endswith("*"):
                if conversation_id.startswith(pattern[:-1]):
                    return True
            elif conversation_id == pattern:
                return True
        return False

    # Properties rather than methods: `if grant.can_write:` on a method would always be true.
    @property
    def can_read(self) -> bool:
        """May subscribe to a conversation and read its log."""
        return "read" in self.scopes

    @property
    def can_write(self) -> bool:
        """May push records and drafts."""
        return "write" in self.scopes

    @property
    def can_presence(self) -> bool:
        """May publish a presence status (`presence` or `write`, SPEC §6)."""
        return "presence" in self.scopes or "write" in self.scopes

    @property
    def can_approve(self) -> bool:
        """May decide approvals (SPEC 12); `write` does not include it."""
        return "approve" in self.scopes

    @property
    def can_admin(self) -> bool:
        """May delete a conversation (`DELETE /v1/conversations/{id}`, SPEC 15); implies
        nothing else, and nothing else implies it."""
        return "admin" in self.scopes

    def require(self, conversation_id: str, scope: Scope) -> None:
        """Check this grant allows `scope` on the conversation, for `hello`, `push`, presence.

        `scope="presence"` is satisfied by `write` too.

        Raises:
            AuthError: `forbidden`, saying whether the conversation or the scope is missing.
        """
        if not self.allows(conversation_id):
            raise _forbidden("token does not allow this conversation")
        allowed = {
            "read": self.can_read,
            "write": self.can_write,
            "presence": self.can_presence,
            "admin": self.can_admin,
        }
        if not allowed[scope]:
            raise _forbidden(f"token lacks the {scope} scope")

    def expires_in(self, now: float) -> float:
        """Seconds until `exp` (0 once past it; `inf` for `ANONYMOUS`), for `welcome`/`auth_ok`."""
        return max(0.0, self.exp - now)

    @property
    def closes_at(self) -> float:
        """When the hub closes a socket holding this grant (4001) unless it is refreshed."""
        return self.exp + EXPIRY_GRACE_S

    @property
    def scope_list(self) -> list[str]:
        """The scopes in a stable order, as `welcome` lists them."""
        return sorted(self.scopes)


ANONYMOUS: Final = Grant(
    sub="anonymous", scopes=frozenset({"read", "write", "presence", "approve"}), convs=("*",)
)
"""The grant of every socket when the hub runs without a key (loopback or `--insecure`)."""


# -- verification ---------------------------------------------------------------------------

_DECODE_OPTIONS: Final[Any] = {  # `jwt.types.Options`, absent from older PyJWT
    # PyJWT checks the signature only; every claim is checked below against the given `now`.
    "verify_signature": True,
    "verify_exp": False,
    "verify_nbf": False,
    "verify_iat": False,
    "verify_aud": False,
    "verify_iss": False,
    "verify_sub": False,
    "verify_jti": False,
    "require": [],
}


def verify(
    token: object,
    keys: KeyRing,
    *,
    now: float,
    audience: str = AUDIENCE,
    leeway_s: float = 5.0,
    max_bytes: int = MAX_TOKEN_BYTES,
) -> Grant:
    """Verify a token and return what it grants; a pure function of its arguments.

    Args:
        token: the token as received (`hello.token`, `auth.token` or a bearer header); anything
            but a non-empty string is refused.
        keys: the keys the hub trusts now.
        now: the current time in seconds since the epoch.
        audience: the `aud` the token must carry (a string equal to it, or a list holding it).
        leeway_s: clock skew tolerated for `nbf` and `iat` of a token minted on another machine;
            `exp` gets none (the hub's grace after `exp` is `EXPIRY_GRACE_S`).
        max_bytes: tokens longer than this are refused before they are parsed.

    Raises:
        AuthError: `unauthorized`, for a missing, oversized, malformed, unsigned or wrongly
            signed token, an unknown `kid`, a claim missing or of the wrong form, another
            audience, or a token expired or not valid yet.
    """
    if not isinstance(token, str) or not token:
        raise _unauthorized("missing token")
    if len(token) > max_bytes:
        raise _unauthorized("token too large")
    if not token.isascii():
        # A JWT is base64url and dots; PyJWT would raise UnicodeEncodeError (not a
        # PyJWTError) on a lone surrogate, which escaped as a 1011 and a traceback.
        raise _unauthorized("malformed token")
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise _unauthorized("malformed token") from exc
    kid = header.get("kid")
    if kid is not None and not isinstance(kid, str):
        raise _unauthorized("malformed token")
    key = keys.key_for(kid)
    if key is None:
        raise _unauthorized("unknown key id" if kid is not None else "token needs a key id")
    # Pinned by the key, never taken from the token: refuses `none` and algorithm confusion
    # (an HS256 token signed with a public key's PEM as its secret) before any crypto runs.
    if header.get("alg") != key.algorithm:
        raise _unauthorized("algorithm not allowed for this key")
    try:
        claims = jwt.decode(
            token, key.material, algorithms=[key.algorithm], options=_DECODE_OPTIONS
        )
    except jwt.InvalidSignatureError as exc:
        raise _unauthorized("bad signature") from exc
    except jwt.PyJWTError as exc:
        raise _unauthorized("malformed token") from exc
    return _grant_from_claims(claims, key.kid, now=now, audience=audience, leeway_s=leeway_s)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None if there is none.

    The scheme is matched without regard to case; any other scheme counts as no token (the
    caller then looks in `hello.token`, or refuses with `unauthorized`).
    """
    if authorization is None:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def verify_refresh(
    current: Grant,
    token: object,
    keys: KeyRing,
    conversation_id: str,
    *,
    now: float,
    audience: str = AUDIENCE,
    leeway_s: float = 5.0,
    max_bytes: int = MAX_TOKEN_BYTES,
) -> Grant:
    """Verify a token sent in `auth` to replace `current` on a socket open on `conversation_id`.

    The new grant applies at once, a downgrade too (a token without `write` stops pushes).

    Raises:
        AuthError: `unauthorized` if the token is not valid (as `verify`), names another `sub`,
            does not allow the conversation, or lacks `read` (the socket is subscribed).
    """
    grant = verify(token, keys, now=now, audience=audience, leeway_s=leeway_s, max_bytes=max_bytes)
    if grant.sub != current.sub:
        raise _unauthorized("refreshed token is for another principal")
    if not grant.allows(conversation_id) or not grant.can_read:
        raise _unauthorized("refreshed token does not allow this conversation")
    return grant


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _grant_from_claims(
    claims: dict[str, Any], kid: str | None, *, now: float, audience: str, leeway_s: float
) -> Grant:
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub or len(sub) > _MAX_SUB or has_control(sub):
        raise _unauthorized("token needs a sub")
    if "exp" not in claims:
        raise _unauthorized("token needs an exp")
    exp = _number(claims["exp"])
    if exp is None:
        raise _unauthorized("malformed exp")
    if now >= exp:
        raise _unauthorized("token expired")
    for claim, what in (("nbf", "token not valid yet"), ("iat", "token issued in the future")):
        if claim in claims:
            moment = _number(claims[claim])
            if moment is None:
                raise _unauthorized(f"malformed {claim}")
            if moment > now + leeway_s:
                raise _unauthorized(what)
    aud = claims.get("aud")
    if not (aud == audience or (isinstance(aud, list) and audience in aud)):
        raise _unauthorized("wrong audience")
    scopes = _scopes(claims.get("scope", ""))
    convs = _patterns(claims.get("convs", []))
    kind = claims.get("kind")
    if kind is not None and kind not in KINDS:
        raise _unauthorized("unknown kind")
    name = claims.get("name")
    if name is not None and (
        not isinstance(name, str) or len(name) > _MAX_NAME or has_control(name)
    ):
        raise _unauthorized("malformed name")
    return Grant(sub=sub, scopes=scopes, convs=convs, kind=kind, name=name, exp=exp, kid=kid)


def _scopes(value: object) -> frozenset[Scope]:
    if not isinstance(value, str):
        raise _unauthorized("malformed scope")
    words = set(value.split())
    if not words <= SCOPES:
        raise _unauthorized("unknown scope")
    if "write" in words or "approve" in words:
        words.add("read")  # deciding an approval needs to see it
    return frozenset(words)  # type: ignore[arg-type]  # checked against SCOPES above


def _patterns(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _unauthorized("malformed convs")
    for pattern in value:
        # `*` only at the end: `sup*port` or `**` makes the whole token invalid.
        if not isinstance(pattern, str) or _PATTERN.fullmatch(pattern) is None:
            raise _unauthorized("bad conversation pattern")
    return tuple(value)


# -- minting --------------------------------------------------------------------------------


def mint_token(
    signing_key: bytes | str | PrivateKey,
    sub: str,
    scopes: Iterable[str],
    convs: Iterable[str],
    ttl_s: float,
    *,
    kind: str | None = None,
    name: str | None = None,
    kid: str | None = None,
    audience: str = AUDIENCE,
    now: float | None = None,
) -> str:
    """A signed token for `convsync token`, scripts and tests.

    Args:
        signing_key: an HS256 secret (as `Key.secret` takes it), or a private key whose type
            picks ES256, RS256 or EdDSA.
        sub: the principal.
        scopes: from `read`, `write`, `presence`, `admin`, `approve`.
        convs: conversation ids, prefixes ending in `*`, or `*`.
        ttl_s: seconds the token lives.
        kind: `agent`, `ui`, `dashboard` or `service`.
        name: a display name.
        kid: the key id to put in the header, when the hub has several keys.
        audience: the hub's audience.
        now: the issue time (default: the real clock).

    Raises:
        UsageError: any argument a hub would refuse; nothing is signed.
    """
    issued = time.time() if now is None else now
    scope_set = set(scopes)
    conv_list = list(convs)
    if not sub or len(sub) > _MAX_SUB or has_control(sub):
        raise UsageError("bad_token", "sub must be 1-256 printable characters")
    if not scope_set <= SCOPES:
        raise UsageError("bad_token", "scopes are read, write, presence, admin and approve")
    if any(_PATTERN.fullmatch(pattern) is None for pattern in conv_list):
        raise UsageError("bad_token", "a conversation pattern is an id, a prefix ending in *, or *")
    if not ttl_s > 0 or not math.isfinite(ttl_s):
        raise UsageError("bad_token", "ttl must be a positive number of seconds")
    if kind is not None and kind not in KINDS:
        raise UsageError("bad_token", "kind is agent, ui, dashboard or service")
    if name is not None and (len(name) > _MAX_NAME or has_control(name)):
        raise UsageError("bad_token", "name must be at most 128 printable characters")
    claims: dict[str, Any] = {
        "sub": sub,
        "aud": audience,
        "iat": int(issued),
        "exp": math.ceil(issued + ttl_s),
        "scope": " ".join(sorted(scope_set)),
        "convs": conv_list,
    }
    if kind is not None:
        claims["kind"] = kind
    if name is not None:
        claims["name"] = name
    headers = {"kid": _checked_kid(kid)} if kid is not None else None
    if isinstance(signing_key, bytes | str):
        return jwt.encode(claims, _secret_bytes(signing_key), algorithm="HS256", headers=headers)
    return jwt.encode(claims, signing_key, algorithm=_algorithm_of(signing_key), headers=headers)
