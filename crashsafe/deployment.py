"""Which deployment an operator command talks to: the environment, filled in from the stack `crashsafe up` recorded
in its state directory (stack.json, its API key) where the environment is silent."""

from __future__ import annotations

import json
from pathlib import Path

from crashsafe.contracts.errors import InvalidSetting
from crashsafe.services.platform.settings import Settings
from crashsafe.stack_keys import API_KEY_FILE, APPROVER_KEY_FILE

# What a decision of an approval is sent with where CRASHSAFE_API_KEY is silent: the approver key `crashsafe up`
# wrote (the admin key starts the stack's runs, and the key that started a run never decides its approvals); a
# state dir from before it had one, its admin key.
DECIDING_KEY_FILES = (APPROVER_KEY_FILE, API_KEY_FILE)


def stack_file(state_dir: Path) -> dict[str, object]:
    path = state_dir / "stack.json"
    if not path.exists():
        return {}
    return dict(json.loads(path.read_text()))


def settings_for(state_dir: Path) -> Settings:
    """Settings from the environment, filled in from a running stack's stack.json where the environment is silent."""
    stack = stack_file(state_dir)
    known = {
        "nats_url": "CRASHSAFE_NATS_URL",
        "namespace": "CRASHSAFE_NAMESPACE",
        "sandbox_url": "CRASHSAFE_SANDBOX_URL",
        # The operator's NATS credential `up` wrote (a path; the seed stays in its 0600 file).
        "operator_creds": "CRASHSAFE_NATS_CREDS",
        # The registry `up --registry` ran, so `audit`, `replay` and the rest know the stack's agents and tools.
        "registry": "CRASHSAFE_REGISTRY",
    }
    return Settings.from_env(defaults={var: str(stack[key]) for key, var in known.items() if stack.get(key)})


def api_key_for(state_dir: Path, files: tuple[str, ...] = (API_KEY_FILE,)) -> str | None:
    """The key a script talks to the gateway with: CRASHSAFE_API_KEY, else the first of `files` that `crashsafe
    up` wrote."""
    settings = Settings.from_env()
    if settings.api_key:
        return settings.api_key
    for file in files:
        path = state_dir / file
        if path.exists() and (key := path.read_text().strip()):
            return key
    return None


def gateway_for(
    state_dir: Path, gateway_url: str | None, files: tuple[str, ...] = (API_KEY_FILE,)
) -> tuple[str, dict[str, str]]:
    """The gateway's URL (`--gateway-url`, else the running stack's) and the header of the API key
    (`api_key_for`)."""
    url = gateway_url or str(stack_file(state_dir).get("gateway_url") or "")
    if not url:
        settings = Settings.from_env()
        url = f"http://{settings.gateway_host}:{settings.gateway_port}"
    key = api_key_for(state_dir, files)
    if not key:
        raise InvalidSetting(
            variable="CRASHSAFE_API_KEY",
            value="",
            expected=f"an API key with scope runs:read (approvals:decide to decide; or a stack started with `crashsafe up` in {state_dir})",
        )
    return url.rstrip("/"), {"authorization": f"Bearer {key}"}
