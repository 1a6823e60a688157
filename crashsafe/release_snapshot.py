"""Each release's contract as it shipped (contracts/releases/<version>.json): what the next release must run beside.

A snapshot holds the release's wire lock (`crashsafe.wire_lock`) and its message lock (contracts/lock.json), both
taken from that release's own commit, so no later edit of contracts/wire.json or contracts/lock.json can hide a
break: the unit tests and `just docs` check this tree against the previous release's snapshot
(`contracts.release.previous_release()`), besides the locks in the tree.

A release is snapshotted once contracts/releases.json records it (its commit known), as the first change of the
next one, from its own tree with its own interpreter (its checkout and venv, as the version-skew test makes them),
the way 0.1.0's was: `python -m crashsafe.release_snapshot --version 0.1.0 --python /tmp/rel/venv/bin/python
--tree /tmp/rel/src`. Its message lock is read from its commit (`git show`). Without `--python`, the wire is read
from this tree: right only where this tree is that release's commit.
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
    parser.add_argument("--version", required=True, help="the recorded release to snapshot")
    parser.add_argument(
        "--python", help="the release's interpreter, its crashsafe installed (default: this tree)"
    )
    parser.add_argument("--tree", help="the release's source tree, imported before its installed crashsafe")
    args = parser.parse_args(argv)
    record = next((r for r in releases() if r.version == args.version), None)
    if record is None:
        print(
            f"{args.version} is not in contracts/releases.json: record it (and its commit) first",
            file=sys.stderr,
        )
        return 2
    if args.python is None and args.version != VERSION:
        print(f"this tree is {VERSION}: give --python (and --tree) of {args.version}", file=sys.stderr)
        return 2
    wire = _wire_of(args.python, args.tree) if args.python else wire_lock.current()
    shown = subprocess.run(
        ["git", "show", f"{record.commit}:{LOCK}"], cwd=ROOT, capture_output=True, check=True
    )
    snapshot = {
        "version": record.version,
        "commit": record.commit,
        "wire": wire,
        "messages": json.loads(shown.stdout),
    }
    target = path_of(args.version)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(snapshot, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    print(f"wrote {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
