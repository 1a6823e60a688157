"""Starts and supervises the whole stack as separate OS processes, the way Kubernetes would run its pods."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from crashsafe.contracts.clients import Scope
from crashsafe.contracts.subjects import DEFAULT_NAMESPACE, Namespace
from crashsafe.natsd import NatsAuth, NatsServer, free_port
from crashsafe.services.platform.nats_users import creds_path
from crashsafe.services.records.capability_keys import (
    SIGNING_KEY_VARIABLE,
    VERIFY_KEYS_VARIABLE,
    ensure_key_pair,
    public_path,
)

EXECUTOR_FAMILIES = ("booking", "payment", "notify", "memory")
NATS = "nats-server"
# These bind one fixed port each (the URL in stack.json); replicas of them need a load balancer, not `--scale`.
SINGLE_PORT = ("sandbox", "gateway")
# What a service prints once its ops port is bound (services/platform/probes.py), before `ready: …`.
OPS_LINE = b"ops listening on "
# The tenant of the admin key a stack mints for its own use (the demo, the tests, the scripts).
STACK_TENANT = "demo"
API_KEY_FILE = "api_key"
# The synthetic turn's key (tenant `synthetic`, scopes events:write and runs:read), for the reconciler and
# `crashsafe check synthetic`: `<state>/synthetic_key`, 0600.
SYNTHETIC_KEY_FILE = "synthetic_key"


class ScaleError(ValueError):
    """A `--scale` the stack cannot start: says which names it knows."""


def parse_scale(text: str) -> dict[str, int]:
    """`executor-payment=3,runtime=2` as {name: replicas}; names are checked against the stack by `Stack`."""
    scale: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, count = part.partition("=")
        if not sep or not name.strip() or not count.strip().isdigit() or int(count) < 1:
            raise ScaleError(f"--scale wants NAME=N[,NAME=N…] with N >= 1, got {part!r}")
        scale[name.strip()] = int(count)
    return scale


@dataclass(frozen=True)
class Backoff:
    """Restart delays. The first death, or one after a life of `stable_s` or more, is a crash: restart at once, as
    Kubernetes does. While the process keeps dying within `stable_s` of its start it is a crash loop: wait
    `base_s`, doubling each time up to `cap_s`."""

    base_s: float = 0.2
    cap_s: float = 10.0
    stable_s: float = 10.0

    def next(self, previous_s: float | None, uptime_s: float) -> float:
        if previous_s is None or uptime_s >= self.stable_s:
            return 0.0
        if not previous_s:
            return self.base_s
        return min(self.cap_s, previous_s * 2)


@dataclass(frozen=True)
class ProcessIdentity:
    """Who a pid is: its start time (clock ticks since boot, /proc/<pid>/stat field 22) and command line.

    A pid alone is not an identity: once our process exits the kernel may hand its number to any other one.
    """

    pid: int
    start_ticks: int
    cmdline: tuple[str, ...]

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity | None:
        """The identity of the live process `pid`, or None if there is none (or it is a zombie)."""
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            return None
        # Field 2 (comm) may hold spaces and parentheses: split after its closing parenthesis.
        fields = stat[stat.rindex(")") + 2 :].split()
        # An empty command line: a zombie, a kernel thread, or a process inside execve (its new arguments not yet
        # in place): not an identity to record or to match.
        if fields[0] == "Z" or not cmdline:
            return None
        return cls(pid, int(fields[19]), tuple(a.decode(errors="replace") for a in cmdline.split(b"\0") if a))

    @classmethod
    def settled(cls, pid: int, timeout_s: float = 2.0) -> ProcessIdentity | None:
        """The identity of a process just started: Popen returns while execve may still be setting it up."""
        deadline = time.monotonic() + timeout_s
        while (identity := cls.of(pid)) is None and time.monotonic() < deadline:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except (FileNotFoundError, ProcessLookupError):
                return None
            if stat[stat.rindex(")") + 2] == "Z":
                return None  # it already died: nothing to record
            time.sleep(0.005)
        return identity

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "start_ticks": self.start_ticks, "cmdline": list(self.cmdline)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProcessIdentity | None:
        try:
            return cls(int(data["pid"]), int(data["start_ticks"]), tuple(str(a) for a in data["cmdline"]))
        except (KeyError, TypeError, ValueError):
            return None

    def alive(self) -> bool:
        """The very process recorded is still running (not merely some process with its pid)."""
        return ProcessIdentity.of(self.pid) == self

    def signal(self, sig: int) -> bool:
        """Send `sig` only if the pid is still this process; False if it is gone or is someone else now."""
        # A pidfd pins the process: checked after opening it, the identity cannot change before the signal.
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return False
        try:
            if not self.alive():
                return False
            signal.pidfd_send_signal(fd, sig)
        except ProcessLookupError:
            return False
        finally:
            os.close(fd)
        return True


def _import_root(registry: str) -> str | None:
    """The directory a registry's top-level package is imported from, as this process sees it."""
    top = registry.split(":", 1)[0].split(".", 1)[0]
    spec = importlib.util.find_spec(top)
    if spec is None:
        return None
    where = list(spec.submodule_search_locations or []) or ([spec.origin] if spec.origin else [])
    return str(Path(where[0]).parent) if where else None


