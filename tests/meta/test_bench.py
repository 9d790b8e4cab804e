"""The benchmark harness tells the truth: old code runs from its snapshot, bars judge right."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench._report import no_worse_row, ratio_row

ROOT = Path(__file__).resolve().parents[2]


def _git_head() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout")


def test_no_worse_fails_only_when_new_is_worse_in_every_repeat() -> None:
    """Issue 7's bar: a median on the worse side passes (within noise) unless every pair lost."""
    noisy = no_worse_row("rate", [90, 95, 105], [100, 100, 100], higher_is_better=True)
    assert noisy.passed is True and "within noise" in noisy.figure
    assert noisy.spread == "0.900-1.050"
    slower = no_worse_row("rate", [90, 95, 99], [100, 100, 100], higher_is_better=True)
    assert slower.passed is False and "worse in every repeat" in slower.figure
    later = no_worse_row("p50", [1.1, 1.2], [1.0, 1.0], higher_is_better=False)
    assert later.passed is False
    sooner = no_worse_row("p50", [0.9, 1.1], [1.0, 1.0], higher_is_better=False)
    assert sooner.passed is True and sooner.figure == "1.000"


def test_ratio_row_holds_the_ratio_of_medians_to_its_limit() -> None:
    """A ratio bar compares the medians' ratio and shows the per-repeat ratios as the spread."""
    row = ratio_row("p50", [1.2, 1.4, 1.3], [1.0, 1.0, 1.0], 1.3, "<= 1.3")
    assert row.figure == "1.300" and row.passed is True and row.spread == "1.200-1.400"
    assert ratio_row("p50", [1.4], [1.0], 1.3, "<= 1.3").passed is False


def test_baseline_snapshot_holds_the_revision_and_refuses_a_bad_one() -> None:
    """`snapshot_at` copies the packages as committed at a revision; an unknown one is refused."""
    head = _git_head()
    script = (
        "import sys, pathlib\n"
        f"sys.path.append({str(ROOT)!r})\n"
        "from bench._engine import snapshot_at\n"
        "path, version = snapshot_at('HEAD')\n"
        "print(path); print(version)\n"
        "try:\n"
        "    snapshot_at('no-such-revision')\n"
        "except ValueError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "CONVSYNC_BENCH_CODE"},
    )
    path, version, refusal = result.stdout.strip().splitlines()
    assert version == f"git {head}"
    assert "no-such-revision" in refusal and "no such commit" in refusal
    assert not Path(path).exists()  # removed when the process exited


def test_server_process_imports_the_engine_only_from_its_code_dir(tmp_path: Path) -> None:
    """A server process given `CONVSYNC_BENCH_CODE` imports sync/server/client from there only."""
    _git_head()
    archive = subprocess.run(
        ["git", "archive", "HEAD", "sync", "server", "client"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=archive, check=True, timeout=60)
    script = (
        "import json, sys\n"
        "import bench._hubproc as proc\n"
        "import client.replica, server.hub, sync\n"
        "print(json.dumps({'files': [server.hub.__file__, sync.__file__, "
        "client.replica.__file__], 'foreign': proc.foreign_modules()}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,  # the working tree's packages are importable from here: they must not win
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=dict(os.environ, CONVSYNC_BENCH_CODE=str(tmp_path), PYTHONPATH=str(ROOT)),
    )
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert all(file.startswith(str(tmp_path)) for file in answer["files"]), answer
    assert answer["foreign"] == []


def test_benches_find_the_test_helpers_in_support_or_else_tests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bench._support as support

    monkeypatch.setattr(support, "ROOT", tmp_path)
    monkeypatch.setattr(sys, "path", ["elsewhere"])
    (tmp_path / "tests").mkdir()
    assert support.use_test_helpers() == tmp_path / "tests"
    assert sys.path == [str(tmp_path), str(tmp_path / "tests"), "elsewhere"]
    (tmp_path / "tests" / "support").mkdir()
    assert support.use_test_helpers() == tmp_path / "tests" / "support"
    # Once each, the root first: a second call moves them up rather than adding copies.
    assert sys.path[:2] == [str(tmp_path), str(tmp_path / "tests" / "support")]
    assert sys.path.count(str(tmp_path)) == 1
