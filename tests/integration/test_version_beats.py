"""Which release wrote what, and which releases are alive (issue 30): every publish carries `Crashsafe-Version`;
each service process keeps a heartbeat in `<ns>_versions` with its own role's credential, renewed under a TTL,
gone when it stops or dies; a bucket an older `infra apply` never made costs a warning, never the service."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from crashsafe.contracts.headers import Header
from crashsafe.contracts.heartbeats import beat_decoder
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.release import RUNS_BESIDE_SINCE, VERSION
from crashsafe.contracts.streams import KvSpec, versions_spec
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.natsd import NatsServer
from crashsafe.services.operations.version_census import census
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.version_beats import VersionBeats
from tests.support.broker import ensure_streams
from tests.support.nats_users import access
from tests.support.waiting import eventually

LOG = logging.getLogger("tests.version_beats")


@pytest.fixture
async def as_payment(nats_server: NatsServer) -> AsyncIterator[Broker]:
    """A connection with the payment executors' credential: what its heartbeat may and may not write."""
    b = await Broker.connect(
        nats_server.url, "tests-payment", access=access(nats_server.url, Role.EXECUTOR, "payment")
    )
    yield b
    await b.close()


async def test_every_publish_carries_the_release_that_wrote_it(broker: Broker, namespace: Namespace) -> None:
    await ensure_streams(broker, namespace)
    stream = namespace.stream(StreamKind.DEAD_LETTERS)
    subject = namespace.dead_letters("runtime")
    # A header of the caller's own (a copied message's) does not stand for this process's release.
    await broker.publish(subject, b"{}", headers={Header.VERSION.value: "0.0.1", "traceparent": "x"})
    await broker.publish(subject, b"{}", msg_id="m1")
    stored = await broker.read_subject(stream, subject)
    assert [m.headers.get(Header.VERSION) for m in stored] == [VERSION, VERSION]
    assert stored[0].headers.get("traceparent") == "x"


async def test_a_heartbeat_is_kept_while_the_process_lives_and_taken_away_when_it_stops(
    broker: Broker, as_payment: Broker, namespace: Namespace
) -> None:
    await ensure_streams(broker, namespace)
    spec = versions_spec(namespace)
    beats = VersionBeats(as_payment, namespace, Role.EXECUTOR, "pod.payment-0", LOG, "payment", every_s=0.2)
    beats.start()
    try:
        first = await eventually(lambda: broker.kv_get(spec, beats.key), what="the first heartbeat")
        assert beats.key == "beat.executor-payment.pod_payment-0"
        beat = beat_decoder.decode(first.value)
        assert (beat.version, beat.runs_beside_since) == (VERSION, RUNS_BESIDE_SINCE)
        assert (beat.service, beat.worker) == ("executor-payment", "pod.payment-0")
        renewed = await eventually(
            lambda: _renewed(broker, spec, beats.key, first.revision), what="the heartbeat renewed"
        )
        assert beat_decoder.decode(renewed).beat_at > beat.beat_at
        seen = await census(broker, namespace, looks=1)
        assert seen.bucket and [(b.service, b.version) for b in seen.beats] == [("executor-payment", VERSION)]
    finally:
        await beats.stop()
    assert await broker.kv_get(spec, beats.key) is None
    assert (await census(broker, namespace, looks=1)).beats == []


async def _renewed(broker: Broker, spec: KvSpec, key: str, revision: int) -> bytes | None:
    entry = await broker.kv_get(spec, key)
    return entry.value if entry is not None and entry.revision > revision else None


async def test_a_heartbeat_not_renewed_expires_with_its_ttl(
    broker: Broker, as_payment: Broker, namespace: Namespace
) -> None:
    """A process killed without a clean stop: the server removes its last heartbeat once the TTL runs out."""
    await ensure_streams(broker, namespace)
    spec = versions_spec(namespace)
    beats = VersionBeats(as_payment, namespace, Role.EXECUTOR, "w1", LOG, "payment", ttl_s=1)
    assert await beats.beat_once()  # and never again, as if SIGKILLed
    assert await broker.kv_get(spec, beats.key) is not None
    await eventually(
        lambda: _gone(broker, spec, beats.key), what="the heartbeat expired", timeout_s=15, every_s=0.25
    )


async def _gone(broker: Broker, spec: KvSpec, key: str) -> bool:
    return await broker.kv_get(spec, key) is None


async def test_a_heartbeat_may_not_be_written_for_another_service(
    as_payment: Broker, namespace: Namespace
) -> None:
    beats = VersionBeats(as_payment, namespace, Role.EXECUTOR, "w1", LOG, "booking")
    assert not await beats.beat_once()  # refused: another family's key; serving goes on


async def test_without_the_bucket_a_service_warns_once_and_goes_on(
    broker: Broker, as_payment: Broker, namespace: Namespace, caplog: pytest.LogCaptureFixture
) -> None:
    """An older `infra apply` made no versions bucket: the heartbeat is skipped, the process is not stopped."""
    beats = VersionBeats(as_payment, namespace, Role.EXECUTOR, "w1", LOG, "payment", every_s=0.1)
    with caplog.at_level(logging.INFO, logger=LOG.name):
        beats.start()
        await eventually(lambda: "not written" in caplog.text, what="the warning")
        assert not await beats.beat_once()
        await beats.stop()  # nothing to take away, and no error either
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "crashsafe infra apply" in warnings[0].getMessage()
    versions = [r for r in caplog.records if r.getMessage() == "crashsafe version"]
    assert len(versions) == 1 and versions[0].fields["version"] == VERSION  # type: ignore[attr-defined]
    assert (await census(broker, namespace, looks=1)).bucket is False
