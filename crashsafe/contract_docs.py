"""The generated contract documents: docs/events.md, docs/schemas/, docs/asyncapi.json, docs/openapi.json, the locks.

The renderers live in `contract_pages` (Markdown) and `contract_specs` (schemas, AsyncAPI, OpenAPI); this is the
set of documents, the locks (the messages' contracts/lock.json, the broker's contracts/wire.json), the golden files
and a thin writer (`python -m crashsafe.contract_docs`, run by `just docs`) that refuses a breaking change against
the locks in the tree and the previous release's snapshot (`crashsafe.release_snapshot`).
tests/unit/test_contract_docs.py renders every document in memory and compares it with the checked-in file, so
none of them can drift from the code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from crashsafe import contract_lock, release_snapshot, wire_lock
from crashsafe.contract_pages import events_md, metrics_md
from crashsafe.contract_specs import asyncapi, json_bytes, openapi, schemas

ROOT = Path(__file__).resolve().parent.parent
LOCK = Path("contracts/lock.json")
WIRE = Path("contracts/wire.json")
SCHEMAS = Path("docs/schemas")


def documents(locked: contract_lock.Lock | None = None) -> dict[Path, bytes]:
    """Every generated file by repository path; the lock merged with the checked-in one (`locked`)."""
    now = contract_lock.current()
    docs = {
        Path("docs/events.md"): events_md().encode(),
        Path("docs/asyncapi.json"): json_bytes(asyncapi()),
        Path("docs/openapi.json"): json_bytes(openapi()),
        Path("docs/metrics.md"): metrics_md().encode(),
        LOCK: json_bytes(contract_lock.merged(locked or {}, now)),
        WIRE: json_bytes(wire_lock.current()),
    }
    docs |= {SCHEMAS / name: body for name, body in schemas().items()}
    return docs


def read_lock(root: Path = ROOT) -> contract_lock.Lock:
    path = root / LOCK
    return json.loads(path.read_bytes()) if path.exists() else {}


# Golden files per version: tests/golden/<type>.json is the current encoding (tests/unit/test_contracts.py pins
# it); tests/golden/v<n>/<type>.json keeps every earlier one forever, and each must decode with today's code.
GOLDEN = Path("tests/golden")


def golden_versions(root: Path = ROOT) -> dict[str, list[Path]]:
    """Each type's kept versions, oldest first (`v1`, `v2`, ...)."""
    versions: dict[str, list[Path]] = {}
    dirs = sorted(
        (d for d in (root / GOLDEN).glob("v*") if d.is_dir() and d.name[1:].isdigit()),
        key=lambda d: int(d.name[1:]),
    )
    for d in dirs:
        for f in sorted(d.glob("*.json")):
            versions.setdefault(f.name, []).append(f)
    return versions


def new_golden_versions(root: Path = ROOT) -> dict[Path, bytes]:
    """A current golden that is not its type's newest kept version becomes the next version."""
    versions = golden_versions(root)
    found = {}
    for current in sorted((root / GOLDEN).glob("*.json")):
        kept = versions.get(current.name, [])
        if kept and kept[-1].read_bytes() == current.read_bytes():
            continue
        n = int(kept[-1].parent.name[1:]) + 1 if kept else 1
        found[GOLDEN / f"v{n}" / current.name] = current.read_bytes()
    return found


def main(root: Path = ROOT) -> int:
    locked = read_lock(root)
    problems = contract_lock.breaking_changes(locked, contract_lock.current())
    # The previous release's snapshot as well: a lock rewritten by hand hides nothing from it.
    previous = release_snapshot.previous(root)
    if previous:
        problems += release_snapshot.breaks(previous, wire_lock.current(), contract_lock.current())
    if problems:
        print(
            "refusing to write: a breaking change to the contracts (a breaking change is a new event type;"
            " on the broker, a new name beside the old: contracts/README.md):"
        )
        for p in problems:
            print(f"  - {p}")
        return 1
    docs = documents(locked) | new_golden_versions(root)
    for stale in (root / SCHEMAS).glob("*.json"):
        if stale.relative_to(root) not in docs:
            stale.unlink()
    for path, body in docs.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_bytes() != body:
            target.write_bytes(body)
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
