"""The environment a stack gives each service it starts: NATS, its credential, its keys, its ports, its registry."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING

from crashsafe.contracts.provider_settings import CREDENTIAL_FILE_SUFFIX, PROVIDER_PREFIX
from crashsafe.crash_targets import CRASH_VARIABLE
from crashsafe.services.records.capability_keys import (
    SIGNING_KEY_VARIABLE,
    VERIFY_KEYS_VARIABLE,
    public_path,
)
from crashsafe.stack_keys import SYNTHETIC_KEY_FILE
from crashsafe.stack_processes import SINGLE_PORT, Service

if TYPE_CHECKING:
    from crashsafe.stack import Stack


def _import_root(registry: str) -> str | None:
    """The directory a registry's top-level package is imported from, as this process sees it."""
    top = registry.split(":", 1)[0].split(".", 1)[0]
    spec = importlib.util.find_spec(top)
    if spec is None:
        return None
    where = list(spec.submodule_search_locations or []) or ([spec.origin] if spec.origin else [])
    return str(Path(where[0]).parent) if where else None


def service_env(stack: Stack, service: Service) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "CRASHSAFE_NATS_URL": stack.nats_url,
            "CRASHSAFE_NAMESPACE": stack.namespace,
            "CRASHSAFE_DATA_DIR": str(stack.state_dir / "data"),
            "CRASHSAFE_SANDBOX_URL": stack.sandbox_url,
            "CRASHSAFE_SANDBOX_PORT": str(stack.sandbox_port),
            "CRASHSAFE_GATEWAY_PORT": str(stack.gateway_port),
            "CRASHSAFE_WORKER_ID": service.name,
            "PYTHONUNBUFFERED": "1",
        }
    )
    # Not this shell's seam: in every service it would kill every process passing it. A seam is armed in one
    # service, for one life, by `crash=` (`service.once_env`); `crashsafe up` reads the variable as a `--crash`.
    env.pop(CRASH_VARIABLE, None)
    # Capabilities: only runtimes get the signing key; executors and the gateway the public key; nobody else.
    env.pop(SIGNING_KEY_VARIABLE, None)
    env.pop(VERIFY_KEYS_VARIABLE, None)
    if service.base == "runtime":
        env[SIGNING_KEY_VARIABLE] = str(stack.capability_key)
    elif service.base.startswith("executor-") or service.base == "gateway":
        # The gateway names the public key in a run's evidence bundle (the console's download).
        env[VERIFY_KEYS_VARIABLE] = str(public_path(stack.capability_key))
    if service.base == "reconciler":
        env["CRASHSAFE_SYNTHETIC_GATEWAY_URL"] = stack.gateway_url
        env["CRASHSAFE_SYNTHETIC_KEY_FILE"] = str(stack.state_dir / SYNTHETIC_KEY_FILE)
        if not stack.synthetic:
            env["CRASHSAFE_SYNTHETIC_EVERY_S"] = "0"
    if stack.registry:
        env["CRASHSAFE_REGISTRY"] = stack.registry
        where = _import_root(stack.registry)
        if where:
            # A registry outside the installed packages (the benchmark's) must import in every service too.
            env["PYTHONPATH"] = os.pathsep.join(p for p in (where, env.get("PYTHONPATH")) if p)
    env.pop("CRASHSAFE_NATS_CREDS", None)
    creds = stack.creds_for(service.base)
    if creds is not None:
        env["CRASHSAFE_NATS_CREDS"] = str(creds)
    env.update(stack.base_env)
    if not (service.base.startswith("executor-") or service.base == "projector"):
        # Provider credentials only where providers are called (the gateway asks executors for its provider
        # views), whether they came from this shell or from the stack's own `--env`.
        for name in [n for n in env if n.startswith(PROVIDER_PREFIX) and n.endswith(CREDENTIAL_FILE_SUFFIX)]:
            env.pop(name)
    if stack.model_url:
        env["OPENAI_BASE_URL"] = stack.model_url
    if service.name not in SINGLE_PORT:
        # Each life binds a free ops port itself and prints it (`ops listening on …`): a port chosen here and
        # bound later could be taken meanwhile by another process, and replicas keep one environment.
        env["CRASHSAFE_OPS_PORT"] = "0"
    env.update(service.env)
    env.update(service.once_env)
    return env


def operator_env(stack: Stack) -> dict[str, str]:
    """What an operator's task against the stack reads (`crashsafe.testing`'s audit): the services' NATS, namespace,
    providers and registry, as the operator's NATS user."""
    env = {**os.environ, **stack.base_env}
    env.pop(CRASH_VARIABLE, None)
    env.pop("CRASHSAFE_NATS_CREDS", None)
    env.update(
        {
            "CRASHSAFE_NATS_URL": stack.nats_url,
            "CRASHSAFE_NAMESPACE": stack.namespace,
            "CRASHSAFE_SANDBOX_URL": stack.sandbox_url,
        }
    )
    if stack.registry:
        env["CRASHSAFE_REGISTRY"] = stack.registry
    if (operator := stack.creds_for("operator")) is not None:
        env["CRASHSAFE_NATS_CREDS"] = str(operator)
    return env


def model_at(stack: Stack) -> tuple[str, str]:
    """Where the runtime asks its model, and why there: said by `crashsafe up`, never guessed silently."""
    if stack.model_url:
        return stack.model_url, "--model-url"
    env = {**os.environ, **stack.base_env}
    if env.get("OPENAI_BASE_URL"):
        return env["OPENAI_BASE_URL"], "OPENAI_BASE_URL"
    if env.get("OPENAI_API_KEY"):
        return "https://api.openai.com/v1", "OPENAI_API_KEY, OpenAI's own URL"
    if stack.runs_sandbox:
        return f"{stack.sandbox_url}/v1", "the sandbox's scripted model"
    return (
        f"{stack.sandbox_url}/v1",
        "the providers' URL + /v1: no --model-url, OPENAI_BASE_URL or OPENAI_API_KEY",
    )
