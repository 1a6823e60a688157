"""The house's layering, enforced: which package may import which, and that contracts and cores import no I/O."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.support.paths import ROOT

PROJECT = {"crashsafe", "bench", "tests"}
# The source folders each importable as crashsafe.<folder> (crashsafe/<folder> links to it; docs/architecture.md).
LINKED = ("contracts", "domain", "services", "sandbox", "evals", "examples")
IO_LIBRARIES = {
    "nats",
    "aiosqlite",
    "openai",
    "opentelemetry",
    "httpx",
    "litestar",
    "uvicorn",
    "httpx_aiohttp",
    "aiohttp",
}

# Who may import whom, by the longest matching package prefix: the one rule, with no exceptions (docs/architecture.md
# draws this very table; a test below holds the two together).
MAY_IMPORT: dict[str, set[str]] = {
    "crashsafe.contracts": {"crashsafe.contracts"},
    "crashsafe.domain": {"crashsafe.contracts", "crashsafe.domain"},
    "crashsafe.services.agents": {
        "crashsafe.contracts",
        "crashsafe.domain",
        "crashsafe.services.agents",
    },
    # Process infrastructure: the JetStream adapter, the delivery loop, settings, logs, tracing, probes.
    "crashsafe.services.platform": {"crashsafe.contracts", "crashsafe.services.platform"},
    # Records several services share, each in its JetStream bucket or stream, over the platform's adapter.
    "crashsafe.services.records": {
        "crashsafe.contracts",
        "crashsafe.domain",
        "crashsafe.services.platform",
        "crashsafe.services.records",
    },
    # The outside providers' adapter the executor and the projector share.
    "crashsafe.services.providers": {
        "crashsafe.contracts",
        "crashsafe.domain",
        "crashsafe.services.platform",
        "crashsafe.services.providers",
    },
    "crashsafe.services.runtime": {
        "crashsafe.domain",
        "crashsafe.contracts",
        "crashsafe.services.platform",
        "crashsafe.services.records",
        "crashsafe.services.runtime",
        "crashsafe.services.knowledge",
    },
    "crashsafe.services.knowledge": {
        "crashsafe.domain",
        "crashsafe.contracts",
        "crashsafe.services.knowledge",
    },
    "crashsafe.services.executor": {
        "crashsafe.domain",
        "crashsafe.contracts",
        "crashsafe.services.platform",
        "crashsafe.services.records",
        "crashsafe.services.providers",
        "crashsafe.services.executor",
    },
    "crashsafe.services.gateway": {
        "crashsafe.contracts",
        "crashsafe.services.platform",
        "crashsafe.services.records",
        "crashsafe.services.gateway",
        "crashsafe.domain",
    },
    # The evidence console: pages that read and act through the operator tasks, with the domain's access rules.
    "crashsafe.services.console": {
        "crashsafe.contracts",
        "crashsafe.services.records",
        "crashsafe.services.providers",
        "crashsafe.domain",
        "crashsafe.services.platform",
        "crashsafe.services.operations",
        "crashsafe.services.console",
    },
    # Operator tasks (runs, dead letters, unknowns, re-plan, audit, projections, keys, guests, the catalog): the
    # one home the CLI and the console call; over the platform's adapters, never another service.
    "crashsafe.services.operations": {
        "crashsafe.contracts",
        "crashsafe.domain",
        "crashsafe.services.platform",
        "crashsafe.services.records",
        "crashsafe.services.providers",
        "crashsafe.services.operations",
    },
    "crashsafe.services.reconciler": {
        "crashsafe.contracts",
        "crashsafe.services.platform",
        "crashsafe.services.records",
        "crashsafe.services.reconciler",
        "crashsafe.domain",
    },
    "crashsafe.services.projector": {
        "crashsafe.contracts",
        "crashsafe.services.platform",
        "crashsafe.services.records",
        "crashsafe.services.providers",
        "crashsafe.services.projector",
        "crashsafe.domain",
    },
    # The adopter's surface: names from the contracts and the domain, re-exported; nothing with I/O.
    "crashsafe.sdk": {"crashsafe.contracts", "crashsafe.domain", "crashsafe.sdk"},
    # The adopter's test kit: plays an agent through the domain's own decisions, in memory; nothing with I/O.
    "crashsafe.testing": {"crashsafe.contracts", "crashsafe.domain", "crashsafe.sdk", "crashsafe.testing"},
    # Its real stack, for an adopter's end-to-end and crash tests: the stack machinery `crashsafe up` runs.
    "crashsafe.testing.live_stack": {"crashsafe", "crashsafe.contracts", "crashsafe.testing"},
    "crashsafe.sandbox": {"crashsafe.sandbox", "crashsafe.contracts"},
    "crashsafe": {"crashsafe.contracts", "crashsafe.services", "crashsafe.sandbox", "crashsafe"},
    # The eval suite drives the product from outside: its stack machinery, its contracts, the sandbox's ledger.
    "crashsafe.evals": {"crashsafe.contracts", "crashsafe", "crashsafe.sandbox", "crashsafe.evals"},
    # An outside reader of the public contracts: nothing of the product but `contracts` (and nats itself).
    "crashsafe.examples": {"crashsafe.contracts", "crashsafe.examples"},
    # An adopter's package: the public surface and the testing helpers, nothing else of the product.
    "crashsafe.examples.cowork": {"crashsafe.sdk", "crashsafe.testing", "crashsafe.examples.cowork"},
}

# Plain functions over plain data: these, and everything they import from the project, touch no I/O library.
PURE = (
    "crashsafe.contracts",
    "crashsafe.domain",
    "crashsafe.sdk",
    # The harness and the scripted model (their HTTP server, model_server, is an adapter run on its own).
    "crashsafe.testing.harness",
    "crashsafe.testing.scripted",
    "crashsafe.services.console.run_timeline",
    "crashsafe.services.agents",
    "crashsafe.examples.analytics.core",
    # An adopter's agent and tools are as pure as the runtime's own: the fold and decide call them.
    "crashsafe.examples.cowork.desk_agent",
    "crashsafe.examples.cowork.desk_tools",
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] in LINKED:
        parts.insert(0, "crashsafe")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_file(name: str) -> Path | None:
    base = ROOT.joinpath(
        *name.split(".")
    )  # crashsafe/<folder> is a link, so this finds the linked folders too
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path) -> Iterator[str]:
    """Every module a file imports, anywhere in it (functions and TYPE_CHECKING blocks included)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            yield base
            yield from (
                f"{base}.{alias.name}" for alias in node.names if _module_file(f"{base}.{alias.name}")
            )