@dataclass
class Service:
    name: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    # Set for one life only (a crash point): cleared when the process dies, so the restart runs clean.
    once_env: dict[str, str] = field(default_factory=dict)
    # The `--scale` name this is a replica of (`executor-payment` for `executor-payment-2`).
    base: str = ""
    process: subprocess.Popen[bytes] | None = None
    identity: ProcessIdentity | None = None
    restarts: int = 0
    stopped: bool = False
    started_at: float = 0.0
    delay_s: float | None = None  # the last restart delay, for the back-off
    restart_at: float | None = None  # when the supervisor restarts it (set once it saw it dead)
    # Where this life's log starts, and the ops URL it printed (`ops listening on …`), once read.
    log_offset: int = 0
    ops_url: str | None = None


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
        executors: tuple[str, ...] = EXECUTOR_FAMILIES,
        runtimes: int = 1,
        scale: Mapping[str, int] | None = None,
        env: dict[str, str] | None = None,
        crash: dict[str, str] | None = None,
        sync_always: bool = False,
        reconciler: bool = True,
        projector: bool = True,
        registry: str | None = None,
        backoff: Backoff = Backoff(),
        nats_creds_dir: Path | None = None,
        providers_url: str | None = None,
        synthetic: bool = False,
    ) -> None:
        self.state_dir = state_dir.resolve()
        # The providers (a staging provider) at this URL instead of a sandbox of our own: nothing starts one.
        self.providers_url = providers_url.rstrip("/") if providers_url else None
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
        # The reconciler's synthetic turn on its cadence (`crashsafe up`); off in test stacks unless asked, so a
        # test's runs are its own. The key and the gateway URL are provisioned either way.
        self.synthetic = synthetic
        self.services: dict[str, Service] = {}
        crash = crash or {}
        plan: list[tuple[str, list[str]]] = [] if self.providers_url else [("sandbox", ["sandbox"])]
        plan += [("gateway", ["gateway"]), ("runtime", ["runtime"])]
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

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    @property
    def console_url(self) -> str:
        """The evidence console the gateway serves (sign in with the stack's key, `<state>/api_key`)."""
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
        return self.state_dir / "keys" / "capability.key"

    def replicas(self, base: str) -> list[Service]:
        return [s for s in self.services.values() if s.base == base]

    def env_for(self, service: Service) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "CRASHSAFE_NATS_URL": self.nats_url,
                "CRASHSAFE_NAMESPACE": self.namespace,
                "CRASHSAFE_DATA_DIR": str(self.state_dir / "data"),
                "CRASHSAFE_SANDBOX_URL": self.sandbox_url,
                "CRASHSAFE_SANDBOX_PORT": str(self.sandbox_port),
                "CRASHSAFE_GATEWAY_PORT": str(self.gateway_port),
                "CRASHSAFE_WORKER_ID": service.name,
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.pop("CRASHSAFE_CRASH_AT", None)
        # Capabilities: only runtimes get the signing key; executors the public key; nobody else either.
        env.pop(SIGNING_KEY_VARIABLE, None)
        env.pop(VERIFY_KEYS_VARIABLE, None)
        if service.base == "runtime":
            env[SIGNING_KEY_VARIABLE] = str(self.capability_key)
        elif service.base.startswith("executor-"):
            env[VERIFY_KEYS_VARIABLE] = str(public_path(self.capability_key))
        if service.base == "reconciler":
            env["CRASHSAFE_SYNTHETIC_GATEWAY_URL"] = self.gateway_url
            env["CRASHSAFE_SYNTHETIC_KEY_FILE"] = str(self.state_dir / SYNTHETIC_KEY_FILE)
            if not self.synthetic:
                env["CRASHSAFE_SYNTHETIC_EVERY_S"] = "0"
        if self.registry:
            env["CRASHSAFE_REGISTRY"] = self.registry
            where = _import_root(self.registry)
            if where:
                # A registry outside the installed packages (the benchmark's) must import in every service too.
                env["PYTHONPATH"] = os.pathsep.join(p for p in (where, env.get("PYTHONPATH")) if p)
        env.pop("CRASHSAFE_NATS_CREDS", None)
        creds = self.creds_for(service.base)
        if creds is not None:
            env["CRASHSAFE_NATS_CREDS"] = str(creds)
        env.update(self.base_env)
        if service.name not in SINGLE_PORT:
            # Each life binds a free ops port itself and prints it (`ops listening on …`): a port chosen here and
            # bound later could be taken meanwhile by another process, and replicas keep one environment.
            env["CRASHSAFE_OPS_PORT"] = "0"
        env.update(service.env)
        env.update(service.once_env)
        return env

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

    def _nats_auth(self) -> NatsAuth:
        from crashsafe.domain import registry as registries
        from crashsafe.services.platform.settings import Settings

        settings = Settings.from_env({**os.environ, **self.base_env})
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
                [sys.executable, "-m", "crashsafe.cli", "infra", "apply"],
                env=env,
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
                self.state_dir / "nats", sync_always=self.sync_always, auth=self._nats_auth()
            ).start()
            self.nats_url = self.nats.url
            self._track_nats()
        self.provision()
        self.api_key = self._mint_api_key()
        self._mint_synthetic_key()
        for service in self.services.values():
            self.spawn(service.name)
            if service.name in SINGLE_PORT:
                self.wait_http(service.name)
        for service in self.services.values():
            if service.name not in SINGLE_PORT:
                self.wait_ready(service.name)
        self.status = "running"
        self.write_state()
        return self

    def _mint_api_key(self) -> str:
        """An admin key for this stack's own clients, written to `<state>/api_key` (0600, the key alone on one
        line); the key a previous start left there is revoked."""
        return self._mint_key(API_KEY_FILE, STACK_TENANT, (Scope.ADMIN,), "crashsafe up")

    def _mint_synthetic_key(self) -> str:
        """The synthetic turn's key (tenant `synthetic`, events:write + runs:read) in `<state>/synthetic_key`,
        0600; the one a previous start left there is revoked, as the admin key's is."""
        from crashsafe.contracts.synthetic import SYNTHETIC_TENANT

        return self._mint_key(
            SYNTHETIC_KEY_FILE, SYNTHETIC_TENANT, (Scope.EVENTS_WRITE, Scope.RUNS_READ), "synthetic turn"
        )

    def _mint_key(self, file: str, tenant: str, scopes: tuple[Scope, ...], name: str) -> str:
        """A key of this stack's, minted as the operator into `<state>/<file>` (0600, the key alone on one line),
        revoking the one a previous start left there. Runs its own event loop in its own thread, since `start`
        may be called from a thread that already runs one."""
        from crashsafe.services.platform.settings import NatsAccess, Settings
        from crashsafe.services.records.client_keys import replace_stack_key

        # The bucket gets the replicas the services would give it (a cluster's `CRASHSAFE_STREAM_REPLICAS=3`).
        replicas = Settings.from_env({**os.environ, **self.base_env}).stream_replicas
        path = self.state_dir / file
        previous = path.read_text().strip() if path.exists() else None
        with ThreadPoolExecutor(1, thread_name_prefix="mint-key") as pool:
            key = pool.submit(
                asyncio.run,
                replace_stack_key(
                    self.nats_url,
                    self.namespace,
                    tenant,
                    previous,
                    replicas,
                    NatsAccess(creds=self.creds_for("operator")),
                    scopes=scopes,
                    name=name,
                ),
            ).result()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(key + "\n")
        os.chmod(path, 0o600)  # an older file keeps its mode through O_TRUNC
        return key

    def _track_nats(self) -> None:
        assert self.nats is not None and self.nats.process is not None
        self.nats_supervision.process = self.nats.process
        self.nats_supervision.identity = ProcessIdentity.settled(self.nats.process.pid)
        self.nats_supervision.started_at = time.monotonic()
        self.nats_supervision.stopped = False

    def spawn(self, name: str) -> subprocess.Popen[bytes]:
        service = self.services[name]
        path = self.logs_dir / f"{name}.log"
        service.log_offset = path.stat().st_size if path.exists() else 0
        service.ops_url = None
        log = open(path, "ab")
        service.process = subprocess.Popen(
            [sys.executable, "-m", "crashsafe.cli", "serve", *service.args],
            env=self.env_for(service),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        service.identity = ProcessIdentity.settled(service.process.pid)
        service.started_at = time.monotonic()
        service.stopped = False
        return service.process

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

    async def supervise(self, stop: asyncio.Event, backoff_s: float | None = None) -> None:
        """Restart whatever it started that died, nats-server included, as Kubernetes restarts a crashed pod.

        Each process gets its own back-off (`self.backoff`: at once after a long life, then 0.2 s doubling to
        10 s while it keeps dying within 10 s of its start), so one crash-looping service neither spins nor
        delays the others' restarts.
        `backoff_s` overrides the base delay.
        """
        policy = (
            self.backoff
            if backoff_s is None
            else Backoff(backoff_s, self.backoff.cap_s, self.backoff.stable_s)
        )
        nats_restart: asyncio.Task[None] | None = None
        # Restarted without waiting: stack.json gets each one's new ops URL once it printed it.
        unannounced: set[str] = set()
        while not stop.is_set():
            now = time.monotonic()
            if unannounced and (known := {n for n in unannounced if self.ops_url(n) is not None}):
                unannounced -= known
                self.write_state()
            for service in self._supervised():
                if service is self.nats_supervision and nats_restart is not None and not nats_restart.done():
                    continue  # starting: waiting for its readiness must not hold up the other restarts
                if service.stopped or service.process is None or service.process.poll() is None:
                    service.restart_at = None  # alive (or restarted by hand): nothing pending
                    continue
                if service.restart_at is None:
                    service.delay_s = policy.next(service.delay_s, now - service.started_at)
                    service.restart_at = now + service.delay_s
                elif now >= service.restart_at:
                    service.restart_at = None
                    if service is self.nats_supervision:
                        nats_restart = asyncio.create_task(self._restart_nats())
                    else:
                        self.restart(service.name, wait=False)
                        if service.name not in SINGLE_PORT:
                            unannounced.add(service.name)
            try:
                await asyncio.wait_for(stop.wait(), timeout=0.05)
            except TimeoutError:
                pass
        if nats_restart is not None:
            await nats_restart

    async def _restart_nats(self) -> None:
        """The same port and file store: clients reconnect to the URL they know, and nothing acked is lost."""
        assert self.nats is not None
        service = self.nats_supervision
        service.restarts += 1
        try:
            await asyncio.to_thread(self.nats.start)
        except RuntimeError:
            # It died again while starting (or never got ready): the next round backs off further.
            service.started_at = time.monotonic()
            service.process = self.nats.process
            return
        self._track_nats()
        self.write_state()

    def _entry(self, service: Service) -> dict[str, Any]:
        alive = service.process is not None and service.process.poll() is None
        return {
            "name": service.name,
            "service": service.base,
            "pid": service.process.pid if service.process else None,
            "restarts": service.restarts,
            "identity": service.identity.to_json() if service.identity and alive else None,
            "ops_url": self.ops_url(service.name),
        }

    def write_state(self) -> None:
        me = ProcessIdentity.of(os.getpid())
        state = {
            "status": self.status,
            "nats_url": self.nats_url,
            "gateway_url": self.gateway_url,
            "console_url": self.console_url,
            "sandbox_url": self.sandbox_url,
            # Set when `up --providers URL` runs against providers of someone else's (no sandbox process).
            "providers_url": self.providers_url,
            "namespace": self.namespace,
            # Where the operator's NATS credential is (a path; the secret stays in its 0600 file).
            "operator_creds": str(operator) if (operator := self.creds_for("operator")) else None,
            "supervisor_pid": os.getpid(),
            "supervisor": me.to_json() if me else None,
            "services": [self._entry(s) for s in self._supervised()],
        }
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_dir / "stack.json.tmp"
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_dir / "stack.json")

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
