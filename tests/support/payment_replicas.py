"""Payment executor replicas as real processes (`crashsafe serve executor --tool payment`), payment requests
published as the runtime would (signed), and the lease bucket read back: shared by the replica and scaling tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from crashsafe.contracts.keys import action_key, input_hash, partition_of
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.streams import leases_spec
from crashsafe.contracts.subjects import DEFAULT_ACTION_PARTITIONS, Namespace
from crashsafe.contracts.tool_messages import (
    ActionOutcome,
    ActionRequest,
    runtime_message_decoder,
    tool_encoder,
)
from crashsafe.domain.partition_ownership import lease_decoder
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import Settings
from tests.support import inprocess
from tests.support.broker import ensure_streams
from tests.support.capabilities import executor_env, signed
from tests.support.nats_users import access
from tests.support.paths import ROOT
from tests.support.world import Sandbox

PARTITIONS = DEFAULT_ACTION_PARTITIONS
LEASE_S = Settings.lease_s  # what a replica started from the environment uses
DATES = {"check_in": "2031-12-01", "check_out": "2031-12-03"}


class Replica:
    """One `crashsafe serve executor --tool payment` process; everything but its data dir is the shared env."""

    def __init__(self, proc: asyncio.subprocess.Process, data_dir: Path, log_path: Path) -> None:
        self.proc = proc
        self.data_dir = data_dir
        self.log_path = log_path
        self.ops_url: str | None = None  # its /healthz, /readyz and /metrics

    @property
    def worker_id(self) -> str:
        # CRASHSAFE_WORKER_ID is left unset, as in a Deployment's pods: the default is <hostname>-<pid>.
        import socket

        return f"{socket.gethostname()}-{self.proc.pid}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rows(self) -> dict[str, str]:
        """key -> status, read from every one of its SQLite files."""
        out: dict[str, str] = {}
        for path in self.data_dir.glob("*.sqlite3"):
            with contextlib.closing(sqlite3.connect(path)) as db:
                out.update(dict(db.execute("SELECT key, status FROM actions").fetchall()))
        return out


@contextlib.asynccontextmanager
async def replicas(
    nats_url: str, ns: Namespace, sandbox_url: str, root: Path
) -> AsyncIterator[Callable[[str], Any]]:
    started: list[Replica] = []

    async def start(name: str, data_dir_name: str | None = None) -> Replica:
        data_dir = root / (data_dir_name or name)
        log_path = root / f"{name}.log"
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("CRASHSAFE_") and not k.startswith("OPENAI_")
        }
        env |= {
            "CRASHSAFE_NATS_URL": nats_url,
            "CRASHSAFE_NAMESPACE": ns.name,
            "CRASHSAFE_SANDBOX_URL": sandbox_url,
            "CRASHSAFE_DATA_DIR": str(data_dir),
            "CRASHSAFE_NATS_CREDS": str(access(nats_url, Role.EXECUTOR, "payment").creds),
            "PYTHONPATH": str(ROOT),
            "CRASHSAFE_OPS_PORT": "0",  # replicas side by side: each its own ops port
            **executor_env(root / "keys"),
        }
        log_file = log_path.open("wb")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "crashsafe.cli",
            "serve",
            "executor",
            "--tool",
            "payment",
            env=env,
            cwd=root,
            stdout=asyncio.subprocess.PIPE,
            stderr=log_file,
        )
        log_file.close()
        replica = Replica(proc, data_dir, log_path)
        started.append(replica)
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=60)
        if line.startswith(b"ops listening on "):  # printed first, before the service connects
            replica.ops_url = line.decode().removeprefix("ops listening on ").strip()
            line = await asyncio.wait_for(proc.stdout.readline(), timeout=60)
        assert b"ready" in line, f"{name} did not start: {line!r}\n{replica.log()}"
        return replica

    try:
        yield start
    finally:
        for replica in started:
            if replica.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    replica.proc.send_signal(signal.SIGCONT)
                    replica.proc.kill()
                await replica.proc.wait()


async def owners(broker: Broker, ns: Namespace) -> dict[int, str]:
    """Who holds each payment partition, as the lease bucket says (released leases left out)."""
    out: dict[int, str] = {}
    for entry in await broker.kv_scan(leases_spec(ns), ns.leases_of("payment")):
        lease = lease_decoder.decode(entry.value)
        if lease.owner:
            out[int(entry.key.rsplit(".", 1)[1])] = lease.owner
    return out


class Payments:
    """Payment requests published as the runtime does, and every outcome the executors publish."""

    def __init__(self, broker: Broker, ns: Namespace, sandbox: httpx.AsyncClient) -> None:
        self.broker = broker
        self.ns = ns
        self.sandbox = sandbox
        self.run_id = "run_" + uuid.uuid4().hex[:24]
        self.steps = 0
        self.outcomes: list[ActionOutcome] = []

    async def collect(self, msg: Any) -> None:
        message = runtime_message_decoder.decode(msg.data)
        if isinstance(message, ActionOutcome):
            self.outcomes.append(message)

    async def request(self, guest: str) -> ActionRequest:
        made = await self.sandbox.post(
            "/bookings",
            json={"hotel_id": "lis-1", "guest_id": guest, **DATES},
            headers={"Idempotency-Key": f"setup-{uuid.uuid4().hex}"},
        )
        assert made.status_code == 201, made.text
        booking = made.json()
        self.steps += 1
        args = {
            "booking_id": booking["booking_id"],
            "guest_id": guest,
            "amount_cents": booking["total_cents"],
            "currency": "EUR",
        }
        now = datetime.now(UTC)
        return ActionRequest(
            run_id=self.run_id,
            step_no=self.steps,
            tool="create_payment",
            family="payment",
            args=args,
            key=action_key(self.run_id, self.steps),
            input_hash=input_hash({"tool": "create_payment", "args": args}),
            timeout_s=10.0,
            deadline_at=now + timedelta(seconds=120),
            requested_at=now,
        )

    async def publish(self, request: ActionRequest) -> None:
        subject = self.ns.actions("payment", partition_of(request.key, PARTITIONS))
        await self.broker.publish(
            subject, tool_encoder.encode(signed(request)), msg_id=f"test:{uuid.uuid4().hex}"
        )

    def of(self, key: str) -> list[ActionOutcome]:
        return [o for o in self.outcomes if o.key == key]


@contextlib.asynccontextmanager
async def payment_world(
    nats_server: NatsServer, broker: Broker, namespace: Namespace, tmp_path: Path
) -> AsyncIterator[tuple[Sandbox, Payments, Callable[..., Any]]]:
    """Streams provisioned (the operator's job), a sandbox, a replica starter, and every outcome collected."""
    await ensure_streams(broker, namespace)  # as the operator: executors only check their streams exist
    async with (
        inprocess.sandbox_server() as url,
        httpx.AsyncClient(base_url=url, timeout=10.0) as http,
        replicas(nats_server.url, namespace, url, tmp_path) as start,
    ):
        payments = Payments(broker, namespace, http)
        sub = await broker.nc.subscribe(namespace.outcomes_all, cb=payments.collect)
        try:
            yield Sandbox(http, url), payments, start
        finally:
            await sub.unsubscribe()
