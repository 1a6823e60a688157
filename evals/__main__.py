"""`python -m evals [--class C] [--model scripted|openai]`: play the scenarios, print the pass rates, exit 1 on a failure."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from evals.runner import ModelChoice, report, run_suite, running_stack
from evals.scenarios import ScenarioClass, select


async def main(klass: str | None, model: ModelChoice, state_dir: Path | None) -> int:
    scenarios = select(klass)
    async with running_stack(model, state_dir) as evals:
        results = await run_suite(evals, scenarios)
    print(report(results))
    return 0 if all(r.passed or r.skipped for r in results) else 1


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m evals", description=__doc__)
    parser.add_argument("--class", dest="klass", choices=[c.value for c in ScenarioClass], default=None)
    parser.add_argument("--model", choices=[m.value for m in ModelChoice], default=ModelChoice.SCRIPTED.value)
    parser.add_argument(
        "--state-dir", type=Path, default=None, help="keep the stack's state here (default: temp)"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse()
    try:
        sys.exit(asyncio.run(main(args.klass, ModelChoice(args.model), args.state_dir)))
    except ValueError as exc:
        print(f"python -m evals: {exc}", file=sys.stderr)
        sys.exit(2)
