"""The hub's parts each use one async API, the one their docstring names (issue 24): the hub
once mixed asyncio and anyio in one class. `server/background.py` is the one bridge: an asyncio
task that runs the hub's anyio task group."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from sourcetree import parse

SERVER = Path(__file__).resolve().parents[2] / "server"
PARTS = {
    "hub.py": "anyio",
    "sockets.py": "anyio",
    "http.py": "none",
    "rooms.py": "asyncio",
    "timer.py": "anyio",
    "follow.py": "anyio",
    "leases.py": "anyio",
    "retention.py": "anyio",
    "connection.py": "none",
    "mux.py": "asyncio",
    "background.py": "asyncio",
}
BRIDGES = {"background.py"}
"""Modules allowed both: they run one API's code from the other's."""
MAX_LINES = 600


def _apis(tree: ast.Module) -> set[str]:
    """The async libraries a module imports (`websockets.asyncio` is websockets' own)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            if top in ("asyncio", "anyio"):
                found.add(top)
    return found


@pytest.mark.parametrize("name", sorted(PARTS))
def test_each_part_of_the_hub_uses_the_async_api_its_docstring_names(name: str) -> None:
    tree = parse(SERVER / name)
    docstring = ast.get_docstring(tree) or ""
    said = re.search(r"Async API: (\w+)", docstring)
    assert said is not None, f"{name} does not say which async API it uses"
    wanted = PARTS[name]
    assert said.group(1) == wanted, (name, said.group(1))
    used = _apis(tree)
    if name in BRIDGES:
        assert wanted in used, (name, used)
    elif wanted == "none":
        assert used <= {"asyncio"}, (name, used)  # asyncio's types only, for its callbacks
    else:
        assert used == {wanted}, (name, used)


@pytest.mark.parametrize("name", sorted(PARTS))
def test_each_part_of_the_hub_stays_short(name: str) -> None:
    lines = (SERVER / name).read_text().count("\n")
    assert lines <= MAX_LINES, (name, lines)
