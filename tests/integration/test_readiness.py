"""Each service's /readyz over its real seams: 503 naming the check when its stream, bucket, consumer, member
record or store goes (or NATS does), 200 again once restored; /healthz answers throughout and never asks NATS.
A service whose subjects no stream takes, or whose durable is of another shape, never takes work nor says
`ready:` (issue 30: a rollout must stop at a new pod that cannot serve, not kill the old ones)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from crashsafe.contracts.errors import ConsumerShapeChanged, SeamBroken
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.streams import (
    executor_consumer,
    projection_consumer,
    projections_spec,
    runtime_consumers,
    stream_specs,
)
from crashsafe.contracts.subjects import EventClass, Namespace, StreamKind
from crashsafe.natsd import NatsAuth, NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.probes import OpsServer
from crashsafe.services.platform.provisioning import provision
from tests.support import inprocess
from tests.support.nats_users import access, admit
from tests.support.waiting import eventually


@asynccontextmanager
async def ops_port(checks: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The service's ops server on a free port, as its composition root starts it, and a client of it."""
    server = await OpsServer("127.0.0.1", 0).start()
    server.serve(checks)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=10.0) as http:
            yield http
    finally:
        await server.stop()


async def readyz(http: httpx.AsyncClient) -> tuple[int, dict[str, Any]]:
    response = await http.get("/readyz")
    return response.status_code, response.json()


async def ready(http: httpx.AsyncClient) -> bool:
    status, body = await readyz(http)
    return status == 200 and body["ready"] is True


async def failing(http: httpx.AsyncClient, check: str) -> dict[str, Any] | None:
    status, body = await readyz(http)
    return body if status == 503 and body["checks"].get(check, "ok") != "ok" else None


async def test_runtime_readiness_names_its_deleted_consumer_then_recovers(
    nats_server: NatsServer, namespace: Namespace, broker: Broker
) -> None:
    settings = inprocess.settings_for(nats_server.url, namespace)
    async with inprocess.runtime(settings) as worker:
        await worker.start()
        async with ops_port(worker.ops_checks) as http:
            status, body = await readyz(http)
            assert status == 200, body
            inbound, outcomes = runtime_consumers(namespace, settings.ack_wait_s)
            assert {f"consumer:{c.durable}" for c in (inbound, outcomes)} <= set(body["checks"])
            assert body["missing"] == [] and set(body["checks"].values()) == {"ok"}

            await broker.js.delete_consumer(outcomes.stream, outcomes.durable)
            body = await eventually(
                lambda: failing(http, f"consumer:{outcomes.durable}"), what="readyz names the consumer"
            )
            assert "does not exist" in body["checks"][f"consumer:{outcomes.durable}"]
            assert body["missing"] == [outcomes.durable]
            assert (await http.get("/healthz")).json() == {"status": "ok"}

            await broker.ensure_consumer(outcomes)
            await eventually(lambda: ready(http), what="ready again once the consumer is back")


async def test_executor_readiness_covers_its_member_record_consumers_and_stores(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, tmp_path: Path
) -> None:
    settings = inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path)
    async with inprocess.executor(settings, "payment") as worker, ops_port(worker.ops_checks) as http:
        status, body = await readyz(http)
        assert status == 200, body
        held = worker.partitions
        assert held == list(range(settings.partitions))
        assert {"member", *(f"store:{p}" for p in held)} <= set(body["checks"])

        # Its member record gone (an operator's mistake, or a renewal that did not land): not ready until
        # the next lease round writes it again.
        await broker.kv_delete(worker.keeper.spec, namespace.member_key("payment", settings.worker_id))
        await eventually(lambda: ready(http), what="ready again after the next lease round")

        consumer = worker.readiness.consumers()[0]
        await broker.js.delete_consumer(consumer.stream, consumer.durable)
        await eventually(
            lambda: failing(http, f"consumer:{consumer.durable}"), what="readyz names the consumer"
        )
        await broker.ensure_consumer(consumer)
        await eventually(lambda: ready(http), what="ready again once the consumer is back")

        store = worker.stores[held[-1]]
        await store.close()  # a store that no longer answers
        body = await eventually(lambda: failing(http, f"store:{held[-1]}"), what="readyz names the store")
        assert body["missing"] == [str(held[-1])]


