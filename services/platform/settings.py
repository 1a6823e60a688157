"""Every environment variable the product reads, read and validated in one place (how a pod is configured)."""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashsafe.contracts.backup_schedule import BackupSchedule
from crashsafe.contracts.errors import InvalidSetting
from crashsafe.contracts.provider_settings import DEFAULT_PROVIDER, ProviderSettings
from crashsafe.contracts.retention import RecordRetention
from crashsafe.contracts.subjects import DEFAULT_ACTION_PARTITIONS, Namespace
from crashsafe.services.platform.backup_variables import read_store_backups
from crashsafe.services.platform.environment_variables import VARIABLES
from crashsafe.services.platform.provider_variables import provider_settings
from crashsafe.services.platform.retention_variables import read_retention

SQLITE_SYNC_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


_KNOWN = {v.name for v in VARIABLES}


def parse_partitions(spec: str, total: int) -> tuple[int, ...]:
    """ "all", "0-3", "0,2" -> owned partition numbers; ValueError on anything else."""
    if spec in ("", "all"):
        return tuple(range(total))
    owned: set[int] = set()
    for part in spec.split(","):
        lo, dash, hi = part.strip().partition("-")
        owned.update(range(int(lo), int(hi) + 1) if dash else (int(lo),))
    bad = sorted(p for p in owned if not 0 <= p < total)
    if bad or not owned:
        raise ValueError(f"partitions {bad} outside 0..{total - 1}")
    return tuple(sorted(owned))


def route_key(variable: str) -> str | None:
    """A model route's API key, from the environment variable the catalog names for it (`api_key_env`): the
    catalog is not secret, so it holds the variable's name and only the process's environment holds the key."""
    return os.environ.get(variable) or None


@dataclass(frozen=True, slots=True)
class NatsAccess:
    """How this process proves who it is to NATS, and how it checks the server: plain data, read by Broker.connect."""

    creds: Path | None = None
    tls_ca_file: Path | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None

    @property
    def tls(self) -> bool:
        return self.tls_ca_file is not None or self.tls_cert_file is not None


