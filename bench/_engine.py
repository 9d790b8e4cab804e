"""The engine code one run of `bench/hub.py` measures: a copy taken when the run starts.

Importing this module copies `sync/`, `server/` and `client/` to a temporary directory (removed
at exit), puts it first on `sys.path`, and sets `CONVSYNC_BENCH_CODE` so the server processes
(`bench/_hubproc.py`) import the same copy. Other work may change the working tree during a
long run; every process of the run still uses one version of the code. `CODE_VERSION` says
which: the commit, and the uncommitted changes if any. Import it before anything from the
engine, and add the repository to `sys.path` with `append` (not `insert(0, ...)`), so the
copy stays first.

`snapshot_at(rev)` makes a second copy, of the packages as they were at a git revision
(`bench/hub.py --baseline REV`): a server process started with `CONVSYNC_BENCH_CODE` set to it
runs that older code, so old and new hubs are measured in one run by the same client code.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["CODE", "CODE_VERSION", "ROOT", "snapshot_at"]

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sync", "server", "client")


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _snapshot() -> tuple[Path, str]:
    target = Path(tempfile.mkdtemp(prefix="convsync-bench-code-"))
    atexit.register(shutil.rmtree, target, True)
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, target / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    commit = _git("rev-parse", "--short", "HEAD").strip() or "unknown"
    diff = _git("diff", "HEAD", "--", *PACKAGES)
    changed = _git("diff", "HEAD", "--name-only", "--", *PACKAGES).split()
    untracked = _git("ls-files", "--others", "--exclude-standard", "--", *PACKAGES).split()
    version = f"git {commit}"
    if diff or untracked:
        names = ", ".join(f"`{name}`" for name in changed + untracked)
        digest = hashlib.sha256(diff.encode()).hexdigest()[:10]
        version += f" with uncommitted changes to {names} (diff sha256 {digest})"
    return target, version


def snapshot_at(rev: str) -> tuple[Path, str]:
    """Copy `sync/`, `server/` and `client/` as they were at git revision `rev` to a temporary
    directory (removed at exit); returns it and its version line (`git <short commit>`).

    Raises:
        ValueError: `rev` names no commit of this repository, or it has none of the packages.
    """
    commit = _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip()
    if not commit:
        raise ValueError(f"--baseline {rev!r}: no such commit in {ROOT}")
    target = Path(tempfile.mkdtemp(prefix="convsync-bench-baseline-"))
    atexit.register(shutil.rmtree, target, True)
    try:
        archive = subprocess.run(
            ["git", "archive", "--format=tar", commit, *PACKAGES],
            cwd=ROOT,
            capture_output=True,
            timeout=60,
            check=True,
        ).stdout
        subprocess.run(
            ["tar", "-x", "-C", str(target)],
            input=archive,
            capture_output=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ValueError(f"--baseline {rev!r}: cannot extract {PACKAGES} at {commit}") from exc
    missing = [package for package in PACKAGES if not (target / package / "__init__.py").exists()]
    if missing:
        raise ValueError(f"--baseline {rev!r}: {commit[:7]} has no {', '.join(missing)} package")
    short = _git("rev-parse", "--short", commit).strip()
    return target, f"git {short}"


if os.environ.get("CONVSYNC_BENCH_CODE"):  # a server process of a run: the run's copy
    CODE = Path(os.environ["CONVSYNC_BENCH_CODE"])
    CODE_VERSION = ""
else:
    CODE, CODE_VERSION = _snapshot()
    os.environ["CONVSYNC_BENCH_CODE"] = str(CODE)
while str(CODE) in sys.path:
    sys.path.remove(str(CODE))
sys.path.insert(0, str(CODE))