async def test_an_executor_given_a_partition_another_holds_is_not_ready_until_it_holds_it(
    nats_server: NatsServer, namespace: Namespace, tmp_path: Path
) -> None:
    """Explicit partitions (`CRASHSAFE_PARTITIONS=0`) are still leased: a second replica given the same one
    waits, not ready, naming the lease, until the first lets it go."""
    base = inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path)
    only_0 = dataclasses.replace(base.with_partitions("0"), lease_s=2)
    first = dataclasses.replace(only_0, worker_id="first")
    second = dataclasses.replace(only_0, worker_id="second")
    async with inprocess.executor(second, "payment", start=False) as waiting:
        async with inprocess.executor(first, "payment") as holder:
            assert holder.partitions == [0]
            await waiting.start()
            async with ops_port(waiting.ops_checks) as http:
                status, body = await readyz(http)
                assert status == 503 and body["checks"]["lease:0"] == "partition 0: not held", body
                assert "member" not in body["checks"]  # an explicit list has no member record
                metrics_text = (await http.get("/metrics")).text
                assert 'crashsafe_partition_lease_owned{family="payment",partition="0"} 0.0' in metrics_text
        # The holder closed: it handed the lease back, and the waiting replica takes it at its next round.
        async with ops_port(waiting.ops_checks) as http:
            await eventually(lambda: ready(http), what="the second replica ready once it holds partition 0")
            assert waiting.partitions == [0]
            metrics_text = (await http.get("/metrics")).text
            assert 'crashsafe_partition_lease_owned{family="payment",partition="0"} 1.0' in metrics_text


async def test_projector_readiness_names_a_workers_consumer(
    nats_server: NatsServer, namespace: Namespace, broker: Broker
) -> None:
    settings = inprocess.settings_for(nats_server.url, namespace)
    async with inprocess.projector(settings) as worker, ops_port(worker.ops_checks) as http:
        assert await ready(http), await readyz(http)
        tool = sorted(worker.tools)[0]
        spec = projection_consumer(namespace, tool, settings.ack_wait_s)
        await broker.js.delete_consumer(spec.stream, spec.durable)
        await eventually(lambda: failing(http, f"consumer:{spec.durable}"), what="readyz names it")
        await broker.ensure_consumer(spec)
        await eventually(lambda: ready(http), what="ready again once the consumer is back")


async def test_reconciler_readiness_names_a_deleted_bucket_and_stream(
    nats_server: NatsServer, namespace: Namespace, broker: Broker
) -> None:
    settings = inprocess.settings_for(nats_server.url, namespace)
    async with inprocess.reconciler(settings) as worker, ops_port(worker.ops_checks) as http:
        assert await ready(http), await readyz(http)
        receipts = projections_spec(namespace)
        dead = namespace.stream(StreamKind.DEAD_LETTERS)
        await broker.js.delete_stream(receipts.stream)
        await broker.js.delete_stream(dead)
        body = await eventually(lambda: failing(http, f"bucket:{receipts.bucket}"), what="names it")
        assert body["checks"][f"stream:{dead}"] == f"stream {dead} does not exist"
        assert sorted(body["missing"]) == sorted([receipts.bucket, dead])
        await provision(broker, namespace)  # the operator's `crashsafe infra apply`
        await eventually(lambda: ready(http), what="ready again once provisioned")


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[NatsServer]:
    """A server of this test's own, to stop and start again (the session's is shared)."""
    from tests.conftest import REGISTRY, TEST_ONLY_FAMILIES

    auth = NatsAuth.for_deployment(tmp_path / "auth", None, REGISTRY.families | TEST_ONLY_FAMILIES)
    server = NatsServer(tmp_path / "nats", auth=auth).start()
    admit(server)
    yield server
    server.stop()