@dataclass(frozen=True)
class Settings:
    nats_url: str = "nats://127.0.0.1:4222"
    namespace: Namespace = field(default_factory=Namespace)
    registry: str = "crashsafe.services.agents:stayhub"
    partitions: int = DEFAULT_ACTION_PARTITIONS
    owned_partitions: tuple[int, ...] = tuple(range(DEFAULT_ACTION_PARTITIONS))
    # True for `all`: the replicas split the partitions among themselves; False for an explicit list.
    shared_partitions: bool = True
    # A partition lease (whole seconds: the server's per-key TTL); a dead or paused replica's partitions move
    # after it. Not an environment variable yet: tests shorten it with dataclasses.replace.
    lease_s: int = 5
    # How far two hosts' clocks may disagree: a taken-over partition looks up keys asked before then + this.
    clock_skew_s: float = 2.0
    data_dir: Path = Path(".crashsafe/data")
    sqlite_sync: str = "NORMAL"
    # The default provider's base URL (an operation naming no provider talks to it): the sandbox in a demo.
    sandbox_url: str = "http://127.0.0.1:8090"
    # The named providers (CRASHSAFE_PROVIDER_<NAME>_URL, _CREDENTIAL_FILE), credentials read once at start.
    providers: tuple[ProviderSettings, ...] = ()
    gateway_host: str = "127.0.0.1"
    gateway_port: int = 8080
    sandbox_port: int = 8090
    # The name the sandbox's scripted model answers to (sandbox/scripted_model.py): the value stays as it is.
    model: str = "scripted"
    openai_base_url: str | None = None
    openai_api_key: str | None = None
    openai_organization: str | None = None  # OPENAI_ORG_ID, sent as OpenAI-Organization
    openai_project: str | None = None  # OPENAI_PROJECT_ID, sent as OpenAI-Project
    worker_id: str = ""
    ack_wait_s: float = 1.0
    stream_replicas: int = 1
    log_level: str = "INFO"
    crash_at: str | None = None
    # Gateway clients and quotas (issue 8).
    api_key: str | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    rate_per_client: float = 2000.0
    rate_per_guest: float = 20.0
    reconcile_per_minute: float = 6.0
    active_runs_per_guest: int = 10
    # A run's turns (issue 17): how many messages it takes, and how many may wait unread (services/gateway/turns.py).
    turns_per_run: int = 50
    run_inbox: int = 10
    capability_signing_key: Path | None = None
    capability_verify_keys: tuple[Path, ...] = ()
    nats_access: NatsAccess = field(default_factory=NatsAccess)
    # Projections (issue 10): every retry policy's durations times this (a 25-minute outage in seconds).
    projection_time_scale: float = 1.0
    # The synthetic turn (issue 11): run by the reconciler through the gateway, like a client.
    synthetic_gateway_url: str | None = None
    synthetic_key_file: Path | None = None
    synthetic_every_s: float = 300.0
    synthetic_budget_s: float = 30.0
    # The policy documents the runtime's agents search (None: the ones shipped in the package).
    knowledge_dir: Path | None = None
    # Tracing (issue 11): the OpenTelemetry specification's own OTEL_* variables, as the environment had them
    # (docs/observability.md); the SDK reads its exporter's details itself, these say whether to export at all.
    otel: tuple[tuple[str, str], ...] = ()
    # The ops port (issue 11): liveness, readiness and metrics of every non-HTTP service.
    ops_host: str = "127.0.0.1"
    ops_port: int = 9464
    # A wedged event loop (code that never awaits) is a dead service: it exits after this long (probes.Watchdog).
    loop_stall_s: float = 30.0
    # How long the records that grow with every run are kept (docs/capacity.md); 0 for one: forever.
    retention: RecordRetention = field(default_factory=RecordRetention)
    # Where ended runs' journals are archived before their subjects are purged (services/platform/run_archive.py):
    # a directory every reader of journals mounts. None: no archive, every journal stays in the stream.
    archive_dir: Path | None = None
    # Where executors back up the stores of the partitions they hold, and how often (services/executor/
    # partition_stores.py): a directory every executor replica of the deployment mounts. Off: as 0.2.0.
    store_backups: BackupSchedule = field(default_factory=BackupSchedule)
    # An agent's code that runs longer than this in one decision is stopped, and its run handed off with
    # `agent_fault`; a Python operation's client, between two awaits, an unknown outcome (services/platform/
    # hook_limit.py); 0 turns the limit off. Well below `loop_stall_s`.
    hook_limit_s: float = 5.0

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, defaults: Mapping[str, str] | None = None
    ) -> Settings:
        """Read and check every variable; an unusable one raises InvalidSetting naming it, never a traceback.

        `defaults` fill in where the environment is silent (an operator command reading a running stack's file)."""
        env = {**(defaults or {}), **(os.environ if environ is None else environ)}

        def get(name: str) -> str | None:
            assert name in _KNOWN, f"{name} is not in VARIABLES"
            value = env.get(name)
            return value if value not in (None, "") else None

        def read(name: str, default: Any, parse: Callable[[str], Any], expected: str) -> Any:
            raw = get(name)
            if raw is None:
                return default
            try:
                return parse(raw)
            except ValueError:
                raise InvalidSetting(variable=name, value=raw, expected=expected) from None

        def positive_int(raw: str) -> int:
            value = int(raw)
            if value < 1:
                raise ValueError(raw)
            return value

        def port(raw: str) -> int:
            value = int(raw)
            if not 0 <= value <= 65535:
                raise ValueError(raw)
            return value

        def positive_float(raw: str) -> float:
            value = float(raw)
            if not value > 0:
                raise ValueError(raw)
            return value

        def one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
            def parse(raw: str) -> str:
                if raw.upper() not in choices:
                    raise ValueError(raw)
                return raw.upper()

            return parse

        def non_negative_float(raw: str) -> float:
            value = float(raw)
            if not value >= 0:
                raise ValueError(raw)
            return value

        def non_negative_int(raw: str) -> int:
            value = int(raw)
            if value < 0:
                raise ValueError(raw)
            return value

        def existing_file(raw: str) -> Path:
            if not Path(raw).is_file():
                raise ValueError(raw)
            return Path(raw)

        tls_cert = read("CRASHSAFE_TLS_CERT_FILE", None, existing_file, "the path of a PEM file that exists")
        tls_key = read("CRASHSAFE_TLS_KEY_FILE", None, existing_file, "the path of a PEM file that exists")
        if (tls_cert is None) != (tls_key is None):
            missing = "CRASHSAFE_TLS_KEY_FILE" if tls_key is None else "CRASHSAFE_TLS_CERT_FILE"
            raise InvalidSetting(
                variable=missing, value="", expected="set together with its pair, or neither"
            )
        sandbox_url = get("CRASHSAFE_SANDBOX_URL") or cls.sandbox_url
        api_key = get("OPENAI_API_KEY")
        base_url = get("OPENAI_BASE_URL")
        if not api_key:
            # No real provider configured: the sandbox's scripted model answers on the real OpenAI protocol.
            base_url = base_url or f"{sandbox_url}/v1"
            api_key = "sandbox"

        def readable_file(name: str) -> Path | None:
            raw = get(name)
            if raw is None:
                return None
            if not os.access(raw, os.R_OK) or not Path(raw).is_file():
                raise InvalidSetting(variable=name, value=raw, expected="a file this process can read")
            return Path(raw)

        nats_access = NatsAccess(
            creds=readable_file("CRASHSAFE_NATS_CREDS"),
            tls_ca_file=readable_file("CRASHSAFE_NATS_TLS_CA_FILE"),
            tls_cert_file=readable_file("CRASHSAFE_NATS_TLS_CERT_FILE"),
            tls_key_file=readable_file("CRASHSAFE_NATS_TLS_KEY_FILE"),
        )
        if (nats_access.tls_cert_file is None) != (nats_access.tls_key_file is None):
            raise InvalidSetting(
                variable="CRASHSAFE_NATS_TLS_KEY_FILE"
                if nats_access.tls_cert_file
                else "CRASHSAFE_NATS_TLS_CERT_FILE",
                value="unset",
                expected="CRASHSAFE_NATS_TLS_CERT_FILE and CRASHSAFE_NATS_TLS_KEY_FILE set together",
            )
        partitions = read(
            "CRASHSAFE_ACTION_PARTITIONS", DEFAULT_ACTION_PARTITIONS, positive_int, "a whole number >= 1"
        )
        store_backups, retention = read_store_backups(get, read_retention(get), cls.lease_s)
        return cls(
            nats_url=get("CRASHSAFE_NATS_URL") or cls.nats_url,
            namespace=read(
                "CRASHSAFE_NAMESPACE",
                Namespace(),
                Namespace,
                "lower-case letters, digits and _, starting with a letter",
            ),
            registry=get("CRASHSAFE_REGISTRY") or cls.registry,
            partitions=partitions,
            owned_partitions=read(
                "CRASHSAFE_PARTITIONS",
                tuple(range(partitions)),
                lambda raw: parse_partitions(raw, partitions),
                f"all, a range like 0-1, or a list like 0,2, within 0..{partitions - 1}",
            ),
            shared_partitions=(get("CRASHSAFE_PARTITIONS") or "all") == "all",
            data_dir=Path(get("CRASHSAFE_DATA_DIR") or cls.data_dir),
            sqlite_sync=read(
                "CRASHSAFE_SQLITE_SYNC", cls.sqlite_sync, one_of(SQLITE_SYNC_MODES), "NORMAL or FULL"
            ),
            sandbox_url=sandbox_url,
            providers=provider_settings(env),
            gateway_host=get("CRASHSAFE_GATEWAY_HOST") or cls.gateway_host,
            gateway_port=read("CRASHSAFE_GATEWAY_PORT", cls.gateway_port, port, "a port number 0-65535"),
            sandbox_port=read("CRASHSAFE_SANDBOX_PORT", cls.sandbox_port, port, "a port number 0-65535"),
            model=get("CRASHSAFE_MODEL") or cls.model,
            openai_base_url=base_url,
            openai_organization=get("OPENAI_ORG_ID"),
            openai_project=get("OPENAI_PROJECT_ID"),
            openai_api_key=api_key,
            worker_id=get("CRASHSAFE_WORKER_ID") or f"{socket.gethostname()}-{os.getpid()}",
            ack_wait_s=read("CRASHSAFE_ACK_WAIT_S", cls.ack_wait_s, positive_float, "seconds, a number > 0"),
            stream_replicas=read("CRASHSAFE_STREAM_REPLICAS", cls.stream_replicas, positive_int, "1, 3 or 5"),
            log_level=read("CRASHSAFE_LOG_LEVEL", cls.log_level, one_of(LOG_LEVELS), ", ".join(LOG_LEVELS)),
            crash_at=get("CRASHSAFE_CRASH_AT"),
            api_key=get("CRASHSAFE_API_KEY"),
            tls_cert_file=tls_cert,
            tls_key_file=tls_key,
            rate_per_client=read(
                "CRASHSAFE_RATE_PER_CLIENT", cls.rate_per_client, non_negative_float, "a number >= 0"
            ),
            rate_per_guest=read(
                "CRASHSAFE_RATE_PER_GUEST", cls.rate_per_guest, non_negative_float, "a number >= 0"
            ),
            reconcile_per_minute=read(
                "CRASHSAFE_RECONCILE_PER_MINUTE",
                cls.reconcile_per_minute,
                non_negative_float,
                "a number >= 0",
            ),
            active_runs_per_guest=read(
                "CRASHSAFE_ACTIVE_RUNS_PER_GUEST",
                cls.active_runs_per_guest,
                non_negative_int,
                "a whole number >= 0",
            ),
            turns_per_run=read(
                "CRASHSAFE_TURNS_PER_RUN", cls.turns_per_run, non_negative_int, "a whole number >= 0"
            ),
            run_inbox=read("CRASHSAFE_RUN_INBOX", cls.run_inbox, non_negative_int, "a whole number >= 0"),
            capability_signing_key=(
                Path(raw) if (raw := get("CRASHSAFE_CAPABILITY_SIGNING_KEY")) is not None else None
            ),
            capability_verify_keys=tuple(
                Path(p.strip())
                for p in (get("CRASHSAFE_CAPABILITY_VERIFY_KEYS") or "").split(",")
                if p.strip()
            ),
            nats_access=nats_access,
            projection_time_scale=read(
                "CRASHSAFE_PROJECTION_TIME_SCALE",
                cls.projection_time_scale,
                positive_float,
                "a number > 0 (1.0: the policies' own durations)",
            ),
            synthetic_gateway_url=get("CRASHSAFE_SYNTHETIC_GATEWAY_URL"),
            # Not checked here: a probe's missing key must not stop the reconciler; each turn reads it (rotation
            # without a restart) and a key it cannot read is a failed turn saying so.
            synthetic_key_file=(
                Path(raw) if (raw := get("CRASHSAFE_SYNTHETIC_KEY_FILE")) is not None else None
            ),
            synthetic_every_s=read(
                "CRASHSAFE_SYNTHETIC_EVERY_S",
                cls.synthetic_every_s,
                non_negative_float,
                "seconds, a number >= 0",
            ),
            synthetic_budget_s=read(
                "CRASHSAFE_SYNTHETIC_BUDGET_S",
                cls.synthetic_budget_s,
                positive_float,
                "seconds, a number > 0",
            ),
            knowledge_dir=(Path(raw) if (raw := get("CRASHSAFE_KNOWLEDGE_DIR")) is not None else None),
            otel=tuple(sorted((k, v) for k, v in env.items() if k.startswith("OTEL_"))),
            ops_host=get("CRASHSAFE_OPS_HOST") or cls.ops_host,
            ops_port=read("CRASHSAFE_OPS_PORT", cls.ops_port, port, "a port number 0-65535"),
            loop_stall_s=read(
                "CRASHSAFE_LOOP_STALL_S", cls.loop_stall_s, positive_float, "seconds, a number > 0"
            ),
            hook_limit_s=read(
                "CRASHSAFE_HOOK_LIMIT_S",
                cls.hook_limit_s,
                non_negative_float,
                "seconds, a number >= 0 (0: off)",
            ),
            retention=retention,
            store_backups=store_backups,
            archive_dir=(Path(raw) if (raw := get("CRASHSAFE_ARCHIVE_DIR")) else None),
        )

    def provider(self, name: str) -> ProviderSettings | None:
        """A provider's settings; None if nothing configures it. The default one is always there, at
        `sandbox_url`, with the credential its CRASHSAFE_PROVIDER_DEFAULT_CREDENTIAL_FILE holds, if any."""
        named = next((p for p in self.providers if p.name == name), None)
        if name == DEFAULT_PROVIDER:
            return ProviderSettings(DEFAULT_PROVIDER, self.sandbox_url, named.credential if named else None)
        return named

    def with_partitions(self, spec: str) -> Settings:
        """These settings with the owned partitions of a `--partitions` flag (it wins over the environment)."""
        try:
            owned = parse_partitions(spec, self.partitions)
        except ValueError:
            raise InvalidSetting(
                variable="--partitions",
                value=spec,
                expected=f"all, 0-1 or 0,2 within 0..{self.partitions - 1}",
            ) from None
        return dataclasses.replace(self, owned_partitions=owned, shared_partitions=spec == "all")
