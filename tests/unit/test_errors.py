"""Errors declare their facts once: every raise names a specific error, and each error sends exactly its facts."""

from __future__ import annotations

import ast
import functools
import importlib
import types
import typing
from collections.abc import Iterator
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import pytest

import crashsafe.contracts.errors as errors
from crashsafe.contracts.errors import NOT_SENT, CrashsafeError, Unauthenticated
from tests.support.paths import ROOT

# The product's source folders; crashsafe/ holds the CLI's own files and links to the others (skipped there).
PRODUCT = ("contracts", "domain", "services", "sandbox", "evals", "examples", "crashsafe")
LINKED = PRODUCT[:-1]
ROOT_ERROR = CrashsafeError.__name__


@functools.cache
def _sources() -> dict[Path, ast.Module]:
    """Every product source file, parsed once for all the walks below."""
    paths = (p for top in PRODUCT for p in (ROOT / top).rglob("*.py"))
    return {
        p: ast.parse(p.read_text())
        for p in sorted(paths)
        if p.relative_to(ROOT).parts[:2] not in {("crashsafe", t) for t in LINKED}
    }


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts if parts[0] == "crashsafe" else ("crashsafe", *parts))


def _root_error_uses(tree: ast.AST) -> Iterator[int]:
    """Lines that build or raise the root error itself, under its own name or an alias it was imported as."""
    names = {ROOT_ERROR} | {
        alias.asname
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.name == ROOT_ERROR and alias.asname
    }

    def is_root(node: ast.expr | None) -> bool:
        return (isinstance(node, ast.Name) and node.id in names) or (
            isinstance(node, ast.Attribute) and node.attr == ROOT_ERROR
        )

    for node in ast.walk(tree):
        built = node.func if isinstance(node, ast.Call) else node.exc if isinstance(node, ast.Raise) else None
        if is_root(built):
            yield node.lineno


def test_the_walk_finds_a_raise_of_the_root_error() -> None:
    planted = (
        "from crashsafe.contracts.errors import CrashsafeError as Base\n"
        "raise CrashsafeError('x')\n"
        "raise errors.CrashsafeError('y')\n"
        "raise Base('z')\n"
        "raise CrashsafeError\n"
        "raise RunNotFound(run_id='r')\n"
    )
    assert sorted(_root_error_uses(ast.parse(planted))) == [2, 3, 4, 5]


def test_no_product_code_raises_the_root_error() -> None:
    """A raise names the specific error, so its code, its retry class and its facts say what happened."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for path, tree in _sources().items()
        for line in _root_error_uses(tree)
    ]
    assert not offenders, f"raise a specific error, not {ROOT_ERROR}: {offenders}"


def _error_classes() -> list[type[CrashsafeError]]:
    """Every error class of the product: the modules whose classes derive from a known error are imported (a
    derived class makes its name known too), then the subclass tree is walked."""
    bases_of = {
        path: {
            (node.name, base.id if isinstance(base, ast.Name) else getattr(base, "attr", ""))
            for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef)
            for base in node.bases
        }
        for path, tree in _sources().items()
    }
    known, defining = {ROOT_ERROR}, set()
    while grown := {
        (p, c) for p, pairs in bases_of.items() for c, b in pairs if b in known and c not in known
    }:
        known |= {c for _, c in grown}
        defining |= {p for p, _ in grown}
    for path in sorted(defining):
        importlib.import_module(_module_name(path))
    found: list[type[CrashsafeError]] = []
    todo = list(CrashsafeError.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("crashsafe.") and cls not in found:
            found.append(cls)
            todo.extend(cls.__subclasses__())
    return sorted(found, key=lambda c: c.__name__)


ERROR_CLASSES = _error_classes()
# A fact that must be one of a few values: the message looks its advice up by it.
SAMPLES: dict[tuple[type[CrashsafeError], str], Any] = {(Unauthenticated, "reason"): "missing"}


def _sample(hint: Any) -> Any:
    """A value of the field's type that is not None, so the fact is set and sent."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return _sample(next(arm for arm in typing.get_args(hint) if arm is not type(None)))
    origin = typing.get_origin(hint) or hint
    return {str: "x", int: 7, float: 1.25, bool: True, list: ["x"], dict: {"x": 1}}[origin]


def test_the_walk_finds_the_errors_outside_the_contracts() -> None:
    names = {cls.__name__ for cls in ERROR_CLASSES}
    assert (
        set(errors.__all__) - {"CrashsafeError", "ErrorCode", "ErrorInfo", "NOT_SENT", "RetryClass"} <= names
    )
    assert {"ProfileUnreadable", "Undeliverable", "OutcomeStillUnknown"} <= names


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_an_error_sends_exactly_its_declared_facts(cls: type[CrashsafeError]) -> None:
    """Each error's `details()` keys are its declared fields less those marked NOT_SENT, in declared order."""
    hints = typing.get_type_hints(cls)
    given = {
        f.name: SAMPLES.get((cls, f.name)) or _sample(hints[f.name])
        for f in fields(cls)
        if f.init and (f.metadata != NOT_SENT or (f.default is MISSING and f.default_factory is MISSING))
    }
    positional = [given.pop(f.name) for f in fields(cls) if f.init and not f.kw_only and f.name in given]
    error = cls(*positional, **given)

    declared = [f.name for f in fields(cls) if f.metadata != NOT_SENT]
    assert list(error.details()) == declared == list(cls.facts())
    assert error.info().code == cls.code.value and error.info().details == error.details()
    assert str(error) == error.message and error.args == (error.message,) and error.message
    assert cls.__doc__ and not cls.__doc__.startswith(f"{cls.__name__}(")  # its own, not the dataclass's
