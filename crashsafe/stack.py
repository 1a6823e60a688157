"""Starts and supervises the whole stack as separate OS processes, the way Kubernetes would run its pods."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from contracts.subjects import DEFAULT_NAMESPACE
from services.platform.natsd import NatsServer

EXECUTOR_FAMILIES = ("booking", "payment", "notify")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    stopped: bool = False


class Stack:
    """nats-server (embedded unless a URL is given), sandbox, gateway, runtime, executors and reconciler."""

    def __init__(
        self,
        state_dir: Path,
        *,
        nats_url: str | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        executors: tuple[str, ...] = EXECUTOR_FAMILIES,
        runtimes: int = 1,
        env: dict[str, str] | None = None,
        crash: dict[str, str] | None = None,
        sync_always: bool = False,
        reconciler: bool = True,
        registry: str | None = None,
    ) -> None:
        self.state_dir = state_dir.resolve()
        self.registry = registry
        self.namespace = namespace
        self.nats: NatsServer | None = None
        self.nats_url = nats_url or ""
        self.sync_always = sync_always
        self.gateway_port = free_port()
        self.sandbox_port = free_port()
        self.base_env = dict(env or {})
        self.services: dict[str, Service] = {}
        crash = crash or {}
        plan: list[tuple[str, list[str]]] = [("sandbox", ["sandbox"]), ("gateway", ["gateway"])]
        plan += [(f"runtime-{i}" if runtimes > 1 else "runtime", ["runtime"]) for i in range(runtimes)]
        plan += [(f"executor-{family}", ["executor", "--tool", family]) for family in executors]
        if reconciler:
            plan.append(("reconciler", ["reconciler"]))
        for name, args in plan:
            once = {"CRASHSAFE_CRASH_AT": crash[name]} if name in crash else {}
            self.services[name] = Service(name=name, args=args, once_env=once)

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    @property
    def sandbox_url(self) -> str:
        return f"http://127.0.0.1:{self.sandbox_port}"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

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
        if self.registry:
            env["CRASHSAFE_REGISTRY"] = self.registry
            where = _import_root(self.registry)
            if where:
                # A registry outside the installed packages (the benchmark's) must import in every service too.
                env["PYTHONPATH"] = os.pathsep.join(p for p in (where, env.get("PYTHONPATH")) if p)
        env.update(self.base_env)
        env.update(service.env)
        env.update(service.once_env)
        return env

    # Lifecycle ----------------------------------------------------------------------------------------------

    def start(self) -> Stack:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        if not self.nats_url:
            self.nats = NatsServer(self.state_dir / "nats", sync_always=self.sync_always).start()
            self.nats_url = self.nats.url
        for service in self.services.values():
            self.spawn(service.name)
            if service.name in ("sandbox", "gateway"):
                self.wait_http(service.name)
        for service in self.services.values():
            if service.name not in ("sandbox", "gateway"):
                self.wait_ready(service.name)
        self.write_state()
        return self

    def spawn(self, name: str) -> subprocess.Popen[bytes]:
        service = self.services[name]
        log = open(self.logs_dir / f"{name}.log", "ab")
        service.process = subprocess.Popen(
            [sys.executable, "-m", "crashsafe.cli", "serve", *service.args],
            env=self.env_for(service),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
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
            if name in ("sandbox", "gateway"):
                self.wait_http(name)
            else:
                self.wait_ready(name, after_bytes=offset)
        self.write_state()

    def dead(self) -> list[str]:
        return [
            s.name
            for s in self.services.values()
            if not s.stopped and s.process is not None and s.process.poll() is not None
        ]

    async def supervise(self, stop: asyncio.Event, backoff_s: float = 0.2) -> None:
        """Restart any service that died, after a short back-off, as Kubernetes restarts a crashed pod."""
        while not stop.is_set():
            for name in self.dead():
                await asyncio.sleep(backoff_s)
                self.restart(name, wait=False)
            try:
                await asyncio.wait_for(stop.wait(), timeout=0.1)
            except TimeoutError:
                pass

    def write_state(self) -> None:
        state = {
            "nats_url": self.nats_url,
            "gateway_url": self.gateway_url,
            "sandbox_url": self.sandbox_url,
            "namespace": self.namespace,
            "supervisor_pid": os.getpid(),
            "services": [
                {"name": s.name, "pid": s.process.pid if s.process else None, "restarts": s.restarts}
                for s in self.services.values()
            ]
            + (
                [
                    {
                        "name": "nats-server",
                        "pid": self.nats.process.pid if self.nats.process else None,
                        "restarts": 0,
                    }
                ]
                if self.nats
                else []
            ),
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
        if self.nats is not None:
            self.nats.stop()
