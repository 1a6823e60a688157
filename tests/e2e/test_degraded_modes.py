"""The synthetic turn and the degraded modes on one stack of real processes (docs/failure-modes.md, "Degraded
modes"), through the gateway's HTTP as a client and `crashsafe` as an operator would.

The stack runs without its policy documents (CRASHSAFE_KNOWLEDGE_DIR: an empty folder) and with the reconciler's
synthetic turn on a short cadence:
- `crashsafe check synthetic`: the `synthetic` tenant's search crosses gateway, runtime, the model port (the fixed
  route), the booking executor and the provider, and writes nothing; the reconciler's turns publish
  `ops.synthetic`; a paused runtime makes a turn `slow` (never a hang), a bad key or no gateway `failed`;
- policy documents missing: a policy question is handed off (`policy_unavailable`), a booking still completes.
"""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from crashsafe.contracts.run_events import HandOffReason
from crashsafe.contracts.subjects import StreamKind
from crashsafe.contracts.synthetic_turn import SYNTHETIC_TENANT, SyntheticResult, synthetic_decoder
from crashsafe.domain.handoff import handoff_reply
from crashsafe.natsd import NatsServer, free_port
from crashsafe.services.platform.jetstream import Broker
from crashsafe.stack_keys import SYNTHETIC_KEY_FILE
from tests.support.stack import (
    StackClient,
    auth_header,
    cli_env,
    crashsafe,
    guest_event,
    open_stack,
    operator_access,
)
from tests.support.waiting import eventually

CADENCE_S = 3
PROBE_GUEST = "synthetic-probe"