async def test_without_nats_readiness_says_nats_and_liveness_stays_up(
    own_nats: NatsServer, namespace: Namespace, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="crashsafe.jetstream")
    settings = inprocess.settings_for(own_nats.url, namespace)
    async with inprocess.runtime(settings) as worker:
        await worker.start()
        async with ops_port(worker.ops_checks) as http:
            assert await ready(http), await readyz(http)
            own_nats.stop()
            body = await eventually(lambda: failing(http, "nats"), what="readyz says NATS is gone")
            assert body["missing"] == ["nats"] and list(body["checks"]) == ["nats"]
            health = await http.get("/healthz")
            assert health.status_code == 200 and health.json() == {"status": "ok"}
            metrics_text = (await http.get("/metrics")).text
            assert 'crashsafe_ready{check="nats"} 0.0' in metrics_text
            failed = lambda: [r for r in caplog.records if "(retrying)" in r.getMessage()]  # noqa: E731
            await eventually(lambda: len(failed()) >= 3, what="several reconnect attempts to fail")
            own_nats.start()
            await eventually(lambda: ready(http), what="ready again once NATS is back")
            assert 'crashsafe_ready{check="nats"} 1.0' in (await http.get("/metrics")).text
    # The outage is one WARNING when it starts and one INFO when it ends, not a line per attempt.
    attempts = failed()
    assert [r.levelno for r in attempts].count(logging.WARNING) == 1
    assert all(r.levelno == logging.DEBUG for r in attempts[1:])
    back = [r for r in caplog.records if "back after" in r.getMessage()]
    assert back and back[0].levelno == logging.INFO


async def test_before_the_service_is_up_it_is_alive_and_not_ready() -> None:
    server = await OpsServer("127.0.0.1", 0).start()
    try:
        async with httpx.AsyncClient(base_url=server.url) as http:
            assert (await http.get("/healthz")).status_code == 200
            status, body = await readyz(http)
            assert status == 503 and body["missing"] == ["started"]
            assert (await http.get("/metrics")).headers["content-type"].startswith("text/plain")
            assert (await http.post("/readyz")).status_code == 405
    finally:
        await server.stop()


async def test_a_paused_nats_makes_readiness_fail_in_time_and_liveness_stays_up(
    own_nats: NatsServer, namespace: Namespace
) -> None:
    """SIGSTOP: the socket stays open and nothing answers (the client still thinks it is connected). Each probe
    must still answer well inside Kubernetes' 1 s, 503 naming what did not answer."""
    import os
    import signal
    import time

    settings = inprocess.settings_for(own_nats.url, namespace)
    async with inprocess.runtime(settings) as worker:
        await worker.start()
        async with ops_port(worker.ops_checks) as http:
            assert await ready(http), await readyz(http)
            assert own_nats.process is not None
            os.kill(own_nats.process.pid, signal.SIGSTOP)
            try:
                for _ in range(3):
                    started = time.monotonic()
                    status, body = await readyz(http)
                    assert time.monotonic() - started < 1.0
                    assert status == 503 and body["missing"], body
                    health = await http.get("/healthz")
                    assert health.status_code == 200
            finally:
                os.kill(own_nats.process.pid, signal.SIGCONT)
            await eventually(lambda: ready(http), what="ready again once NATS answers")


