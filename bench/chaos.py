"""`just chaos [--scale …]`: the chaos soak from the command line; prints the report and exits non-zero if anything broke."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

# Runnable as a script: put the checkout on the path so `bench.*` resolves next to the installed packages.
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.soak import soak
from crashsafe.stack_plan import ScaleError, parse_scale


def _scale(text: str) -> dict[str, int]:
    try:
        return parse_scale(text)
    except ScaleError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of random kills")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--no-nats-kills", action="store_true", help="spare nats-server")
    parser.add_argument(
        "--no-sandbox-kills",
        action="store_true",
        help="spare the sandbox (needed while its books are in memory: a restart forgets every effect)",
    )
    parser.add_argument(
        "--scale",
        type=_scale,
        default={},
        metavar="NAME=N[,NAME=N…]",
        help="replicas, as `crashsafe up --scale`: executor-payment=3,runtime=2",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="crashsafe-chaos-") as tmp:
        report = asyncio.run(
            soak(
                Path(tmp),
                runs=args.runs,
                duration_s=args.duration,
                seed=args.seed,
                kill_nats=not args.no_nats_kills,
                kill_sandbox=not args.no_sandbox_kills,
                scale=args.scale,
            )
        )
    for line in report.lines():
        print(line)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
