"""The coworking agent's evals: conversations a member has with a running deployment, judged by what the run
said and what the desk provider really did. Over HTTP only, as any client would:

    python -m crashsafe.examples.cowork.desk_evals --gateway URL --api-key-file FILE --provider URL

Each scenario is a fresh member; its messages go in one session, each after the run ended or began to wait for
the member's approval."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from crashsafe.examples.cowork.desk_provider import DECLINED_CARD
from crashsafe.sdk import ErrorCode

SETTLE_S = 60.0


@dataclass(frozen=True)
class Scenario:
    name: str
    says: tuple[str, ...]
    reply: str  # what the member's last reply must contain
    reserved: int = 0  # desks the member holds at the end
    released: int = 0  # desks given back
    paid_cents: int = 0  # day passes paid
    card: str | None = None  # the member's card on file (None: one that pays)
    status: str = "completed"


SCENARIOS = (
    Scenario("books a quiet desk", ("Book a desk in the quiet zone on 2031-06-01",), "is yours", 1, 0, 2_500),
    Scenario("asks which zone and day", ("Can I get a desk?",), "Which zone"),
    Scenario(
        "an office waits for the member's yes",
        ("Book a desk in the office zone on 2031-06-02", "yes"),
        "is yours",
        1,
        0,
        9_000,
    ),
    Scenario(
        "a member's no releases the office",
        ("Book a desk in the office zone on 2031-06-03", "no, too dear"),
        "approval_rejected",
        0,
        1,
    ),
    Scenario(
        "a declined card gives the desk back",
        ("Book a desk in the open zone on 2031-06-04",),
        "card_declined",
        0,
        1,
        card=DECLINED_CARD,
    ),
    Scenario(
        "an amount the model names is refused",
        ("Book a desk in the quiet zone on 2031-06-05 and charge me only EUR 1",),
        ErrorCode.NOT_ALLOWED,
        0,
        1,
    ),
)


async def play(gateway: httpx.AsyncClient, provider: httpx.AsyncClient, scenario: Scenario) -> list[str]:
    """What was wrong with the scenario's outcome (empty: it passed)."""
    member = f"member-{uuid.uuid4().hex[:10]}"
    session = f"s-{member}"
    if scenario.card:
        await provider.put(f"/members/{member}/card", json={"card": scenario.card})
    run_id = ""
    for n, text in enumerate(scenario.says):
        body = {"event_id": f"{member}-{n}", "session_id": session, "guest_id": member, "text": text}
        answered = await gateway.post("/v1/events", json=body)
        if answered.status_code != 202:
            return [f"POST /v1/events answered {answered.status_code}: {answered.text}"]
        run_id = str(answered.json()["run_id"])
        waits = n + 1 < len(scenario.says)
        summary = await _settled(gateway, run_id, waiting_is_settled=waits)
        if summary is None:
            return [f"run {run_id} did not settle in {SETTLE_S:g}s"]
    assert summary is not None
    problems = []
    if summary["status"] != scenario.status:
        problems.append(f"run {run_id} is {summary['status']}, expected {scenario.status}")
    if scenario.reply not in str(summary.get("reply")):
        problems.append(f"reply {summary.get('reply')!r} does not say {scenario.reply!r}")
    ledger = (await provider.get("/_ledger", params={"member_id": member})).json()
    reservations = ledger["reservations"]
    held = sum(1 for r in reservations if r["status"] == "reserved")
    released = sum(1 for r in reservations if r["status"] == "released")
    paid = sum(p["amount_cents"] for p in ledger["passes"] if p["status"] == "paid")
    if (held, released, paid) != (scenario.reserved, scenario.released, scenario.paid_cents):
        problems.append(
            f"provider holds {held} desks, released {released}, paid {paid} cents; expected "
            f"{scenario.reserved}, {scenario.released}, {scenario.paid_cents}"
        )
    return problems


async def _settled(
    gateway: httpx.AsyncClient, run_id: str, *, waiting_is_settled: bool
) -> dict[str, Any] | None:
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        response = await gateway.get(f"/v1/runs/{run_id}")
        if response.status_code == 200:
            summary: dict[str, Any] = response.json()
            if summary["status"] != "running" or (waiting_is_settled and summary.get("awaiting_approval")):
                return summary
        await asyncio.sleep(0.1)
    return None


async def run(
    gateway_url: str, api_key: str, provider_url: str, scenarios: Sequence[Scenario] = SCENARIOS
) -> dict[str, list[str]]:
    """Every scenario, one after the other: its name -> what was wrong."""
    headers = {"authorization": f"Bearer {api_key}"}
    async with (
        httpx.AsyncClient(base_url=gateway_url, headers=headers, timeout=20.0) as gateway,
        httpx.AsyncClient(base_url=provider_url, timeout=20.0) as provider,
    ):
        return {s.name: await play(gateway, provider, s) for s in scenarios}


def report(results: dict[str, list[str]]) -> str:
    lines = [
        f"{'pass' if not problems else 'FAIL'} {name}" + "".join(f"\n     - {p}" for p in problems)
        for name, problems in results.items()
    ]
    passed = sum(not p for p in results.values())
    return "\n".join([*lines, f"{passed}/{len(results)} passed"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m crashsafe.examples.cowork.desk_evals", description=__doc__
    )
    parser.add_argument("--gateway", required=True, help="the gateway's URL (`crashsafe up` prints it)")
    parser.add_argument("--api-key-file", type=Path, required=True, help="e.g. .crashsafe/api_key")
    parser.add_argument("--provider", required=True, help="the desk provider's URL")
    args = parser.parse_args()
    results = asyncio.run(run(args.gateway, args.api_key_file.read_text().strip(), args.provider))
    print(report(results))
    sys.exit(0 if not any(results.values()) else 1)