async def test_a_consumer_no_longer_sampled_leaves_no_lag_gauge_behind(
    broker: Broker, namespace: Namespace
) -> None:
    """An executor that hands a partition on stops sampling its durable: its last lag (high, in a takeover under
    load) must not stay on this replica's /metrics for ever beside the new holder's live one."""
    from crashsafe.contracts.streams import ConsumerSpec, StreamSpec
    from crashsafe.services.platform import metrics
    from crashsafe.services.platform.probes import lag_sampler

    stream = f"{namespace.name.upper()}_LAG"
    await broker.ensure_stream(StreamSpec(name=stream, subjects=(f"{namespace.name}.lag.>",)))
    specs = [ConsumerSpec(stream, f"{namespace.name}_p{p}", f"{namespace.name}.lag.{p}") for p in (0, 1)]
    for spec in specs:
        await broker.ensure_consumer(spec)
    for p in (0, 1):
        await broker.publish(f"{namespace.name}.lag.{p}", b"x")
    held = list(specs)
    sample = lag_sampler(broker, lambda: held)
    await sample()

    def lags() -> dict[str, float]:
        text = metrics.exposition().decode()
        return {
            line.split('consumer="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("crashsafe_consumer_lag{") and f'stream="{stream}"' in line
        }

    assert lags() == {specs[0].durable: 1.0, specs[1].durable: 1.0}
    held.pop()  # partition 1 handed on
    await sample()
    assert lags() == {specs[0].durable: 1.0}


# Seams against the live broker (issue 30) ------------------------------------------------------------------------


async def _old_runs_stream(broker: Broker, ns: Namespace) -> None:
    """RUNS as a release before event classes declared it: `<ns>.run.*`, which takes no run event of this one."""
    runs = next(spec for spec in stream_specs(ns) if spec.name == ns.stream(StreamKind.RUNS))
    await broker.js.delete_stream(runs.name)
    await broker.ensure_stream(dataclasses.replace(runs, subjects=(ns.legacy_run_events_all,)))


@dataclasses.dataclass
class _Served:
    """A service in its own process, as Kubernetes runs it: what it printed, and a client of its ops port."""

    process: asyncio.subprocess.Process
    printed: list[str]
    http: httpx.AsyncClient

    @property
    def said_ready(self) -> bool:
        return any(line.startswith("ready:") for line in self.printed)


@asynccontextmanager
async def _serve_runtime(nats_server: NatsServer, ns: Namespace, tmp_path: Path) -> AsyncIterator[_Served]:
    key = tmp_path / "signing.pem"
    key.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    )
    env = {
        **os.environ,
        "CRASHSAFE_NATS_URL": nats_server.url,
        "CRASHSAFE_NAMESPACE": ns.name,
        "CRASHSAFE_NATS_CREDS": str(access(nats_server.url, Role.RUNTIME).creds),
        "CRASHSAFE_CAPABILITY_SIGNING_KEY": str(key),
        "CRASHSAFE_OPS_PORT": "0",
        "CRASHSAFE_DATA_DIR": str(tmp_path),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crashsafe.cli", "serve", "runtime", env=env, stdout=asyncio.subprocess.PIPE
    )
    printed: list[str] = []

    async def read() -> None:
        assert process.stdout is not None
        async for line in process.stdout:
            printed.append(line.decode().strip())

    reading = asyncio.create_task(read())
    try:
        listening = await eventually(
            lambda: next((line for line in printed if line.startswith("ops listening on ")), None),
            what="the runtime's ops port",
        )
        async with httpx.AsyncClient(base_url=listening.split()[-1], timeout=10.0) as http:
            yield _Served(process, printed, http)
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                process.kill()
                await process.wait()
        await reading


async def test_a_runtime_whose_run_events_no_stream_takes_is_never_ready_until_the_stream_takes_them(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, tmp_path: Path
) -> None:
    """RUNS left on the old layout (`<ns>.run.*`): every append of this runtime would be refused. It takes no
    message, its /readyz names each run-event subject and the stream, and it never prints `ready:`; once the
    operator's `infra apply` makes RUNS take them too, it starts by itself."""
    await inprocess.provisioned(inprocess.settings_for(nats_server.url, namespace))
    await _old_runs_stream(broker, namespace)
    runs = namespace.stream(StreamKind.RUNS)
    step, milestone = (f"subject:{namespace.run_event('readyz', kind)}" for kind in EventClass)
    async with _serve_runtime(nats_server, namespace, tmp_path) as served:
        body = await eventually(lambda: failing(served.http, step), what="readyz names the run-event subject")
        assert body["checks"][step] == (
            f"no stream takes {namespace.run_event('readyz', EventClass.STEP)}: stream {runs} takes only"
            f" {namespace.legacy_run_events_all}; run `crashsafe infra apply` with this release"
        )
        assert body["checks"][milestone] != "ok" and body["checks"]["started"] != "ok"
        assert namespace.run_event("readyz", EventClass.STEP) in body["missing"]
        assert set(body["missing"]) == {"started", step.split(":", 1)[1], milestone.split(":", 1)[1]}
        inbound = runtime_consumers(namespace)[0]
        await broker.publish(namespace.inbound("run_000000000000000000000001"), b"{}")
        await asyncio.sleep(6.0)  # past a retry of its start
        assert not served.said_ready, served.printed
        assert (await broker.js.consumer_info(inbound.stream, inbound.durable)).num_pending == 1  # untaken

        await provision(broker, namespace)  # the operator's `crashsafe infra apply`: RUNS takes both layouts
        await eventually(lambda: served.said_ready, what="`ready: runtime` once RUNS takes its subjects")
        assert await ready(served.http), await readyz(served.http)


