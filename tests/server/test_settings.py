"""Every hub setting and `CONVSYNC_*` variable is checked, with its range in the error."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from cliproc import convsync

from server.config import _NUMBERS, RULED, HubConfig
from sync import UsageError


def test_every_setting_has_a_rule() -> None:
    """A new `HubConfig` field cannot slip in unchecked."""
    assert {field.name for field in dataclasses.fields(HubConfig)} == RULED


def _below(name: str) -> float:
    kind, bound, inclusive, _ = _NUMBERS[name]
    if kind is int:
        return int(bound) - 1
    return bound - 0.5 if inclusive else bound


@pytest.mark.parametrize("name", sorted(_NUMBERS))
def test_a_number_out_of_range_is_refused_naming_the_range(name: str) -> None:
    """Below the bound, not finite, a bool or a string: refused, naming field, value and
    range; the bound itself (when it is allowed) is taken."""
    kind, bound, inclusive, unit = _NUMBERS[name]
    for bad in (_below(name), math.nan, math.inf, True, "5"):
        with pytest.raises(UsageError) as caught:
            HubConfig(**{name: bad})  # type: ignore[arg-type]
        message = caught.value.message
        assert message.startswith(f"{name} must be ")
        assert f"{'at least' if inclusive else 'more than'} {bound:g}" in message
        assert unit in message and f"(got {bad!r})" in message
        assert caught.value.reason == "bad_setting"
    if inclusive and not name.startswith("heartbeat"):
        assert getattr(HubConfig(**{name: kind(bound)}), name) == bound  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"strict_pairing": "yes"}, "strict_pairing must be true or false (got 'yes')"),
        ({"compression": "gzip"}, "compression must be off or 'deflate' (got 'gzip')"),
        ({"bus": "http://r"}, "bus must be off or a redis:// or rediss:// URL"),
        ({"public_url": "hub.example.com"}, "public_url must be an http(s):// or ws(s)://"),
        ({"allow_origin": ("https://ok.example", "nope")}, "'nope' is not '*' or an origin"),
        ({"audience": ""}, "audience must not be empty"),
        ({"metrics_token": ""}, "metrics_token must not be empty"),
        ({"tls_cert": "cert.pem"}, "tls_cert and tls_key go together"),
        ({"heartbeat_interval": 3.0}, "heartbeat_ttl must be at least twice heartbeat_interval"),
    ],
)
def test_other_bad_settings_are_refused(settings: dict[str, object], says: str) -> None:
    with pytest.raises(UsageError) as caught:
        HubConfig(**settings)  # type: ignore[arg-type]
    assert says in caught.value.message


@pytest.mark.parametrize(
    ("variable", "raw", "says"),
    [
        (
            "PING_INTERVAL",
            "0",
            "ping_interval must be off (none) or a number of seconds, at least 1",
        ),
        ("IDLE_UNLOAD", "-1", "idle_unload must be a number of seconds, at least 0"),
        (
            "MAX_CONNECTIONS",
            "0",
            "max_connections must be a whole number of connections, at least 1",
        ),
        ("MAX_CONNECTIONS", "lots", "max_connections must be a whole number of connections"),
        ("RATE", "nan", "rate must be a number of messages per second, more than 0"),
        ("HUB_REBASE", "sometimes", "hub_rebase must be true or false"),
    ],
)
def test_a_bad_variable_is_named_with_its_value_and_range(
    variable: str, raw: str, says: str
) -> None:
    with pytest.raises(UsageError) as caught:
        HubConfig.from_env({f"CONVSYNC_{variable}": raw})
    assert caught.value.message.startswith(f"CONVSYNC_{variable}={raw!r}")
    assert says in caught.value.message


def test_variables_in_range_are_taken() -> None:
    config = HubConfig.from_env(
        {"CONVSYNC_PING_INTERVAL": "off", "CONVSYNC_IDLE_UNLOAD": "0", "CONVSYNC_RATE": "0.5"}
    )
    assert (config.ping_interval, config.idle_unload, config.rate) == (None, 0, 0.5)
    assert HubConfig.from_env({"CONVSYNC_PING_INTERVAL": "1"}).ping_interval == 1.0


# ---------------------------------------------------------------------- the command line


def test_serve_refuses_a_zero_ping_interval_and_creates_nothing(tmp_path: Path) -> None:
    """`CONVSYNC_PING_INTERVAL=0` (which made the hub ping in a busy loop) exits 2 with one
    line naming the variable and the range, before any file is made."""
    db = tmp_path / "hub.db"
    result = convsync("serve", "--db", str(db), "--port", "0", env={"CONVSYNC_PING_INTERVAL": "0"})
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.count("\n") == 1
    assert "CONVSYNC_PING_INTERVAL='0'" in result.stderr and "at least 1" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"CONVSYNC_MAX_CONNECTIONS": "0"}, "CONVSYNC_MAX_CONNECTIONS='0': max_connections must"),
        ({"CONVSYNC_IDLE_UNLOAD": "-5"}, "CONVSYNC_IDLE_UNLOAD='-5': idle_unload must"),
        ({"CONVSYNC_HOST": ""}, "CONVSYNC_HOST is empty"),
        ({"CONVSYNC_PORT": "99999"}, "CONVSYNC_PORT: port 99999 is not in 0..65535"),
        ({"CONVSYNC_AUTH_SECRET": "tiny"}, "CONVSYNC_AUTH_SECRET: an HS256 secret needs at least"),
    ],
)
def test_serve_refuses_bad_variables_in_one_line(
    tmp_path: Path, env: dict[str, str], says: str
) -> None:
    env = {"CONVSYNC_PORT": "0", **env}
    result = convsync("serve", "--db", str(tmp_path / "hub.db"), env=env)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.count("\n") == 1 and says in result.stderr
    assert "tiny" not in result.stderr  # a secret is never echoed
    assert list(tmp_path.iterdir()) == []


def test_a_bad_timeout_scale_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    result = convsync(
        "demo", "--fast", "--db", str(tmp_path / "d.db"), env={"CONVSYNC_TIMEOUT_SCALE": "x"}
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "convsync: error: CONVSYNC_TIMEOUT_SCALE='x' is not a number more than 0"
    )
