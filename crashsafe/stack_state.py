"""stack.json: what a running stack says about itself (URLs, pids with their identities, restarts) for
the CLI's operator commands (`down` finds its processes by it) and the tests; written whole, renamed into place."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from crashsafe.stack_processes import ProcessIdentity, Service

if TYPE_CHECKING:
    from crashsafe.stack import Stack


def write_stack_json(stack: Stack) -> None:
    me = ProcessIdentity.of(os.getpid())
    state = {
        "status": stack.status,
        "nats_url": stack.nats_url,
        "gateway_url": stack.gateway_url,
        "console_url": stack.console_url,
        "sandbox_url": stack.sandbox_url,
        # Set when `up --providers URL` runs against providers of someone else's (no sandbox process).
        "providers_url": stack.providers_url,
        # Set when `up --model-url URL` names the model's base URL (else the sandbox's, or OPENAI_BASE_URL).
        "model_url": stack.model_url,
        "namespace": stack.namespace,
        # The registry its services load (`up --registry`, else their environment's): operator commands follow it.
        "registry": stack.registry or stack.service_settings().registry,
        # Where the operator's NATS credential is (a path; the secret stays in its 0600 file).
        "operator_creds": str(operator) if (operator := stack.creds_for("operator")) else None,
        "supervisor_pid": os.getpid(),
        "supervisor": me.to_json() if me else None,
        "services": [_entry(stack, s) for s in stack._supervised()],
    }
    stack.state_dir.mkdir(parents=True, exist_ok=True)
    tmp = stack.state_dir / "stack.json.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(stack.state_dir / "stack.json")


def _entry(stack: Stack, service: Service) -> dict[str, Any]:
    alive = service.process is not None and service.process.poll() is None
    return {
        "name": service.name,
        "service": service.base,
        "pid": service.process.pid if service.process else None,
        "restarts": service.restarts,
        "identity": service.identity.to_json() if service.identity and alive else None,
        "ops_url": stack.ops_url(service.name),
    }
