"""What each service of a `crashsafe up` stack is given: a provider's credential only where providers are called."""

from __future__ import annotations

from pathlib import Path

import pytest

from crashsafe.stack import Stack
from crashsafe.stack_env import service_env

CREDENTIAL = "CRASHSAFE_PROVIDER_SHOP_CREDENTIAL_FILE"


def test_a_providers_credential_reaches_executors_and_the_projector_only_from_the_shell_or_the_stacks_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("default", "shop"):
        (tmp_path / name).write_text(f"sk_test_{name}")  # masks need 8 characters or more
    monkeypatch.setenv("CRASHSAFE_PROVIDER_DEFAULT_CREDENTIAL_FILE", str(tmp_path / "default"))
    stack = Stack(tmp_path / "stack", env={CREDENTIAL: str(tmp_path / "shop")})
    given = {name: service_env(stack, service) for name, service in stack.services.items()}
    callers = {name for name in given if name.startswith("executor-") or name == "projector"}
    assert callers and {"gateway", "runtime"} <= set(given) - callers
    for name, env in given.items():
        held = {v for v in (CREDENTIAL, "CRASHSAFE_PROVIDER_DEFAULT_CREDENTIAL_FILE") if v in env}
        assert held == (
            {CREDENTIAL, "CRASHSAFE_PROVIDER_DEFAULT_CREDENTIAL_FILE"} if name in callers else set()
        ), name
