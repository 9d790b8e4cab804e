"""The attacks of issue 27, in their quick form: each meets its refusal and its memory bar."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCALE = float(os.environ.get("CONVSYNC_TIMEOUT_SCALE", "1"))


def test_the_attacks_of_issue_27_are_refused_within_their_memory_bars() -> None:
    """`bench/attacks.py --quick --check` against a hub process on loopback (what `make
    attack` runs in full): big tool names closed 1008, big authors' opens refused, huge
    summary hellos refused by their header, a joining UI's drafts in frames of at most 1 MiB,
    idle feeds costing no CPU, and each attack's peak RSS within 2 x idle + the caps it may
    fill."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "attacks.py"), "--quick", "--check"],
        capture_output=True, text=True, timeout=180 * SCALE, env=env, cwd=ROOT, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert result.stdout.count("| PASS |") == 5, result.stdout
