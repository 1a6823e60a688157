"""Every process of a real stack answers /healthz, /readyz and /metrics at the `ops_url` stack.json gives it, and
after a booking the metrics say what happened: runs started, steps, model calls, the charge, gateway requests,
and each payment partition's lease held by exactly one of two replicas, moving when one is paused."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from crashsafe.contracts.streams import sessions_spec
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import Settings
from tests.support.stack import StackClient, open_stack
from tests.support.waiting import eventually

PAYMENT_REPLICAS = ("executor-payment-0", "executor-payment-1")
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(scope="module")
async def world(
    nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[StackClient]:
    """One stack for the module, with two payment executor replicas sharing the partitions."""
    async with open_stack(
        tmp_path_factory.mktemp("metrics"),
        nats_url=nats_server.url,
        namespace=f"m{uuid.uuid4().hex[:10]}",
        scale={"executor-payment": 2},
    ) as client:
        yield client


def ops_urls(world: StackClient) -> dict[str, str]:
    """What an operator reads: stack.json's `ops_url` of every process that has one."""
    state = json.loads((world.stack.state_dir / "stack.json").read_text())
    return {s["name"]: s["ops_url"] for s in state["services"] if s["ops_url"]}


async def scrape(url: str) -> Samples:
    async with httpx.AsyncClient(timeout=10.0) as http:
        response = await http.get(f"{url}/metrics")
    assert response.status_code == 200, response.text[:200]
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name` over every series whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(value for (n, got), value in samples.items() if n == name and wanted <= got)


def owned(samples: Samples) -> set[int]:
    return {
        int(dict(labels)["partition"])
        for (name, labels), value in samples.items()
        if name == "crashsafe_partition_lease_owned" and dict(labels)["family"] == "payment" and value == 1
    }


async def test_every_process_is_alive_and_ready_at_its_ops_url(world: StackClient) -> None:
    urls = ops_urls(world)
    expected = {"gateway", "runtime", "reconciler", "projector", *PAYMENT_REPLICAS}
    assert expected <= set(urls), urls
    assert "sandbox" not in urls
    assert len(set(urls.values())) == len(urls)  # every process its own port
    async with httpx.AsyncClient(timeout=10.0) as http:
        for name, url in urls.items():
            health = await http.get(f"{url}/healthz")
            assert health.status_code == 200 and health.json() == {"status": "ok"}, name
            ready = await http.get(f"{url}/readyz")
            body = ready.json()
            assert ready.status_code == 200 and body["ready"] is True and body["missing"] == [], (name, body)
            assert body["checks"] and set(body["checks"].values()) == {"ok"}, (name, body)
            assert "nats" in body["checks"], name
        runtime = (await http.get(f"{urls['runtime']}/readyz")).json()["checks"]
        assert any(check.startswith("consumer:") for check in runtime)
        gateway = (await http.get(f"{urls['gateway']}/readyz")).json()["checks"]
        assert any(check.startswith("bucket:") for check in gateway)


async def test_a_booking_shows_in_every_services_metrics(world: StackClient) -> None:
    urls = ops_urls(world)
    run_id, _ = await world.start_run()
    summary = await world.wait_terminal(run_id)
    assert summary["status"] == "completed", summary

    runtime = await scrape(urls["runtime"])
    assert total(runtime, "crashsafe_runs_started_total", agent="booking") >= 1
    assert total(runtime, "crashsafe_runs_completed_total", agent="booking") >= 1
    assert total(runtime, "crashsafe_step_seconds_count", agent="booking") > 0
    assert total(runtime, "crashsafe_model_call_seconds_count", outcome="ok") > 0
    assert total(runtime, "crashsafe_ready", check="nats") == 1
    assert total(runtime, "process_resident_memory_bytes") > 0  # the process collector, per process

    payments = [await scrape(urls[name]) for name in PAYMENT_REPLICAS]
    charged = sum(
        total(p, "crashsafe_provider_calls_total", tool="create_payment", outcome="succeeded")
        for p in payments
    )
    assert charged >= 1
    assert (
        sum(total(p, "crashsafe_provider_call_seconds_count", tool="create_payment") for p in payments) >= 1
    )
    # Each partition held by one replica at most, ever; and (once a hand-over in flight lands: a replica that
    # joined late takes its share at its next lease round) by exactly one, the two covering them all.
    partitions = Settings.from_env({}).partitions

    async def split() -> list[set[int]] | None:
        held = [owned(await scrape(urls[name])) for name in PAYMENT_REPLICAS]
        assert held[0].isdisjoint(held[1]), f"a partition held by both replicas: {held}"
        return held if held[0] | held[1] == set(range(partitions)) and all(held) else None

    # (the replica started second joins once the first sees its member record and lets half go)
    await eventually(split, what="the payment partitions split between the two replicas")

    gateway = await scrape(urls["gateway"])
    assert total(gateway, "crashsafe_gateway_requests_total", route="/v1/events", status="202") >= 1
    assert total(gateway, "crashsafe_gateway_request_seconds_count", route="/v1/events") >= 1

    # Gauges sampled every few seconds: the lag of the runtime's durables, the projector's backlog per tool.
    await eventually(
        lambda: _has(urls["runtime"], "crashsafe_consumer_lag"), what="the runtime's consumer lag sampled"
    )
    await eventually(
        lambda: _has(urls["projector"], "crashsafe_projection_backlog"),
        what="the projector's backlog sampled",
    )


async def test_a_callers_path_never_becomes_a_label_value(world: StackClient) -> None:
    """Hostile paths are counted under the route they matched, so a caller cannot mint series (or inject text
    into the exposition); /metrics itself needs no key, like the probes, and says nothing about tenants."""
    hostile = "run_<script>alert(1)</script>"
    answered = await world.gateway.get(f"/v1/runs/{hostile}")
    assert answered.status_code in (400, 404)
    async with httpx.AsyncClient(timeout=10.0) as anonymous:
        text = (await anonymous.get(f"{world.stack.gateway_url}/metrics")).text
    assert "<script>" not in text and "alert(1)" not in text
    assert world.api_key not in text
    samples = await scrape(ops_urls(world)["gateway"])
    routes = {
        dict(labels).get("route") for name, labels in samples if name == "crashsafe_gateway_requests_total"
    }
    assert "/v1/runs/{run_id}" in routes, routes


async def _has(url: str, name: str) -> bool:
    return any(n == name for n, _ in await scrape(url))


async def test_a_paused_replicas_leases_move_to_the_other(world: StackClient) -> None:
    urls = ops_urls(world)
    partitions = Settings.from_env({}).partitions
    paused, other = PAYMENT_REPLICAS
    process = world.stack.services[paused].process
    assert process is not None
    os.kill(process.pid, signal.SIGSTOP)
    try:

        async def other_holds_all() -> set[int] | None:
            held = owned(await scrape(urls[other]))
            return held if held == set(range(partitions)) else None

        await eventually(other_holds_all, what=f"{other} to hold every payment partition", timeout_s=60)
        async with httpx.AsyncClient(timeout=10.0) as http:
            assert (await http.get(f"{urls[other]}/readyz")).status_code == 200
    finally:
        os.kill(process.pid, signal.SIGCONT)

    async def resumed_and_ready() -> Any:
        async with httpx.AsyncClient(timeout=10.0) as http:
            return (await http.get(f"{urls[paused]}/readyz")).status_code == 200

    await eventually(resumed_and_ready, what=f"{paused} ready again once resumed")


async def test_a_bucket_deleted_under_the_stack_turns_gateway_and_runtime_unready_until_provisioned(
    world: StackClient, broker: Broker
) -> None:
    """Last in the module: the operator deletes the session lanes bucket by mistake; the gateway and the runtime
    (both use it) answer 503 naming it, the projector (which does not) stays ready; `infra apply` restores."""
    urls = ops_urls(world)
    lanes = sessions_spec(world.ns)
    await broker.js.delete_stream(lanes.stream)

    async def unready(name: str) -> dict[str, Any] | None:
        async with httpx.AsyncClient(timeout=10.0) as http:
            answer = await http.get(f"{urls[name]}/readyz")
        body = answer.json()
        return body if answer.status_code == 503 else None

    for name in ("gateway", "runtime"):
        body = await eventually(lambda n=name: unready(n), what=f"{name} to say the bucket is gone")
        assert body["missing"] == [lanes.bucket], (name, body)
        assert body["checks"][f"bucket:{lanes.bucket}"] == f"bucket {lanes.bucket} does not exist"
    assert await unready("projector") is None

    await asyncio.to_thread(world.stack.provision)  # `crashsafe infra apply`, as the operator
    for name in ("gateway", "runtime"):
        await eventually(lambda n=name: _ready(urls[n]), what=f"{name} ready again once provisioned")


async def _ready(url: str) -> bool:
    async with httpx.AsyncClient(timeout=10.0) as http:
        return (await http.get(f"{url}/readyz")).status_code == 200
