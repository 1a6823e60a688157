"""One-shot commands fail fast: with no reachable NATS, `crashsafe runs show`, `audit`, `reconcile`, `infra
apply|contract` and `upgrade check|status` print one clear line and exit non-zero within seconds; a missing run is
one line, not a traceback."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.subjects import EventClass, Namespace
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.run_journal import RunJournal
from tests.support import inprocess
from tests.support.broker import ensure_streams
from tests.support.nats_users import access
from tests.support.runs import started
from tests.support.stack import crashsafe


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize(
    "command",
    [
        ("runs", "show", "run_000000000000000000000000"),
        ("runs", "list"),
        ("tail",),
        ("audit",),
        ("reconcile",),
        ("infra", "apply"),
        ("infra", "contract"),
        ("upgrade", "check"),
        ("upgrade", "status"),
        ("keys", "create", "--tenant", "acme", "--scope", "admin"),
        ("keys", "list"),
        ("keys", "revoke", "0123456789abcdef"),
    ],
    ids=lambda c: " ".join(c[:2]),
)
async def test_with_no_reachable_nats_a_one_shot_command_says_so_in_one_line_within_seconds(
    command: tuple[str, ...], tmp_path: Path
) -> None:
    url = f"nats://127.0.0.1:{_closed_port()}"
    args = [*command] if command[0] == "infra" else [*command, "--state-dir", str(tmp_path)]
    began = time.monotonic()
    result = await crashsafe(*args, env={"CRASHSAFE_NATS_URL": url}, timeout_s=30)
    took = time.monotonic() - began
    assert result.returncode != 0
    assert took < 10, f"{' '.join(command)} took {took:.1f}s to give up"
    assert "Traceback" not in result.stderr
    (line,) = _lines(result.stderr + result.stdout)
    assert line.startswith("crashsafe: cannot reach NATS at " + url), line


async def test_a_missing_run_is_one_clear_line(
    nats_server: NatsServer, namespace: Namespace, tmp_path: Path
) -> None:
    env = {
        "CRASHSAFE_NATS_URL": nats_server.url,
        "CRASHSAFE_NAMESPACE": namespace.name,
        "CRASHSAFE_NATS_CREDS": str(access(nats_server.url, Role.OPERATOR).creds),
    }
    applied = await crashsafe("infra", "apply", env=env)
    assert applied.returncode == 0, applied.stderr
    missing = "run_000000000000000000000000"
    for command in (("runs", "show", missing), ("reconcile", missing)):
        result = await crashsafe(*command, "--state-dir", str(tmp_path), env=env)
        assert result.returncode == 1, result
        assert "Traceback" not in result.stderr
        lines = _lines(result.stderr + result.stdout)
        assert len(lines) == 1 and f"no run {missing}" in lines[0], lines


async def test_audit_reports_a_run_holding_an_event_type_it_does_not_know_instead_of_failing(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, tmp_path: Path
) -> None:
    await ensure_streams(broker, namespace)
    journal = RunJournal(broker, namespace)
    first = started()
    seq = await journal.append(first, 0)
    future = b'{"type":"run.reflection.v2","run_id":"%s","at":"2031-12-01T09:00:01Z"}' % first.run_id.encode()
    await broker.publish(
        namespace.run_event(first.run_id, EventClass.STEP),
        future,
        expected_subject_seq=seq,
        sequence_subject=namespace.run_events(first.run_id),
    )
    async with inprocess.sandbox_server() as sandbox_url:
        env = {
            "CRASHSAFE_NATS_URL": nats_server.url,
            "CRASHSAFE_NAMESPACE": namespace.name,
            "CRASHSAFE_NATS_CREDS": str(access(nats_server.url, Role.OPERATOR).creds),
            "CRASHSAFE_SANDBOX_URL": sandbox_url,
        }
        result = await crashsafe("audit", "--state-dir", str(tmp_path), env=env)
        assert result.returncode == 0, result.stdout + result.stderr  # nothing wrong: a note is not a finding
        shown = await crashsafe("runs", "show", first.run_id, "--state-dir", str(tmp_path), env=env)
        as_json = await crashsafe(
            "runs", "show", first.run_id, "--json", "--state-dir", str(tmp_path), env=env
        )
    assert shown.returncode == 0, shown.stderr
    assert "kept but not understood by this version: run.reflection.v2" in shown.stdout
    assert [json.loads(line)["type"] for line in as_json.stdout.splitlines()] == [
        "run.started",
        "run.reflection.v2",
    ]
    assert "Traceback" not in result.stderr, result.stderr
    assert f"NOTE run {first.run_id}: 1 event(s) of a type this version does not know" in result.stdout
    assert "run.reflection.v2" in result.stdout
