"""A pytest plugin: the session fails when asyncio reports an exception nobody retrieved.

A task (or future) freed with an exception nobody awaited is reported by its finalizer
through the loop's exception handler, which logs "Task exception was never retrieved" on the
`asyncio` logger. That is not a warning and not raised anywhere, so `filterwarnings = error`
never sees it and the run passes with a task the test left behind. This plugin records each
such report (with the test running when it came: the task is freed when the collector gets
to it, which may be a test or two later), collects garbage once at the end of the session so
what is left is reported too, prints them, and makes the session fail.

`tests/conftest.py` loads it; a session of its own loads it with `-p unretrieved`.
"""

from __future__ import annotations

import gc
import logging

import pytest

_REPORTS = ("Task exception was never retrieved", "Future exception was never retrieved")


class _Unretrieved(logging.Handler):
    """Keeps a line for each report of an exception nobody retrieved."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.found: list[str] = []
        self.running = "(between tests)"

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if not message.startswith(_REPORTS):
            return
        exc = record.exc_info[1] if record.exc_info else None
        # The exception's repr only: the record's own formatting is left to the other
        # handlers (formatting a traceback parses source, see tests/support/sourcetree.py).
        self.found.append(f"{message}: {exc!r}, reported during {self.running}")


_handler = _Unretrieved()


def pytest_configure(config: pytest.Config) -> None:
    logging.getLogger("asyncio").addHandler(_handler)


def pytest_unconfigure(config: pytest.Config) -> None:
    logging.getLogger("asyncio").removeHandler(_handler)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> object:
    _handler.running = item.nodeid
    yield
    _handler.running = "(between tests)"


def pytest_sessionfinish(session: pytest.Session) -> None:
    _handler.running = "(the end of the session)"
    gc.collect()  # a task still waiting in a reference cycle reports now
    if _handler.found and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _handler.found:
        terminalreporter.section("exceptions nobody retrieved (the session fails)", red=True)
        for line in _handler.found:
            terminalreporter.line(line)
