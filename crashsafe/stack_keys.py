"""A stack's own API keys (its admin key, its approver's, the synthetic turn's), minted as the operator into 0600
files."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from crashsafe.contracts.clients import Scope

if TYPE_CHECKING:
    from crashsafe.stack import Stack


# The tenant of the admin key a stack mints for its own use (the demo, the tests, the scripts).
STACK_TENANT = "demo"
API_KEY_FILE = "api_key"
# The synthetic turn's key (tenant `synthetic`, scopes events:write and runs:read), for the reconciler and
# `crashsafe check synthetic`: `<state>/synthetic_key`, 0600.
SYNTHETIC_KEY_FILE = "synthetic_key"
# The stack's manager key (tenant `demo`, approvals:decide and runs:read, never events:write): the admin key starts
# the stack's runs, and the key that started a run never decides its approvals, so the CLI's decisions, the evals'
# and an operator's console sign-in decide with this one: `<state>/approver_key`, 0600.
APPROVER_KEY_FILE = "approver_key"
APPROVER_SCOPES = (Scope.APPROVALS_DECIDE, Scope.RUNS_READ)


def capability_key_path(state_dir: Path) -> Path:
    """The runtime's signing key a stack's state dir holds (0600, made once; its public half beside it)."""
    return state_dir / "keys" / "capability.key"


def mint_stack_keys(stack: Stack) -> tuple[str, str]:
    """Every key `crashsafe up` mints, each replacing (and revoking) the one a previous start left: (the admin
    key, the approver key)."""
    from crashsafe.contracts.synthetic_turn import SYNTHETIC_TENANT

    admin = mint_stack_key(stack, API_KEY_FILE, STACK_TENANT, (Scope.ADMIN,), "crashsafe up")
    approver = mint_stack_key(
        stack, APPROVER_KEY_FILE, STACK_TENANT, APPROVER_SCOPES, "crashsafe up approver"
    )
    synthetic = (Scope.EVENTS_WRITE, Scope.RUNS_READ)
    mint_stack_key(stack, SYNTHETIC_KEY_FILE, SYNTHETIC_TENANT, synthetic, "synthetic turn")
    return admin, approver


def mint_stack_key(stack: Stack, file: str, tenant: str, scopes: tuple[Scope, ...], name: str) -> str:
    """A key of this stack's, minted as the operator into `<state>/<file>` (0600, the key alone on one line),
    revoking the one a previous start left there. Runs its own event loop in its own thread, since `start`
    may be called from a thread that already runs one."""
    from crashsafe.services.platform.settings import NatsAccess
    from crashsafe.services.records.client_keys import replace_stack_key

    # The bucket gets the replicas the services would give it (a cluster's `CRASHSAFE_STREAM_REPLICAS=3`).
    replicas = stack.service_settings().stream_replicas
    path = stack.state_dir / file
    previous = path.read_text().strip() if path.exists() else None
    with ThreadPoolExecutor(1, thread_name_prefix="mint-key") as pool:
        key = pool.submit(
            asyncio.run,
            replace_stack_key(
                stack.nats_url,
                stack.namespace,
                tenant,
                previous,
                replicas,
                NatsAccess(creds=stack.creds_for("operator")),
                scopes=scopes,
                name=name,
            ),
        ).result()
    stack.state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(key + "\n")
    os.chmod(path, 0o600)  # an older file keeps its mode through O_TRUNC
    return key
