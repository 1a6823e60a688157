"""The README's HTTP API table against the gateway itself: every route the app serves is in the table, and the
scope the table names is the one the route's code requires (the README once said `runs:operate` for deciding an
approval, which needs `approvals:decide`; issue 32, item 3)."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import warnings
from collections.abc import Callable
from functools import cache
from typing import Any

from litestar.exceptions import LitestarDeprecationWarning

from crashsafe.contracts.clients import Scope
from crashsafe.domain import access
from crashsafe.services.agents import stayhub
from crashsafe.services.console.console_router import session_of
from crashsafe.services.gateway.app import build_app
from crashsafe.services.platform.settings import Settings
from tests.support.paths import ROOT

NO_SCOPE = "none"
# The console is a router `crashsafe serve gateway` mounts beside the API (services/gateway/bootstrap.py), signed
# in to with a key; its pages ask the scope `session_of` defaults to.
CONSOLE = ("GET", "/console/")
# Calls whose `Scope` argument is the scope a caller must hold: the door's (`Door.client`, which calls
# `access.require`) and `access.require` itself. `client.may(...)` only asks, and is not a requirement.
REQUIRING = frozenset({"client", "require"})


def _route(call: str) -> tuple[str, str]:
    """`GET /v1/runs/{run_id}` -> ("GET", "/v1/runs/{}"): the query and the parameter names aside."""
    method, path = call.split(" ", 1)
    return method, re.sub(r"\{[^}]*\}", "{}", path.split("?", 1)[0])


def _readme_table() -> dict[tuple[str, str], str]:
    """(method, path) -> the scope the README's HTTP API table names for it (`none` for the probes)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## HTTP API (gateway)", 1)[1].split("\n## ", 1)[0]
    table: dict[tuple[str, str], str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) != 3 or cells[0] in ("call", "---"):
            continue
        calls = re.findall(r"`((?:GET|POST|PUT|PATCH|DELETE) [^`]+)`", cells[0])
        scopes = re.findall(r"`([a-z]+(?::[a-z]+)?)`", cells[1])
        scope = (
            NO_SCOPE if cells[1] == NO_SCOPE else scopes[0] if len(scopes) == 1 else f"unreadable: {cells[1]}"
        )
        for call in calls:
            table[_route(call)] = scope
    return table


@cache
def _functions(module: str) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(inspect.getsource(importlib.import_module(module)))
    return {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def _scopes_required(fn: Callable[..., Any]) -> set[str]:
    """The scopes a handler's code requires: the `Scope` argument of each requiring call in it, and in each
    function it calls of its own module or of `domain/access.py` (a handler reading a run's journal requires it
    in a helper; deciding an approval in `access.require_approver`)."""
    found: set[str] = set()
    todo, seen = [(fn.__module__, fn.__name__)], set()
    while todo:
        module, name = todo.pop()
        node = _functions(module).get(name)
        if node is None or (module, name) in seen:
            continue
        seen.add((module, name))
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            callee = call.func
            called = callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", "")
            if called in REQUIRING:
                found |= {
                    Scope[arg.attr].value
                    for arg in call.args
                    if isinstance(arg, ast.Attribute)
                    and isinstance(arg.value, ast.Name)
                    and arg.value.id == "Scope"
                }
            if isinstance(callee, ast.Name):
                todo += [(module, callee.id), (access.__name__, callee.id)]
    return found


@cache
def _gateway_routes() -> dict[tuple[str, str], set[str]]:
    """(method, path) -> the scopes its handler requires, for every route of the app the gateway serves (the
    OpenAPI schema's own and the unlisted /metrics aside). Built, never started: no broker."""
    with warnings.catch_warnings():
        # Litestar's deprecation of inferred path parameters, said while the app is built (as in the integration
        # tests that build it): not what this test reads.
        warnings.simplefilter("ignore", LitestarDeprecationWarning)
        app = build_app(Settings.from_env({}), stayhub())
    routes: dict[tuple[str, str], set[str]] = {}
    for route in app.routes:
        for handler in getattr(route, "route_handlers", ()):
            if (
                not handler.fn.__module__.startswith("crashsafe.services.gateway")
                or handler.include_in_schema is False
            ):
                continue
            for method in handler.http_methods:
                routes[_route(f"{method} {route.path}")] = _scopes_required(handler.fn)
    return routes


def test_the_readme_names_every_route_of_the_gateway_and_the_scope_its_code_requires() -> None:
    documented = _readme_table()
    served = _gateway_routes()
    assert {("POST", "/v1/events"), ("POST", "/v1/approvals/{}"), ("GET", "/healthz")} <= served.keys()
    assert served.keys() == documented.keys() - {CONSOLE}, (
        "a route the README's table lacks, or names wrongly"
    )
    wrong = {
        f"{method} {path}": (documented[(method, path)], sorted(required) or NO_SCOPE)
        for (method, path), required in served.items()
        if [documented[(method, path)]] != (sorted(required) or [NO_SCOPE])
    }
    assert not wrong, f"README scope vs what the code requires: {wrong}"


def test_the_readme_names_the_scope_the_console_signs_in_with() -> None:
    assert _readme_table()[CONSOLE] == inspect.signature(session_of).parameters["scope"].default.value


def test_the_scope_walk_reads_a_helper_and_an_access_rule() -> None:
    """The walk itself: a scope asked in a helper of the handler's module (a run's journal) and one asked in
    `access.require_approver` (deciding) are found; one only asked about (`client.may`) is not."""
    served = _gateway_routes()
    assert served[("GET", "/v1/runs/{}")] == {Scope.RUNS_READ.value}
    assert served[("POST", "/v1/approvals/{}")] == {Scope.APPROVALS_DECIDE.value}
    assert served[("GET", "/healthz")] == set()
