"""The scripts people run by hand (the chaos harnesses) start from a checkout as the docs say."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("script", ["tests/chaos/run.py", "tests/chaos/steering.py"])
def test_a_chaos_script_finds_its_helpers(script: str) -> None:
    """`python tests/chaos/X.py --help` imports everything the run needs (the helpers in
    tests/support and the suite's conftest) and exits 0: moving a helper cannot break
    `make chaos` unnoticed."""
    result = subprocess.run(
        [sys.executable, str(ROOT / script), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "usage" in result.stdout
