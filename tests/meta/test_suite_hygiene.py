"""The suite's own safety nets: parsing project files whatever ran before, and a session that
fails when a task's exception was never retrieved (see docs/design.md, "The suite passes
every time")."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
SUPPORT = TESTS / "support"

# The order that failed issue 25: a test leaves a task whose exception nobody retrieved (an
# asyncpg release timing out, logged with its traceback by a formatting handler, as pytest's
# are), then a test parses a project file while that task is still uncollected.
_TRIGGER = """
import asyncio, gc, logging, sys
from pathlib import Path
logging.basicConfig(stream=sys.stdout)

async def fails():
    raise TimeoutError

async def leave_a_task_behind():
    task = asyncio.get_running_loop().create_task(fails())
    await asyncio.sleep(0)
    task.cycle = task  # freed by the collector only, its exception never read

parse = {parse}
for path in sorted(Path({root!r}).glob("*/*.py")):
    asyncio.run(leave_a_task_behind())
    source = path.read_text()
    gc.set_threshold(1)  # a collection inside the parse, as a long suite gets by chance
    parse(source, str(path))
    gc.set_threshold(700)
print("every file parsed")
"""


def _run_trigger(tmp_path: Path, parse: str) -> subprocess.CompletedProcess[str]:
    # A file, not `-c`: the logged traceback then has source lines, whose carets it parses.
    script = tmp_path / "trigger.py"
    script.write_text(_TRIGGER.format(parse=parse, root=str(ROOT)))
    env = {**os.environ, "PYTHONPATH": str(SUPPORT)}
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
    )


def test_project_files_parse_after_a_finalizer_that_logs_a_traceback(tmp_path: Path) -> None:
    """`sourcetree.parse` parses every project file even when the collector frees a failed,
    unretrieved task during it (whose log line parses source to draw its traceback). On the
    CPython the bug is in (3.11 through 3.11.7, gh-106905) the same order with a plain
    `ast.parse` fails with the issue's SystemError, so the order does reproduce it."""
    fixed = _run_trigger(tmp_path, "__import__('sourcetree').parse_source")
    assert fixed.returncode == 0, fixed.stderr
    assert "every file parsed" in fixed.stdout
    assert "Task exception was never retrieved" in fixed.stdout  # the finalizer did run
    if (3, 11) <= sys.version_info[:3] <= (3, 11, 7):
        plain = _run_trigger(tmp_path, "__import__('ast').parse")
        assert plain.returncode != 0
        assert "AST constructor recursion depth mismatch" in plain.stderr


def _session(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    """A pytest session of its own on one test file, with only the `unretrieved` plugin."""
    (tmp_path / "test_one.py").write_text(textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": str(SUPPORT)}
    options = ["-q", "-p", "unretrieved", "-p", "no:cacheprovider", "-c", os.devnull]
    return subprocess.run(
        [sys.executable, "-m", "pytest", *options, "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


LEAVES_A_TASK = """
    import asyncio

    async def fails():
        raise TimeoutError("nobody reads me")

    def test_leaves_a_failed_task_behind():
        async def main():
            task = asyncio.get_running_loop().create_task(fails())
            await asyncio.sleep(0)
            task.cycle = task
        asyncio.run(main())
"""

AWAITS_ITS_TASK = """
    import asyncio

    async def fails():
        raise TimeoutError("read")

    def test_awaits_its_task():
        async def main():
            task = asyncio.get_running_loop().create_task(fails())
            try:
                await task
            except TimeoutError:
                pass
        asyncio.run(main())
"""


@pytest.mark.parametrize(("body", "fails"), [(LEAVES_A_TASK, True), (AWAITS_ITS_TASK, False)])
def test_a_session_fails_when_a_task_exception_was_never_retrieved(
    tmp_path: Path, body: str, fails: bool
) -> None:
    """Its only test passes, yet the session fails and names the task and the test when a
    task's exception was never retrieved; a test that reads its task's exception passes."""
    result = _session(tmp_path, body)
    assert "1 passed" in result.stdout, result.stdout
    if fails:
        assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout
        assert "exceptions nobody retrieved" in result.stdout
        assert "TimeoutError('nobody reads me')" in result.stdout
    else:
        assert result.returncode == pytest.ExitCode.OK, result.stdout
        assert "exceptions nobody retrieved" not in result.stdout