@pytest.fixture(scope="module")
async def world(
    nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[StackClient]:
    empty = tmp_path_factory.mktemp("no-documents")
    async with open_stack(
        tmp_path_factory.mktemp("degraded"),
        nats_url=nats_server.url,
        namespace=f"d{uuid.uuid4().hex[:10]}",
        synthetic=True,
        env={"CRASHSAFE_KNOWLEDGE_DIR": str(empty), "CRASHSAFE_SYNTHETIC_EVERY_S": str(CADENCE_S)},
    ) as client:
        yield client


async def _check(world: StackClient, *args: str) -> tuple[int, dict[str, Any]]:
    done = await crashsafe(
        "check",
        "synthetic",
        "--json",
        "--state-dir",
        str(world.stack.state_dir),
        *args,
        env=cli_env(world.stack),
    )
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


def _synthetic_key(world: StackClient) -> str:
    return (Path(world.stack.state_dir) / SYNTHETIC_KEY_FILE).read_text().strip()


# The synthetic turn --------------------------------------------------------------------------------------------


async def test_a_synthetic_turn_crosses_every_seam_and_writes_nothing(world: StackClient) -> None:
    before = await world.counts(PROBE_GUEST)
    code, turn = await _check(world, "--record")
    assert (code, turn["result"]) == (0, SyntheticResult.OK), turn
    assert turn["by"] == "cli" and 0 < turn["duration_s"] < turn["budget_s"]

    events = await world.events(turn["run_id"])  # the stack's admin key sees every tenant's runs
    kinds = [e["type"] for e in events]
    assert kinds[0] == "run.started" and kinds[-1] == "run.completed", kinds
    assert events[0]["tenant"] == SYNTHETIC_TENANT and events[0]["agent"] == "synthetic"
    # The model port answered twice from the fixed route: the search, then the reply; no paid call.
    answered = [e for e in events if e["type"] == "run.model_answered"]
    assert [e["model"] for e in answered] == ["synthetic-fixed", "synthetic-fixed"]
    # The executor asked the provider and its receipt came back with the provider's hotels.
    (requested,) = [e for e in events if e["type"] == "run.action_requested"]
    assert (requested["tool"], requested["family"]) == ("search_hotels", "booking")
    (done,) = [e for e in events if e["type"] == "run.action_completed"]
    assert done["status"] == "succeeded" and done["result"]["hotels"], done
    assert "hotel(s) found" in events[-1]["reply"]
    # Nothing written at the provider, for the probe's guest or anyone.
    assert await world.counts(PROBE_GUEST) == before
    assert all(v == 0 for v in before.values()), before

    # --record: the result is in the history, on ops.synthetic.cli.
    broker = await Broker.connect(
        world.stack.nats_url, "tests-synthetic", access=operator_access(world.stack)
    )
    try:
        stored = await broker.read_subject(world.ns.stream(StreamKind.OPS), world.ns.ops("synthetic", "cli"))
    finally:
        await broker.close()
    assert turn["run_id"] in {synthetic_decoder.decode(m.data).run_id for m in stored}


async def test_the_reconciler_runs_the_turn_on_its_cadence_and_records_it_apart_from_health(
    world: StackClient,
) -> None:
    broker = await Broker.connect(
        world.stack.nats_url, "tests-synthetic", access=operator_access(world.stack)
    )
    try:

        async def recorded() -> list[Any] | None:
            stored = await broker.read_subject(
                world.ns.stream(StreamKind.OPS), world.ns.ops("synthetic", "reconciler")
            )
            turns = [synthetic_decoder.decode(m.data) for m in stored]
            return turns if any(t.result == SyntheticResult.OK for t in turns) else None

        turns = await eventually(recorded, what="a synthetic turn of the reconciler", timeout_s=60)
    finally:
        await broker.close()
    ok = next(t for t in turns if t.result == SyntheticResult.OK)
    assert ok.by == "reconciler" and ok.run_id and ok.budget_s == 30.0
    summary = await world.summary(ok.run_id)
    assert summary is not None and summary["status"] == "completed"


async def test_a_paused_runtime_makes_the_turn_slow_never_a_hang(world: StackClient) -> None:
    runtime = world.stack.services["runtime"].process
    assert runtime is not None
    runtime.send_signal(signal.SIGSTOP)
    try:
        code, turn = await _check(world, "--budget", "2")
    finally:
        runtime.send_signal(signal.SIGCONT)
    assert (code, turn["result"]) == (1, SyntheticResult.SLOW), turn
    assert "within the budget of 2s" in turn["reason"] and turn["run_id"] in turn["reason"]
    # Resumed, the runtime finishes the run the probe gave up waiting for.
    assert (await world.wait_terminal(turn["run_id"]))["status"] == "completed"


async def test_a_bad_key_or_no_gateway_is_a_failed_turn_that_says_why(world: StackClient) -> None:
    code, turn = await _check(world, "--key", "csk_0123456789abcdef_" + "x" * 43)
    assert (code, turn["result"]) == (1, SyntheticResult.FAILED) and "401" in turn["reason"], turn
    code, turn = await _check(world, "--gateway", f"http://127.0.0.1:{free_port()}")
    assert (code, turn["result"]) == (1, SyntheticResult.FAILED) and "did not answer" in turn["reason"], turn


async def test_the_synthetic_key_reads_only_its_own_tenant_and_operates_nothing(world: StackClient) -> None:
    theirs, _ = await world.start_run(text="hello")
    code, turn = await _check(world)
    assert code == 0, turn
    headers = auth_header(_synthetic_key(world))
    own = await world.http.get(f"{world.stack.gateway_url}/v1/runs/{turn['run_id']}", headers=headers)
    assert own.status_code == 200
    other = await world.http.get(f"{world.stack.gateway_url}/v1/runs/{theirs}", headers=headers)
    assert other.status_code == 404  # another tenant's run is not found, as a run that does not exist
    operate = await world.http.post(
        f"{world.stack.gateway_url}/v1/runs/{turn['run_id']}/reconcile", headers=headers
    )
    assert operate.status_code == 403, operate.text
    # A leaked probe key may only search: a booking run is refused before anything is published.
    booking = await world.http.post(
        f"{world.stack.gateway_url}/v1/events",
        params={"agent": "booking"},
        json=guest_event(text="Book a room in Lisbon from 2031-12-01 to 2031-12-03"),
        headers=headers,
    )
    assert booking.status_code == 403, booking.text
    assert booking.json()["error"]["details"] == {
        "agent": "booking",
        "allowed": "synthetic",
        "tenant": SYNTHETIC_TENANT,
        "key_id": _synthetic_key(world).split("_")[1],
    }


async def test_the_audit_finds_nothing_wrong_with_synthetic_runs(world: StackClient) -> None:
    code, turn = await _check(world)
    assert code == 0, turn
    audited = await crashsafe("audit", env=cli_env(world.stack))
    assert audited.returncode == 0, audited.stdout + audited.stderr
    assert "nothing wrong" in audited.stdout


# Degraded modes ------------------------------------------------------------------------------------------------


async def test_without_policy_documents_a_policy_question_is_handed_off_and_a_booking_completes(
    world: StackClient,
) -> None:
    question, _ = await world.start_run(text="What is the cancellation policy?")
    asked = await world.wait_terminal(question)
    assert asked["status"] == "handed_off" and asked["handoff_reason"] == HandOffReason.POLICY_UNAVAILABLE
    assert asked["reply"] == handoff_reply(HandOffReason.POLICY_UNAVAILABLE)
    events = await world.events(question)
    assert [e["type"] for e in events] == ["run.started", "run.handed_off"]  # no model call, nothing invented
    assert "no policy documents" in events[-1]["detail"]

    booking, guest = await world.start_run()
    assert (await world.wait_terminal(booking))["status"] == "completed"
    counts = await world.counts(guest)
    assert (counts["booking"], counts["charge"]) == (1, 1), counts
