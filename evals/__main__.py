"""`python -m evals [--class C] [--model scripted|openai]`: play the scenarios, print the pass rates, exit 1 on a failure."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from crashsafe.evals.conversation import Scenario, ScenarioClass
from crashsafe.evals.runner import ModelChoice, report, run_suite, running_stack
from crashsafe.evals.scenarios import select


def chosen(klass: str | None, name: str | None) -> tuple[Scenario, ...]:
    """The scenarios of `klass` whose name contains `name` (case-insensitive); none is an error."""
    scenarios = tuple(s for s in select(klass) if name is None or name.lower() in s.name.lower())
    if not scenarios:
        raise ValueError(f"no scenario matches --class {klass} --scenario {name!r} (see --list)")
    return scenarios


def listing(scenarios: tuple[Scenario, ...]) -> str:
    return "\n".join(
        f"{s.klass.value:<10} {s.name}" + (f"  (needs {', '.join(s.needs)})" if s.needs else "")
        for s in scenarios
    )


async def main(scenarios: tuple[Scenario, ...], model: ModelChoice, state_dir: Path | None) -> int:
    async with running_stack(model, state_dir) as evals:
        results = await run_suite(evals, scenarios)
    print(report(results))
    return 0 if all(r.passed or r.skipped for r in results) else 1


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m evals", description=__doc__)
    parser.add_argument("--class", dest="klass", choices=[c.value for c in ScenarioClass], default=None)
    parser.add_argument("--scenario", default=None, help="only scenarios whose name contains this")
    parser.add_argument("--model", choices=[m.value for m in ModelChoice], default=ModelChoice.SCRIPTED.value)
    parser.add_argument(
        "--state-dir", type=Path, default=None, help="keep the stack's state here (default: temp)"
    )
    parser.add_argument(
        "--list", action="store_true", help="print the scenarios and what each needs, run none"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse()
    try:
        scenarios = chosen(args.klass, args.scenario)
        if args.list:
            print(listing(scenarios))
            sys.exit(0)
        sys.exit(asyncio.run(main(scenarios, ModelChoice(args.model), args.state_dir)))
    except ValueError as exc:
        print(f"python -m evals: {exc}", file=sys.stderr)
        sys.exit(2)
