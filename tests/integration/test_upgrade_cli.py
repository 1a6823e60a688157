"""The rolling upgrade's operator commands, as an operator runs them: `crashsafe upgrade check` (may this release run
beside what runs now), `crashsafe upgrade status` (has the rollout converged) and `crashsafe infra contract` (refused,
naming them, while older processes are alive; says so when there is nothing to contract)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from crashsafe.contracts.heartbeats import VersionBeat, beat_encoder
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.release import VERSION, previous_release
from crashsafe.contracts.streams import stream_specs, versions_spec
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from tests.support.broker import ensure_streams
from tests.support.nats_users import access
from tests.support.stack import CliResult, crashsafe

_PREVIOUS = previous_release()
assert _PREVIOUS is not None
PREVIOUS = _PREVIOUS.version  # a release inside this one's window


def _env(nats_server: NatsServer, namespace: Namespace) -> dict[str, str]:
    return {
        "CRASHSAFE_NATS_URL": nats_server.url,
        "CRASHSAFE_NAMESPACE": namespace.name,
        "CRASHSAFE_NATS_CREDS": str(access(nats_server.url, Role.OPERATOR).creds),
    }


async def _beat(broker: Broker, ns: Namespace, service: str, worker: str, version: str, since: str) -> None:
    now = datetime.now(UTC)
    beat = VersionBeat(
        version=version,
        runs_beside_since=since,
        service=service,
        worker=worker,
        pid=1,
        started_at=now,
        beat_at=now,
    )
    key = ns.version_beat_key(service, worker)
    await broker.kv_write(versions_spec(ns), key, beat_encoder.encode(beat), revision=None, ttl_s=120)


async def _run(env: dict[str, str], tmp_path: Path, *args: str) -> CliResult:
    result = await crashsafe(*args, "--state-dir", str(tmp_path), env=env)
    assert "Traceback" not in result.stderr, result.stderr
    return result


async def test_check_and_status_before_during_and_after_a_rollout(
    broker: Broker, nats_server: NatsServer, namespace: Namespace, tmp_path: Path
) -> None:
    env = _env(nats_server, namespace)
    await ensure_streams(broker, namespace)
    await _beat(broker, namespace, "runtime", "runtime-a", VERSION, "0.1.0")
    await _beat(broker, namespace, "executor-payment", "pay-0", PREVIOUS, "0.0.1")

    checked = await _run(env, tmp_path, "upgrade", "check")
    assert checked.returncode == 0, checked
    assert "runtime-a" in checked.stdout and "pay-0" in checked.stdout and "s ago" in checked.stdout
    status = await _run(env, tmp_path, "upgrade", "status")
    assert status.returncode == 1
    assert f"mixed: {PREVIOUS}: executor-payment pay-0; {VERSION}: runtime runtime-a" in status.stderr

    # A process this release may not run beside: named, and the check fails.
    await _beat(broker, namespace, "reconciler", "rec-0", "0.0.9", "0.0.1")
    refused = await _run(env, tmp_path, "upgrade", "check")
    assert refused.returncode == 1
    assert f"incompatible with {VERSION}" in refused.stderr and "reconciler rec-0 0.0.9" in refused.stderr

    for service, worker in (("executor-payment", "pay-0"), ("reconciler", "rec-0")):
        await broker.kv_delete(versions_spec(namespace), namespace.version_beat_key(service, worker))
    converged = await _run(env, tmp_path, "upgrade", "status")
    assert converged.returncode == 0, converged
    assert converged.stdout.strip() == f"converged on {VERSION} (1 process(es))"


async def test_contract_is_refused_while_an_older_process_is_alive(
    broker: Broker, nats_server: NatsServer, namespace: Namespace, tmp_path: Path
) -> None:
    env = _env(nats_server, namespace)
    await ensure_streams(broker, namespace)
    nothing = await _run(env, tmp_path, "infra", "contract")
    assert nothing.returncode == 0 and nothing.stdout.startswith("nothing to contract"), nothing

    # What an older release left: RUNS still taking a subject of its own (kept by `infra apply`).
    runs = next(s for s in stream_specs(namespace) if s.name == namespace.stream(StreamKind.RUNS))
    older = f"{namespace.name}.run_older.*"
    await broker.ensure_stream(replace(runs, subjects=(*runs.subjects, older)))
    await _beat(broker, namespace, "runtime", "runtime-old", "0.1.0", "0.0.1")
    refused = await _run(env, tmp_path, "infra", "contract")
    assert refused.returncode == 1
    assert "refused, nothing changed" in refused.stderr and "runtime runtime-old 0.1.0" in refused.stderr
    assert older in (await broker.stream_subjects(runs.name) or [])

    await broker.kv_delete(versions_spec(namespace), namespace.version_beat_key("runtime", "runtime-old"))
    done = await _run(env, tmp_path, "infra", "contract")
    assert done.returncode == 0, done
    assert f"stream {runs.name}: no longer takes {older}" in done.stdout
    assert await broker.stream_subjects(runs.name) == list(runs.subjects)
