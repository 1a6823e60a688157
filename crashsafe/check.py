"""`crashsafe check synthetic`: one synthetic turn (the scoped test tenant's reads) through the gateway, printed;
and, asked to, recorded where the reconciler's turns go."""

from __future__ import annotations

import logging
from pathlib import Path

from crashsafe.contracts.errors import InvalidSetting
from crashsafe.deployment import settings_for, stack_file
from crashsafe.services.operations.connection import operator_broker
from crashsafe.services.platform.settings import Settings
from crashsafe.stack_keys import SYNTHETIC_KEY_FILE


def synthetic_target(state_dir: Path, gateway_url: str | None, key: str | None) -> tuple[str, str]:
    """The gateway (`--gateway`, CRASHSAFE_SYNTHETIC_GATEWAY_URL, the running stack's, else the settings') and
    the synthetic key (`--key`, the file CRASHSAFE_SYNTHETIC_KEY_FILE names, else `<state>/synthetic_key`)."""
    settings = Settings.from_env()
    url = (
        gateway_url
        or settings.synthetic_gateway_url
        or str(stack_file(state_dir).get("gateway_url") or "")
        or f"http://{settings.gateway_host}:{settings.gateway_port}"
    )
    if not key:
        path = settings.synthetic_key_file or state_dir / SYNTHETIC_KEY_FILE
        key = path.read_text().strip() if path.is_file() else ""
    if not key:
        raise InvalidSetting(
            variable="CRASHSAFE_SYNTHETIC_KEY_FILE",
            value="",
            expected="the synthetic tenant's key: --key, the file this names, or a stack started with "
            f"`crashsafe up` in {state_dir} (mint one: crashsafe keys create --tenant synthetic "
            "--scope events:write --scope runs:read)",
        )
    return url.rstrip("/"), key


async def check_synthetic(
    state_dir: Path,
    gateway_url: str | None,
    key: str | None,
    budget_s: float | None = None,
    record: bool = False,
    as_json: bool = False,
) -> int:
    """One synthetic turn; prints its result; 0 if ok, 1 if slow or failed. `record`: also publish it on
    `<ns>.ops.synthetic.cli` with the operator's NATS credential (the history the reconciler's turns go to)."""
    from crashsafe.contracts.synthetic_turn import SyntheticResult, synthetic_encoder
    from crashsafe.domain.registry import load
    from crashsafe.services.reconciler.synthetic_probe import publish_turn, synthetic_turn

    url, secret = synthetic_target(state_dir, gateway_url, key)
    budget = budget_s if budget_s is not None else Settings.from_env().synthetic_budget_s
    # The stack's registry (`up --registry`, CRASHSAFE_REGISTRY) says what a turn asks: its declared probe's calls,
    # else StayHub's search.
    probe = load(settings_for(state_dir).registry).probe
    turn = await synthetic_turn(url, secret, budget_s=budget, by="cli", probe=probe)
    if as_json:
        print(synthetic_encoder.encode(turn).decode())
    else:
        run = f" run {turn.run_id}" if turn.run_id else ""
        print(f"synthetic: {turn.result} in {turn.duration_s:.2f}s (budget {budget:g}s){run}: {turn.reason}")
    if record:
        settings = settings_for(state_dir)
        async with operator_broker(settings, "crashsafe-check") as broker:
            await publish_turn(broker, settings.namespace, turn, logging.getLogger("crashsafe.check"))
    return 0 if turn.result == SyntheticResult.OK else 1
