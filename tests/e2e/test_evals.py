"""The eval suite against the scripted model, as CI runs it: every scenario passes, and `python -m evals` prints
a pass rate per class and exits by the outcome."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crashsafe.evals.checks import Charged, Effects, Status
from crashsafe.evals.conversation import Say, Scenario, ScenarioClass
from crashsafe.evals.runner import EvalStack, ModelChoice, Result, play, run_suite, running_stack
from crashsafe.evals.scenarios import SCENARIOS, TWO_NIGHTS
from tests.support.paths import ROOT


@pytest.fixture(scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EvalStack]:
    async with running_stack(ModelChoice.SCRIPTED, tmp_path_factory.mktemp("evals")) as evals:
        yield evals


@pytest.fixture(scope="module")
async def results(stack: EvalStack) -> dict[str, Result]:
    """The whole suite, played once on one stack; each test below judges one scenario."""
    return {r.scenario.name: r for r in await run_suite(stack, SCENARIOS)}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name.replace(" ", "_"))
async def test_scenario_passes(results: dict[str, Result], scenario: Scenario) -> None:
    result = results[scenario.name]
    assert not result.skipped
    assert result.passed, "\n".join(result.problems) + f"\nneeds: {', '.join(scenario.needs) or '-'}"


@pytest.mark.timeout(300)
async def test_a_scenario_whose_outcome_did_not_happen_fails_saying_what_was_wrong(
    results: dict[str, Result], stack: EvalStack
) -> None:
    wrong = Scenario(
        "expects what a booking does not do",
        ScenarioClass.BOOKS,
        (Say(TWO_NIGHTS),),
        (Status("handed_off"), Effects("booking", 2), Charged(0)),
    )
    result = await play(stack, wrong, n=99)
    assert result.problems == [
        "last run is completed, expected handed_off",
        "ledger has 1 booking, expected 2",
        "ledger has 1 charges (24000), expected 0",
    ]


@pytest.mark.timeout(300)
async def test_the_cli_prints_pass_rates_and_exits_zero_when_all_pass(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "evals",
        "--class",
        "clarifies",
        "--state-dir",
        str(tmp_path),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await process.communicate()
    text = out.decode()
    assert process.returncode == 0, text
    assert "clarifies  2/2 passed (100%)" in text and "total      2/2 passed (100%)" in text
    assert "books" not in text.split("total")[0]  # only the class asked for


@pytest.mark.timeout(120)
async def test_the_cli_refuses_a_real_model_without_a_key(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "evals",
        "--model",
        "openai",
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await process.communicate()
    assert process.returncode == 2 and b"OPENAI_API_KEY" in out
