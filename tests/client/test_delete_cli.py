"""`convsync delete` against a running `convsync serve` with auth (SPEC 15): clear errors, the
admin scope, the dry run of `--idle`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cliproc import Running

from client.cli import main
from server.auth import mint_token

SECRET = "s3cret-for-tests-only-0123456789abcdef"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def token(scope: str, convs: str = "*") -> str:
    return mint_token(SECRET.encode(), "ops", scope.split(), [convs], 300)


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A `convsync serve` with auth, on port 0 and a SQLite file."""
    where = tmp_path_factory.mktemp("hub")
    secret = where / "secret"
    secret.write_text(SECRET)
    proc = Running(
        "serve", "--db", str(where / "hub.db"), "--port", "0", "--auth-secret-file", str(secret)
    )
    try:
        yield proc.url()
    finally:
        proc.stop()


def test_delete_removes_a_conversation_and_says_so(
    capsys: pytest.CaptureFixture[str], url: str, tmp_path: Path
) -> None:
    """`delete ID` with a token of `convsync token --scope admin` prints `deleted ID` and the
    conversation is gone: a second delete, or an id never written, exits 1 naming it."""
    writer = token("write")
    assert run(capsys, "send", "cli.1", "a secret", "--url", url, "--token", writer)[0] == 0
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    code, admin, _ = run(
        capsys, "token", "--secret-file", str(secret), "--sub", "ops", "--scope", "admin"
    )
    assert code == 0
    code, out, err = run(capsys, "delete", "cli.1", "--url", url, "--token", admin.strip())
    assert (code, out, err) == (0, "deleted\tcli.1\n", "")
    code, out, err = run(capsys, "export", "cli.1", "--url", url, "--token", token("read"))
    assert code == 1 and "no conversation 'cli.1'" in err
    code, out, err = run(capsys, "delete", "cli.1", "nope", "--url", url, "--token", token("admin"))
    assert code == 1 and out == ""
    assert err.splitlines() == [
        "convsync: the hub has no conversation 'cli.1'",
        "convsync: the hub has no conversation 'nope'",
    ]


def test_delete_without_the_admin_scope_says_what_is_missing(
    capsys: pytest.CaptureFixture[str], url: str
) -> None:
    """No token, a token without `admin`, or one for other conversations: exit 1 with one
    line saying why, and nothing is deleted."""
    writer = token("write")
    assert run(capsys, "send", "cli.2", "stays", "--url", url, "--token", writer)[0] == 0
    code, _, err = run(capsys, "delete", "cli.2", "--url", url)
    assert code == 1 and "wants a valid token" in err and len(err.splitlines()) == 1
    code, _, err = run(capsys, "delete", "cli.2", "--url", url, "--token", writer)
    assert code == 1 and "token lacks the admin scope" in err and "needs scope admin" in err
    code, _, err = run(capsys, "delete", "cli.2", "--url", url, "--token", token("admin", "x*"))
    assert code == 1 and "does not allow this conversation" in err
    code, out, _ = run(capsys, "export", "cli.2", "--url", url, "--token", token("read"))
    assert code == 0 and "stays" in out


def test_delete_refuses_a_bad_command_line(capsys: pytest.CaptureFixture[str], url: str) -> None:
    """Ids and `--idle` are one or the other, `--dry-run` goes with `--idle`, days are a
    positive number: exit 2 with what to fix."""
    for argv, says in [
        ((), "give conversation ids or --idle DAYS"),
        (("a", "--idle", "3"), "give conversation ids or --idle DAYS"),
        (("a", "--dry-run"), "--dry-run goes with --idle DAYS"),
        (("--idle", "0"), "is not a number of days"),
        (("--idle", "soon"), "is not a number of days"),
        (("bad id!",), "bad id"),
    ]:
        code, out, err = run(capsys, "delete", *argv, "--url", url, "--token", token("admin"))
        assert code == 2 and out == "", argv
        assert says in err, (argv, err)


def test_delete_idle_dry_run_lists_and_changes_nothing(
    capsys: pytest.CaptureFixture[str], url: str, tmp_path: Path
) -> None:
    """`delete --idle DAYS --dry-run` lists what would go (nothing written today is idle for
    a day) and deletes nothing; the same without the dry run deletes nothing either."""
    writer = token("write")
    assert run(capsys, "send", "cli.3", "fresh", "--url", url, "--token", writer)[0] == 0
    admin = ["--url", url, "--token", token("admin")]
    code, out, err = run(capsys, "delete", "--idle", "1", "--dry-run", *admin)
    assert (code, out) == (0, "") and "0 idle conversation(s) would be deleted" in err
    code, out, err = run(capsys, "delete", "--idle", "1", *admin)
    assert (code, out) == (0, "") and "0 idle conversation(s) deleted" in err
    code, out, _ = run(capsys, "export", "cli.3", "--url", url, "--token", token("read"))
    assert code == 0 and "fresh" in out
