"""Modules stay small and their names say what they hold: at most 400 lines each, and no two with one file name.

STYLE.md: "past about 400 lines, ask what the second idea is", and a file named `synthetic.py` in four folders forces
import aliases and makes a reader look at the folder to know which one they hold. Tests, the sandbox and generated
files are aside; `__init__.py`, `__main__.py`, `bootstrap.py` and `service.py` (each service's composition root and shell) are
names by convention.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 400
# The source folders (crashsafe/ holds links to the others: they are walked once, as themselves).
SIZED = ("contracts", "domain", "services", "crashsafe", "evals", "examples")
NAMED = ("contracts", "domain", "services", "crashsafe")
# Each service has its composition root (bootstrap.py) and its shell (service.py): one shape in every service folder.
CONVENTIONAL = {"__init__.py", "__main__.py", "bootstrap.py", "service.py"}

# Modules still over the limit, each with the reason it is one idea (none today).
BEING_SPLIT: set[str] = set()

# File names several folders still share (none today).
BEING_RENAMED: dict[str, set[str]] = {}


def _generated(text: str) -> bool:
    """A generated module says so on its first line (a code generator's header), and is exempt."""
    first = text.split("\n", 1)[0].lower()
    return first.startswith("# generated") or first.startswith('"""generated')


def modules(folders: tuple[str, ...]) -> dict[str, str]:
    """Every source module under `folders` ({path relative to the root: text}), links not followed."""
    found: dict[str, str] = {}
    for folder in folders:
        for here, dirs, files in os.walk(ROOT / folder):
            dirs[:] = sorted(d for d in dirs if not (Path(here) / d).is_symlink() and d != "__pycache__")
            for name in files:
                path = Path(here) / name
                if name.endswith(".py") and not path.is_symlink():
                    found[path.relative_to(ROOT).as_posix()] = path.read_text(encoding="utf-8")
    return found


def test_no_module_is_over_400_lines() -> None:
    sizes = {path: len(text.splitlines()) for path, text in modules(SIZED).items() if not _generated(text)}
    over = {path: n for path, n in sizes.items() if n > MAX_LINES}
    new = sorted(f"{path}: {over[path]} lines" for path in set(over) - BEING_SPLIT)
    assert not new, (
        f"over {MAX_LINES} lines: {new}; split along a real seam (one reason to exist per module, a one-line "
        "docstring saying why), moving whole functions"
    )
    done = sorted(path for path in BEING_SPLIT if path not in over)
    assert not done, f"{done} no longer over {MAX_LINES} lines (or gone): take them out of BEING_SPLIT"


def test_no_two_modules_share_a_file_name() -> None:
    paths: dict[str, set[str]] = defaultdict(set)
    for path in modules(NAMED):
        name = path.rsplit("/", 1)[-1]
        if name not in CONVENTIONAL:
            paths[name].add(path)
    shared = {name: found for name, found in paths.items() if len(found) > 1}
    new = sorted(
        f"{name}: {sorted(found)}" for name, found in shared.items() if found != BEING_RENAMED.get(name)
    )
    assert not new, (
        f"file names shared by several folders: {new}; name each for what it holds without its folder "
        "(contracts/synthetic_turn.py, services/agents/synthetic_agent.py)"
    )
    done = sorted(set(BEING_RENAMED) - set(shared))
    assert not done, f"{done} no longer shared: take them out of BEING_RENAMED"
