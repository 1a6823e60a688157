"""The reconciler's synthetic turn on the real nats-server, as the reconciler's own NATS user: a turn that cannot
be made (the key file unreadable, the gateway down) is a failed result saying why, in the metrics and on
`<ns>.ops.synthetic.reconciler`, never an exception that stops the reconciler; and the user may publish there
and nowhere else it had no right to before."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crashsafe.contracts.errors import NotPermitted
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.contracts.synthetic_turn import (
    SYNTHETIC_AGENT,
    SyntheticResult,
    SyntheticTurn,
    synthetic_decoder,
)
from crashsafe.natsd import NatsServer, free_port
from crashsafe.services.platform import metrics
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import Settings
from crashsafe.services.reconciler.synthetic_cadence import SyntheticCadence
from tests.support import inprocess
from tests.support.nats_users import access

WITH_SYNTHETIC = ("booking", SYNTHETIC_AGENT)  # a registry that runs the probe's agent


@pytest.fixture
async def reconciler_broker(nats_server: NatsServer, namespace: Namespace) -> AsyncIterator[Broker]:
    await inprocess.provisioned(inprocess.settings_for(nats_server.url, namespace))
    broker = await Broker.connect(
        nats_server.url, "tests-synthetic-reconciler", access=access(nats_server.url, Role.RECONCILER)
    )
    try:
        yield broker
    finally:
        await broker.close()


def _settings(nats_server: NatsServer, namespace: Namespace, key_file: Path, gateway: str) -> Settings:
    base = inprocess.settings_for(nats_server.url, namespace)
    return dataclasses.replace(
        base, synthetic_gateway_url=gateway, synthetic_key_file=key_file, synthetic_every_s=60.0
    )


async def _published(broker: Broker, ns: Namespace) -> list[SyntheticTurn]:
    stored = await broker.read_subject(ns.stream(StreamKind.OPS), ns.ops("synthetic", "reconciler"))
    return [synthetic_decoder.decode(m.data) for m in stored]


def _failed() -> float:
    return metrics.REGISTRY.get_sample_value("crashsafe_synthetic_turns_total", {"result": "failed"}) or 0.0


@pytest.mark.parametrize("case", ["key file missing", "key file empty", "gateway down"])
async def test_a_turn_that_cannot_be_made_is_a_failed_result_saying_why(
    nats_server: NatsServer, namespace: Namespace, reconciler_broker: Broker, tmp_path: Path, case: str
) -> None:
    key_file = tmp_path / "synthetic_key"
    if case != "key file missing":
        key_file.write_text("" if case == "key file empty" else "csk_0123456789abcdef_" + "s" * 43)
    gateway = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    settings = _settings(nats_server, namespace, key_file, gateway)
    cadence = SyntheticCadence.configured(
        reconciler_broker, settings, logging.getLogger("tests.synthetic"), agents=WITH_SYNTHETIC
    )
    assert cadence is not None
    before = _failed()

    await cadence.once()

    (turn,) = await _published(reconciler_broker, namespace)
    assert (turn.result, turn.by, turn.run_id) == (SyntheticResult.FAILED, "reconciler", "")
    expected = {
        "key file missing": "cannot be read",
        "key file empty": "is empty",
        "gateway down": "did not answer",
    }
    assert expected[case] in turn.reason, turn.reason
    assert _failed() == before + 1
    assert metrics.REGISTRY.get_sample_value("crashsafe_synthetic_up") == 0.0


def test_no_cadence_without_a_gateway_a_key_or_a_period(
    nats_server: NatsServer, namespace: Namespace
) -> None:
    settings = _settings(nats_server, namespace, Path("/k"), "http://gateway:8080")
    logger = logging.getLogger("tests.synthetic")
    on = SyntheticCadence.configured(None, settings, logger, agents=WITH_SYNTHETIC)  # type: ignore[arg-type]
    assert on is not None
    for off in (
        dataclasses.replace(settings, synthetic_every_s=0.0),
        dataclasses.replace(settings, synthetic_gateway_url=None),
        dataclasses.replace(settings, synthetic_key_file=None),
    ):
        assert SyntheticCadence.configured(None, off, logger, agents=WITH_SYNTHETIC) is None  # type: ignore[arg-type]


def test_no_cadence_for_a_registry_without_the_synthetic_agent(
    nats_server: NatsServer, namespace: Namespace, caplog: pytest.LogCaptureFixture
) -> None:
    """An adopter's registry has no `synthetic` agent: every turn would be a 422, so the turn is off, said once."""
    settings = _settings(nats_server, namespace, Path("/k"), "http://gateway:8080")
    logger = logging.getLogger("tests.synthetic")
    with caplog.at_level(logging.WARNING, logger="tests.synthetic"):
        off = SyntheticCadence.configured(None, settings, logger, agents=("desks",))  # type: ignore[arg-type]
    assert off is None
    assert [r.getMessage() for r in caplog.records if "synthetic turn is off" in r.getMessage()]


async def test_the_reconcilers_user_publishes_only_its_own_synthetic_subject(
    reconciler_broker: Broker, namespace: Namespace
) -> None:
    with pytest.raises(NotPermitted):
        await reconciler_broker.publish(namespace.ops("synthetic", "cli"), b"{}")
    with pytest.raises(NotPermitted):
        await reconciler_broker.publish(namespace.inbound("run_0123456789abcdef01234567"), b"{}")


async def test_a_gateway_answering_garbage_is_a_failed_turn_and_the_cadence_goes_on(
    nats_server: NatsServer, namespace: Namespace, reconciler_broker: Broker, tmp_path: Path
) -> None:
    """A wrong CRASHSAFE_SYNTHETIC_GATEWAY_URL (some other JSON service) answers shapes the judge never saw: the
    turn is failed, saying so; it must not raise out of `once` (the cadence's task would die unseen and
    crashsafe_synthetic_up keep its last 1 for ever)."""
    from aiohttp import web

    async def accepted(request: web.Request) -> web.Response:
        return web.json_response({"run_id": "run_x"}, status=202)

    async def run(request: web.Request) -> web.Response:
        return web.json_response({"status": "completed"})

    async def events(request: web.Request) -> web.Response:
        return web.json_response({"events": ["not an event", 7]})

    app = web.Application()
    app.router.add_post("/v1/events", accepted)
    app.router.add_get("/v1/runs/run_x", run)
    app.router.add_get("/v1/runs/run_x/events", events)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        key_file = tmp_path / "synthetic_key"
        key_file.write_text("csk_0123456789abcdef_" + "s" * 43)
        settings = _settings(nats_server, namespace, key_file, f"http://127.0.0.1:{port}")
        cadence = SyntheticCadence.configured(
            reconciler_broker, settings, logging.getLogger("tests.synthetic"), agents=WITH_SYNTHETIC
        )
        assert cadence is not None
        metrics.SYNTHETIC_UP.set(1)
        await cadence.once()
    finally:
        await runner.cleanup()
    (turn,) = await _published(reconciler_broker, namespace)
    assert turn.result == SyntheticResult.FAILED and turn.run_id == "run_x", turn
    assert metrics.REGISTRY.get_sample_value("crashsafe_synthetic_up") == 0.0
