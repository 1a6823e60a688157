"""Service configuration read once from environment variables (how a container on Kubernetes is configured)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from contracts.subjects import DEFAULT_ACTION_PARTITIONS, Namespace


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


@dataclass(frozen=True)
class Settings:
    nats_url: str = "nats://127.0.0.1:4222"
    namespace: Namespace = field(default_factory=Namespace)
    partitions: int = DEFAULT_ACTION_PARTITIONS
    data_dir: Path = Path(".crashsafe/data")
    sandbox_url: str = "http://127.0.0.1:8090"
    gateway_host: str = "127.0.0.1"
    gateway_port: int = 8080
    sandbox_port: int = 8090
    model: str = "scripted-booking"
    openai_base_url: str | None = None
    openai_api_key: str | None = None
    worker_id: str = ""
    ack_wait_s: float = 1.0
    stream_replicas: int = 1

    @classmethod
    def from_env(cls) -> Settings:
        sandbox_url = _env("CRASHSAFE_SANDBOX_URL", "http://127.0.0.1:8090")
        api_key = os.environ.get("OPENAI_API_KEY")
        base_url = os.environ.get("OPENAI_BASE_URL")
        if not api_key:
            # No real provider configured: the sandbox's scripted model answers on the real OpenAI protocol.
            base_url = base_url or f"{sandbox_url}/v1"
            api_key = "sandbox"
        return cls(
            nats_url=_env("CRASHSAFE_NATS_URL", "nats://127.0.0.1:4222"),
            namespace=Namespace.from_env(),
            partitions=int(_env("CRASHSAFE_ACTION_PARTITIONS", str(DEFAULT_ACTION_PARTITIONS))),
            data_dir=Path(_env("CRASHSAFE_DATA_DIR", ".crashsafe/data")),
            sandbox_url=sandbox_url,
            gateway_host=_env("CRASHSAFE_GATEWAY_HOST", "127.0.0.1"),
            gateway_port=int(_env("CRASHSAFE_GATEWAY_PORT", "8080")),
            sandbox_port=int(_env("CRASHSAFE_SANDBOX_PORT", "8090")),
            model=_env("CRASHSAFE_MODEL", "scripted-booking"),
            openai_base_url=base_url,
            openai_api_key=api_key,
            worker_id=_env("CRASHSAFE_WORKER_ID", f"{socket.gethostname()}-{os.getpid()}"),
            ack_wait_s=float(_env("CRASHSAFE_ACK_WAIT_S", "1")),
            stream_replicas=int(_env("CRASHSAFE_STREAM_REPLICAS", "1")),
        )