def _sources(*tops: str) -> list[Path]:
    """Every file of these top folders; `crashsafe` means the CLI's own files (the linked folders are named apart)."""
    paths = (p for top in tops for p in (ROOT / top).rglob("*.py"))
    return sorted(
        p for p in paths if p.relative_to(ROOT).parts[:2] not in {("crashsafe", top) for top in LINKED}
    )


def _rule_for(module: str) -> set[str] | None:
    matches = [prefix for prefix in MAY_IMPORT if module == prefix or module.startswith(prefix + ".")]
    return MAY_IMPORT[max(matches, key=len)] if matches else None


def _within(name: str, prefixes: set[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_every_product_module_has_a_layering_rule() -> None:
    orphans = [
        _module_name(p)
        for p in _sources("contracts", "domain", "services", "sandbox", "crashsafe", "evals", "examples")
        if _rule_for(_module_name(p)) is None and _module_name(p) != "crashsafe.services"
    ]
    assert not orphans, f"modules with no rule in MAY_IMPORT: {orphans}"


def test_packages_import_only_what_their_layer_allows() -> None:
    offenders: list[str] = []
    for path in _sources("contracts", "domain", "services", "sandbox", "crashsafe", "evals", "examples"):
        module = _module_name(path)
        allowed = _rule_for(module)
        if allowed is None:
            continue
        for name in _imports(path):
            if name.split(".")[0] in PROJECT and not _within(name, allowed):
                offenders.append(f"{module} imports {name}")
    assert not offenders, "layering broken:\n" + "\n".join(sorted(set(offenders)))


def test_no_service_and_no_contract_imports_the_sandbox_bench_or_tests() -> None:
    outside = {"crashsafe.sandbox", "bench", "tests", "crashsafe.evals", "crashsafe.examples"}
    for path in _sources("contracts", "domain", "services"):
        for name in _imports(path):
            cli = name.startswith("crashsafe.") and name.split(".")[1] not in LINKED
            assert not cli and not _within(name, outside), (
                f"{_module_name(path)} imports {name}: the outside world and the tools stay outside the product"
            )


def test_no_service_imports_the_agents_it_runs() -> None:
    """The deployment names its agents (CRASHSAFE_REGISTRY); a service gets them passed in, never imports them."""
    for path in _sources("services"):
        module = _module_name(path)
        if module.startswith("crashsafe.services.agents"):
            continue
        assert not any(_within(name, {"crashsafe.services.agents"}) for name in _imports(path)), module


def test_contracts_and_cores_import_no_io_library() -> None:
    roots = [
        p
        for p in _sources("contracts", "domain", "services", "examples", "crashsafe")
        if _within(_module_name(p), set(PURE))
    ]
    assert ROOT / "domain" / "execution.py" in roots
    assert ROOT / "domain" / "decide.py" in roots
    assert ROOT / "crashsafe" / "sdk.py" in roots and ROOT / "crashsafe" / "testing" / "harness.py" in roots
    # Follow project imports transitively: a core importing an adapter that imports nats is as bad as importing nats.
    seen: dict[Path, list[str]] = {path: [_module_name(path)] for path in roots}
    queue = list(roots)
    offenders: list[str] = []
    while queue:
        path = queue.pop()
        chain = seen[path]
        for name in _imports(path):
            top = name.split(".")[0]
            if top in IO_LIBRARIES:
                offenders.append(" -> ".join([*chain, name]))
            if top not in PROJECT:
                continue
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # importing a.b.c runs a, a.b and a.b.c
                target = _module_file(".".join(parts[:i]))
                if target is not None and target.resolve() not in {s.resolve() for s in seen}:
                    seen[target] = [*chain, ".".join(parts[:i])]
                    queue.append(target)
    assert not offenders, "pure modules reach I/O libraries:\n" + "\n".join(sorted(set(offenders)))


def test_the_walker_sees_imports_it_must() -> None:
    seen = set(_imports(ROOT / "domain" / "fold.py"))
    assert "crashsafe.contracts.run_events" in seen and "msgspec" in seen


def test_the_linked_folders_are_imported_only_as_crashsafe_names() -> None:
    """`import services...` would load a second copy of a module beside `crashsafe.services...` (issue 18)."""
    offenders = [
        f"{_module_name(path)} imports {name}"
        for top in (*LINKED, "crashsafe", "bench", "tests")
        for path in _sources(top)
        for name in _imports(path)
        if name.split(".")[0] in LINKED
    ]
    assert not offenders, "\n".join(offenders)


def test_the_architecture_doc_draws_the_table_this_walk_enforces() -> None:
    """docs/architecture.md shows the one import rule; a row changed here and not there (or there and not here)
    fails, so the drawing never drifts from what is enforced."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("### Who may import whom") :].split("\n## ", 1)[0]
    drawn: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            drawn[cells[0].strip("`")] = {name.strip().strip("`") for name in cells[1].split(",")}
    assert drawn == MAY_IMPORT