async def test_a_runtime_that_finds_its_durable_in_another_shape_leaves_it_and_is_never_ready(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, tmp_path: Path
) -> None:
    """`runtime_outcomes` as an older release reads it (pushed): left exactly as it is, /readyz names it and
    what differs, no `ready:`; once that release is gone and the operator removes it, the runtime makes its own."""
    await inprocess.provisioned(inprocess.settings_for(nats_server.url, namespace))
    outcomes = runtime_consumers(namespace)[1]
    older = dataclasses.replace(outcomes, pull=False)
    await broker.ensure_consumer(older)
    made = (await broker.js.consumer_info(outcomes.stream, outcomes.durable)).created
    check = f"consumer:{outcomes.durable}"
    async with _serve_runtime(nats_server, namespace, tmp_path) as served:
        body = await eventually(lambda: failing(served.http, check), what="readyz names the consumer")
        assert body["checks"][check] == (
            f"consumer {outcomes.durable} on {outcomes.stream} is of another shape: deliver_subject declared"
            f" none (pull), found {older.deliver_subject} (push); deliver_group declared none, found"
            f" {outcomes.durable}"
        )
        assert set(body["missing"]) == {"started", outcomes.durable}
        await asyncio.sleep(6.0)  # past a retry of its start
        assert not served.said_ready, served.printed
        info = await broker.js.consumer_info(outcomes.stream, outcomes.durable)
        assert (info.created, info.config.deliver_subject) == (made, older.deliver_subject)

        await broker.js.delete_consumer(outcomes.stream, outcomes.durable)
        await eventually(lambda: served.said_ready, what="`ready: runtime` once the consumer is its own")
        info = await broker.js.consumer_info(outcomes.stream, outcomes.durable)
        assert info.config.deliver_subject is None


async def test_a_runtime_started_on_a_broken_seam_refuses_and_takes_no_work(
    nats_server: NatsServer, namespace: Namespace, broker: Broker
) -> None:
    """In process: `start` raises the typed refusal before it subscribes, so nothing is pulled."""
    settings = inprocess.settings_for(nats_server.url, namespace)
    async with inprocess.runtime(settings) as worker:
        await _old_runs_stream(broker, namespace)
        with pytest.raises(SeamBroken) as refused:
            await worker.start()
        step = f"subject:{namespace.run_event('readyz', EventClass.STEP)}"
        assert step in refused.value.checks and "stream" in refused.value.checks[step]
        inbound = runtime_consumers(namespace)[0]
        info = await broker.js.consumer_info(inbound.stream, inbound.durable)
        assert info.num_waiting == 0  # no pull request: it takes nothing

    namespace2 = Namespace(namespace.name + "b")
    settings = inprocess.settings_for(nats_server.url, namespace2)
    async with inprocess.runtime(settings) as worker:
        outcomes = runtime_consumers(namespace2)[1]
        await broker.ensure_consumer(
            dataclasses.replace(outcomes, filter_subject=f"{namespace2.name}.outcome._wake.*")
        )
        with pytest.raises(ConsumerShapeChanged) as shape:
            await worker.start()
        assert shape.value.durable == outcomes.durable and "filter_subjects" in shape.value.differences[0]


async def test_an_executor_proves_its_receipt_path_and_its_family_consumers_before_taking_a_partition(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, tmp_path: Path
) -> None:
    """OUTCOMES taking no outcome of its family: the executor refuses at start and holds no partition; a partition
    consumer of another shape, held by no one, is named too."""
    settings = inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path)
    await inprocess.provisioned(settings)
    outcomes = next(s for s in stream_specs(namespace) if s.name == namespace.stream(StreamKind.OUTCOMES))
    await broker.js.delete_stream(outcomes.name)
    await broker.ensure_stream(dataclasses.replace(outcomes, subjects=(f"{namespace.name}.outcome._wake.*",)))
    partition_3 = executor_consumer(namespace, "payment", 3, settings.ack_wait_s)
    await broker.ensure_consumer(dataclasses.replace(partition_3, max_deliver=5))
    async with inprocess.executor(settings, "payment", start=False) as worker:
        with pytest.raises(SeamBroken) as refused:
            await worker.start()
        assert worker.partitions == []
        failed = refused.value.checks
        assert failed[f"subject:{namespace.outcomes('payment', 'readyz')}"].startswith("no stream takes")
        assert "max_deliver declared" in failed[f"consumer:{partition_3.durable}"]
        async with ops_port(worker.ops_checks) as http:
            status, body = await readyz(http)
            assert status == 503 and partition_3.durable in body["missing"], body
