"""Where a bench finds the test helpers, so benches import them instead of copying them.

The helpers (`cliproc`, `fleet`, `hubprocess`, `fakeprovider`, ...) are imported by bare name
(`from fleet import keep_busy`). They live in `tests/support/` once the tests are split by
layer (issue 24), in `tests/` before: `use_test_helpers` puts whichever exists on `sys.path`,
so a bench works on either tree. Run from a script in `bench/` (its folder is `sys.path[0]`):

    sys.path[:0] = [str(ROOT)]
    from bench._support import use_test_helpers
    use_test_helpers()
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["ROOT", "use_test_helpers"]

ROOT = Path(__file__).resolve().parent.parent


def use_test_helpers() -> Path:
    """Put the repository root, the test helpers' folder (`tests/support` if it exists,
    else `tests`) and `tests` (its `conftest`, which some helpers import) first on
    `sys.path` (once each); returns the helpers' folder."""
    support = ROOT / "tests" / "support"
    helpers = support if support.is_dir() else ROOT / "tests"
    for path in (str(ROOT / "tests"), str(helpers), str(ROOT)):  # ends [ROOT, helpers, tests]
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)
    return helpers
