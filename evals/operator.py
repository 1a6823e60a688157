"""What an operator does before a conversation, through the product's own CLI against the running stack: set a
guest's profile (`crashsafe guests set`), publish a catalog revision (`crashsafe config show|publish`)."""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

import msgspec

from crashsafe.contracts.catalog import AgentConfig, Catalog, catalog_decoder, catalog_encoder
from crashsafe.contracts.policy import (
    ApprovalAbove,
    Approver,
    OneActiveHold,
    RefundWithinPaid,
    Rule,
    StayWindow,
    VerifiedRecipient,
)
from crashsafe.stack_keys import STACK_TENANT


class OperatorError(RuntimeError):
    """A CLI command the scenario's setup needs failed: the message carries its exit code and last output."""


async def crashsafe(state_dir: Path, *args: str) -> str:
    """Run `crashsafe ARGS --state-dir STATE` as an operator would; its stdout, or OperatorError."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "crashsafe.cli",
        *args,
        "--state-dir",
        str(state_dir),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
    )
    out, err = await process.communicate()
    if process.returncode != 0:
        tail = (err or out).decode(errors="replace").strip().splitlines()[-3:]
        raise OperatorError(f"crashsafe {' '.join(args)} exited {process.returncode}: {' | '.join(tail)}")
    return out.decode(errors="replace")


async def set_guest(
    state_dir: Path, guest_id: str, *, verified_email: str, corporate: bool, manager: str
) -> None:
    """The guest's profile: the only address a message may go to, and whether a manager approves their stays."""
    args = ["guests", "set", guest_id, "--tenant", STACK_TENANT]
    if verified_email:
        args += ["--verified-email", verified_email]
    if corporate:
        args += ["--corporate"]
    if manager:
        args += ["--manager", manager]
    await crashsafe(state_dir, *args)


# The booking and support rules issue 9 names as the defaults: used when the stack cannot show its catalog.
DEFAULT_RULES: dict[str, list[Rule]] = {
    "booking": [
        StayWindow(name="stay_window", max_nights=30),
        ApprovalAbove(name="approval_above", tool="create_payment", limit_cents=150_000),
        ApprovalAbove(
            name="corporate_approval",
            tool="create_payment",
            limit_cents=0,
            approver=Approver.MANAGER.value,
            corporate_only=True,
        ),
        VerifiedRecipient(name="verified_recipient"),
        OneActiveHold(name="one_active_hold"),
    ],
    "support": [RefundWithinPaid(name="refund_within_paid", manager_above_cents=15_000)],
}


async def current_catalog(state_dir: Path) -> Catalog:
    """The catalog the stack runs now (`crashsafe config show`, its JSON), else the defaults above."""
    try:
        return catalog_decoder.decode(await crashsafe(state_dir, "config", "show"))
    except (OperatorError, msgspec.DecodeError):
        return Catalog(
            agents={name: AgentConfig(agent=name, rules=rules) for name, rules in DEFAULT_RULES.items()},
            label="evals: issue 9 defaults",
        )


def with_approval_ttl(catalog: Catalog, ttl_s: float) -> Catalog:
    """The same catalog, every approval it can ask for expiring after `ttl_s`."""

    def shorter(rule: Rule) -> Rule:
        if isinstance(rule, ApprovalAbove | RefundWithinPaid):
            return msgspec.structs.replace(rule, ttl_s=ttl_s)
        return rule

    agents = {
        name: msgspec.structs.replace(config, rules=[shorter(r) for r in config.rules])
        for name, config in catalog.agents.items()
    }
    return Catalog(agents=agents, label=f"evals: approvals expire after {ttl_s:g}s")


async def publish(state_dir: Path, catalog: Catalog) -> None:
    """Validate and publish `catalog` as the stack's next revision; new runs pin it."""
    with tempfile.TemporaryDirectory(prefix="crashsafe-evals-catalog-") as where:
        path = Path(where) / "catalog.json"
        path.write_bytes(catalog_encoder.encode(catalog))
        await crashsafe(state_dir, "config", "publish", str(path))
