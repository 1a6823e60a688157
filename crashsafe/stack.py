"""Starts and supervises the whole stack as separate OS processes, the way Kubernetes would run its pods."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from crashsafe.contracts.subjects import DEFAULT_NAMESPACE, Namespace
from crashsafe.crash_targets import check_armable
from crashsafe.forkserver import ForkedService, ForkServer, ForkServerError
from crashsafe.natsd import NatsAuth, NatsServer, free_port
from crashsafe.services.platform.nats_users import creds_path
from crashsafe.services.records.capability_keys import ensure_key_pair
from crashsafe.stack_env import service_env
from crashsafe.stack_keys import capability_key_path, mint_stack_keys
from crashsafe.stack_plan import ScaleError, registry_families
from crashsafe.stack_processes import SINGLE_PORT, Backoff, ProcessIdentity, Service
from crashsafe.stack_state import write_stack_json
from crashsafe.stack_supervision import supervise

if TYPE_CHECKING:
    from crashsafe.services.platform.settings import Settings

EXECUTOR_FAMILIES = ("booking", "payment", "notify", "memory")
NATS = "nats-server"
# What a service prints once its ops port is bound (services/platform/probes.py), before `ready: …`.
OPS_LINE = b"ops listening on "

# Restart at once after a long life, then 0.2 s doubling to 10 s while a process keeps dying young.
DEFAULT_BACKOFF = Backoff()


class Stack:
    """nats-server (embedded unless a URL is given), sandbox, gateway, runtime, executors, reconciler and projector.

    `scale` starts that many identical replicas of a service (`{"executor-payment": 3}`), as a Deployment
    starts pods: the same environment, only `CRASHSAFE_WORKER_ID` (the pod's name) differs.
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        nats_url: str | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        executors: tuple[str, ...] | None = None,
        runtimes: int = 1,
        scale: Mapping[str, int] | None = None,
        env: dict[str, str] | None = None,
        crash: dict[str, str] | None = None,
        sync_always: bool = False,
        reconciler: bool = True,
        projector: bool = True,
        registry: str | None = None,
        backoff: Backoff = DEFAULT_BACKOFF,
        nats_creds_dir: Path | None = None,
        providers_url: str | None = None,
        model_url: str | None = None,
        synthetic: bool = False,
        monitor_port: int | None = None,
        forking: bool = True,
        python: str | None = None,
    ) -> None:
        self.state_dir = state_dir.resolve()
        # The interpreter whose crashsafe provisions and serves (another release's venv, as an image is one);
        # None: this one. `Service.python` overrides it for one service (a rolling update runs both).
        self.python = python
        # Services forked from a warm interpreter (`crashsafe.forkserver`); False: each a fresh interpreter.
        self.forking = forking
        # The embedded nats-server's monitoring port (`/connz`), on loopback: the benchmarks count messages with it.
        self.monitor_port = monitor_port
        # The providers (a staging provider) at this URL instead of a sandbox of our own: nothing starts one.
        self.providers_url = providers_url.rstrip("/") if providers_url else None
        # The model's base URL (`…/v1`), given to the runtime as OPENAI_BASE_URL; None: `stack_env.model_at`.
        self.model_url = model_url.rstrip("/") if model_url else None
        self.registry = registry
        self.namespace = namespace
        self.nats: NatsServer | None = None
        self.nats_url = nats_url or ""
        self.nats_supervision = Service(name=NATS, args=[], base=NATS)
        self.sync_always = sync_always
        # Each role's NATS credential file: made here for the embedded server (`<state>/nats/creds`), or those
        # of the server at `nats_url` (None: that server admits anyone).
        self.nats_creds_dir = nats_creds_dir if nats_url else self.state_dir / "nats" / "creds"
        self.gateway_port = free_port()
        self.sandbox_port = free_port()
        self.base_env = dict(env or {})
        self.backoff = backoff
        self.status = "starting"
        self.api_key = ""  # the admin key minted by start(); also in <state>/api_key, never in stack.json
        self.approver_key = ""  # the manager's key start() mints (stack_keys.py), in <state>/approver_key
        # The reconciler's synthetic turn on its cadence (`crashsafe up`); off in test stacks unless asked, so a
        # test's runs are its own. The key and the gateway URL are provisioned either way.
        self.synthetic = synthetic
        self.services: dict[str, Service] = {}
        crash = crash or {}
        plan: list[tuple[str, list[str]]] = [] if self.providers_url else [("sandbox", ["sandbox"])]
        plan += [("gateway", ["gateway"]), ("runtime", ["runtime"])]
        if executors is None:  # the registry the services will load: the stack's, else their environment's
            executors = registry_families(registry or self.service_settings().registry)
        plan += [(f"executor-{family}", ["executor", "--tool", family]) for family in executors]
        if reconciler:
            plan.append(("reconciler", ["reconciler"]))
        if projector:
            # The confirmation emails, CRM records and audit trail, off the runs' critical path (issue 10).
            plan.append(("projector", ["projector"]))
        replicas = {"runtime": runtimes, **(scale or {})}
        unknown = sorted(set(replicas) - {name for name, _ in plan})
        if unknown:
            known = ", ".join(name for name, _ in plan if name not in SINGLE_PORT)
            raise ScaleError(f"--scale: no service {', '.join(unknown)} in this stack; it has {known}")
        for name in SINGLE_PORT:
            if replicas.get(name, 1) != 1:
                raise ScaleError(
                    f"--scale: {name} listens on one port (its URL in stack.json); run one, or several behind a load balancer"
                )
        for base, args in plan:
            n = replicas.get(base, 1)
            for i in range(n):
                name = f"{base}-{i}" if n > 1 else base
                seam = crash.get(name, crash.get(base))
                once = {"CRASHSAFE_CRASH_AT": seam} if seam else {}
                self.services[name] = Service(name=name, args=list(args), once_env=once, base=base)
        check_armable(crash, {name: service.base for name, service in self.services.items()})

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    @property
    def console_url(self) -> str:
        """The evidence console the gateway serves (sign in with `<state>/approver_key` to decide approvals; with
        `<state>/api_key`, the admin key, to operate on every tenant)."""
        return f"{self.gateway_url}/console/"

    @property
    def sandbox_url(self) -> str:
        """Where the services' providers answer: the stack's own sandbox, or the `providers_url` it was given."""
        return self.providers_url or f"http://127.0.0.1:{self.sandbox_port}"

    @property
    def runs_sandbox(self) -> bool:
        return "sandbox" in self.services

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def capability_key(self) -> Path:
        """The runtime's signing key (0600), made once per state dir; executors get only `capability.pub`."""
        return capability_key_path(self.state_dir)

    def replicas(self, base: str) -> list[Service]:
        return [s for s in self.services.values() if s.base == base]

    def env_for(self, service: Service) -> dict[str, str]:
        return service_env(self, service)

    def ops_url(self, name: str) -> str | None:
        """Where a process answers /healthz, /readyz and /metrics (the gateway: its own port; the sandbox: none)."""
        if name == "gateway":
            return self.gateway_url
        service = self.services.get(name)
        if service is None or name in SINGLE_PORT:
            return None
        if service.ops_url is None:
            path = self.logs_dir / f"{name}.log"
            if path.exists():
                with open(path, "rb") as log:
                    log.seek(service.log_offset)
                    for line in log:
                        if line.startswith(OPS_LINE):
                            service.ops_url = line[len(OPS_LINE) :].decode().strip()
        return service.ops_url

    def creds_for(self, base: str) -> Path | None:
        """The credential file of the NATS user a service of `base` runs as (the sandbox speaks no NATS)."""
        if self.nats_creds_dir is None or base == "sandbox":
            return None
        return creds_path(self.nats_creds_dir, base)  # a service's name is its user's: `executor-payment`

    def service_settings(self) -> Settings:
        """The settings its services run with: the supervisor's environment under the stack's own."""
        from crashsafe.services.platform.settings import Settings

        return Settings.from_env({**os.environ, **self.base_env})

    def _nats_auth(self) -> NatsAuth:
        from crashsafe.domain import registry as registries

        settings = self.service_settings()
        families = registries.load(self.registry or settings.registry).families
        assert self.nats_creds_dir is not None
        return NatsAuth.for_deployment(
            self.nats_creds_dir, Namespace(self.namespace), families, settings.partitions
        )

    def provision(self) -> None:
        """Streams and buckets, made by the operator before any service starts (services may not make them)."""
        env = dict(os.environ)
        env.update({"CRASHSAFE_NATS_URL": self.nats_url, "CRASHSAFE_NAMESPACE": self.namespace})
        env.pop("CRASHSAFE_NATS_CREDS", None)
        operator = self.creds_for("operator")
        if operator is not None:
            env["CRASHSAFE_NATS_CREDS"] = str(operator)
        env.update(self.base_env)
        with open(self.logs_dir / "provision.log", "ab") as log:
            done = subprocess.run(
                [self.python or sys.executable, "-m", "crashsafe.cli", "infra", "apply"],
                env=env,
                cwd=self.state_dir if self.python else None,  # see _start_process
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=60,
            )
        if done.returncode != 0:
            raise RuntimeError(f"provisioning failed; see {self.logs_dir / 'provision.log'}")

    # Lifecycle ----------------------------------------------------------------------------------------------

    def start(self) -> Stack:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        ensure_key_pair(self.capability_key)
        if not self.nats_url:
            self.nats = NatsServer(
                self.state_dir / "nats",
                sync_always=self.sync_always,
                auth=self._nats_auth(),
                monitor_port=self.monitor_port,
            ).start()
            self.nats_url = self.nats.url
            self._track_nats()
        self.provision()
        self.api_key, self.approver_key = mint_stack_keys(self)
        for service in self.services.values():  # all at once: none needs another up to start
            self.spawn(service.name)
        for service in self.services.values():
            if service.name in SINGLE_PORT:
                self.wait_http(service.name)
            else:
                self.wait_ready(service.name)
        self.status = "running"
        self.write_state()
        return self

    async def supervise(self, stop: asyncio.Event, backoff_s: float | None = None) -> None:
        """Restart whatever it started that died (`stack_supervision.supervise`)."""
        await supervise(self, stop, backoff_s)

    def _track_nats(self) -> None:
        assert self.nats is not None and self.nats.process is not None
        self.nats_supervision.process = self.nats.process
        self.nats_supervision.identity = ProcessIdentity.settled(self.nats.process.pid)
        self.nats_supervision.started_at = time.monotonic()
        self.nats_supervision.stopped = False

    def spawn(self, name: str) -> subprocess.Popen[bytes] | ForkedService:
        service = self.services[name]
        path = self.logs_dir / f"{name}.log"
        service.log_offset = path.stat().st_size if path.exists() else 0
        service.ops_url = None
        service.process = self._start_process(service, path)
        service.identity = ProcessIdentity.settled(service.process.pid)
        service.started_at = time.monotonic()
        service.stopped = False
        return service.process

    def _start_process(self, service: Service, log_path: Path) -> subprocess.Popen[bytes] | ForkedService:
        """Forked from the warm fork server where there is one (`crashsafe.forkserver`), else a fresh interpreter."""
        env = self.env_for(service)
        python = service.python or self.python
        if self.forking and python is None:
            try:
                # The server starts with the stack's own environment; each service brings its own.
                return ForkServer.shared(os.environ).fork(["serve", *service.args], env, log_path)
            except ForkServerError as exc:
                print(f"crashsafe: {exc}; starting services as fresh interpreters", file=sys.stderr)
                self.forking = False
        with open(log_path, "ab") as log:
            return subprocess.Popen(
                [python or sys.executable, "-m", "crashsafe.cli", "serve", *service.args],
                env=env,
                # `-m` puts the working directory first on the path: a checkout's `crashsafe/` would shadow
                # another installation's.
                cwd=self.state_dir if python else None,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def wait_http(self, name: str, timeout_s: float = 30.0) -> None:
        url = {"sandbox": f"{self.sandbox_url}/_faults", "gateway": f"{self.gateway_url}/readyz"}[name]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_alive(name)
            try:
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{name} not ready after {timeout_s}s; see {self.logs_dir / (name + '.log')}")

    def wait_ready(self, name: str, timeout_s: float = 30.0, after_bytes: int = 0) -> None:
        """Services print `ready: <name>` once subscribed; read it from their log, never sleep for it."""
        path = self.logs_dir / f"{name}.log"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_alive(name)
            if path.exists() and b"ready: " in path.read_bytes()[after_bytes:]:
                return
            time.sleep(0.03)
        raise RuntimeError(f"{name} not ready after {timeout_s}s; see {path}")

    def _check_alive(self, name: str) -> None:
        process = self.services[name].process
        if process is not None and process.poll() is not None and not self.services[name].once_env:
            raise RuntimeError(
                f"{name} exited with {process.returncode}; see {self.logs_dir / (name + '.log')}"
            )

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        process = self.services[name].process
        if process is not None and process.poll() is None:
            os.kill(process.pid, sig)
            process.wait()

    def restart(self, name: str, wait: bool = True) -> None:
        self.kill(name)
        service = self.services[name]
        service.once_env = {}
        service.restarts += 1
        path = self.logs_dir / f"{name}.log"
        offset = path.stat().st_size if path.exists() else 0
        self.spawn(name)
        if wait:
            if name in SINGLE_PORT:
                self.wait_http(name)
            else:
                self.wait_ready(name, after_bytes=offset)
        self.write_state()

    def _supervised(self) -> list[Service]:
        return list(self.services.values()) + ([self.nats_supervision] if self.nats is not None else [])

    def dead(self) -> list[str]:
        return [
            s.name
            for s in self._supervised()
            if not s.stopped and s.process is not None and s.process.poll() is not None
        ]

    def write_state(self) -> None:
        write_stack_json(self)

    def stop(self) -> None:
        for service in self.services.values():
            service.stopped = True
            if service.process is not None and service.process.poll() is None:
                service.process.terminate()
        for service in self.services.values():
            if service.process is not None:
                try:
                    service.process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.kill(service.name)
        self.nats_supervision.stopped = True
        if self.nats is not None:
            self.nats.stop()
        self.status = "stopped"
        self.write_state()
