"""Each release's contract as it shipped (contracts/releases/<version>.json): what the next release must run beside.

A snapshot holds the release's wire lock (`crashsafe.wire_lock`) and its message lock (contracts/lock.json), both
taken from that release's own commit, so no later edit of contracts/wire.json or contracts/lock.json can hide a
break: the unit tests and `just docs` check this tree against the previous release's snapshot
(`contracts.release.previous_release()`), besides the locks in the tree.

Cutting release N: `python -m crashsafe.release_snapshot` at its commit writes contracts/releases/<N>.json. An
older release is snapshotted from its own tree with its own interpreter, as 0.1.0 was (its venv and checkout):
`python -m crashsafe.release_snapshot --version 0.1.0 --python /tmp/rel/venv/bin/python --tree /tmp/rel/src`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from crashsafe import wire_lock
from crashsafe.contracts.release import VERSION, previous_release, releases

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOTS = Path("contracts/releases")
LOCK = Path("contracts/lock.json")

# Run by the other release's interpreter, isolated (`-I`: no PYTHONPATH, no working directory on the path): this
# tree's extractor (argv[1]) over that release's `crashsafe`, from its source tree (argv[2]) if one is given.
_EXTRACT = """
import runpy, sys
sys.path[:0] = [p for p in sys.argv[2:] if p]
import crashsafe
print(crashsafe.__file__, file=sys.stderr)
runpy.run_path(sys.argv[1], run_name="__main__")
"""


def path_of(version: str, root: Path = ROOT) -> Path:
    return root / SNAPSHOTS / f"{version}.json"


def read(version: str, root: Path = ROOT) -> dict[str, Any] | None:
    path = path_of(version, root)
    return json.loads(path.read_bytes()) if path.exists() else None


def previous(root: Path = ROOT) -> dict[str, Any] | None:
    """The previous release's snapshot (None: this is the first release, or `root` holds no snapshots)."""
    release = previous_release()
    return read(release.version, root) if release else None


def breaks(snapshot: dict[str, Any], wire: wire_lock.Wire, messages: dict[str, Any]) -> list[str]:
    """What this tree (its wire and message locks, as now) breaks of a release's snapshot, one sentence each."""
    from crashsafe.contract_lock import breaking_changes

    found = wire_lock.wire_breaks(snapshot["wire"], wire) + breaking_changes(snapshot["messages"], messages)
    return [f"against {snapshot['version']}: {p}" for p in found]


def _wire_of(python: str, tree: str | None) -> wire_lock.Wire:
    """The wire lock of another release's tree, extracted by its interpreter (its `crashsafe` imported, not ours)."""
    with tempfile.TemporaryDirectory() as empty:
        done = subprocess.run(
            [python, "-I", "-c", _EXTRACT, wire_lock.__file__, tree or ""],
            cwd=empty,
            capture_output=True,
            text=True,
            check=True,
        )
    print(f"extracted with {done.stderr.strip()}", file=sys.stderr)
    return json.loads(done.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", default=VERSION, help="the release to snapshot (default: this tree's)")
    parser.add_argument(
        "--python", help="the release's interpreter, its crashsafe installed (default: this one)"
    )
    parser.add_argument("--tree", help="the release's source tree, put first on its PYTHONPATH")
    args = parser.parse_args(argv)
    record = next((r for r in releases() if r.version == args.version), None)
    if args.version == VERSION:
        wire, lock = wire_lock.current(), json.loads((ROOT / LOCK).read_bytes())
    elif record is None or not args.python:
        print(f"{args.version} is not in contracts/releases.json, or no --python runs it", file=sys.stderr)
        return 2
    else:
        wire = _wire_of(args.python, args.tree)
        shown = subprocess.run(
            ["git", "show", f"{record.commit}:{LOCK}"], cwd=ROOT, capture_output=True, check=True
        )
        lock = json.loads(shown.stdout)
    snapshot = {
        "version": args.version,
        "commit": record.commit if record else "",
        "wire": wire,
        "messages": lock,
    }
    target = path_of(args.version)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(snapshot, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    print(f"wrote {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
