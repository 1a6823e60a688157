"""Capability keys as an operator meets them: `crashsafe capability-key new`, the stack's own pair under its state
dir (0600, the private key given to runtimes only), and services that will not start without their key."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from crashsafe.contracts.errors import InvalidSetting
from crashsafe.services.records.capability_keys import (
    SIGNING_KEY_VARIABLE,
    VERIFY_KEYS_VARIABLE,
    ensure_key_pair,
    load_issuer,
    load_verifier,
    public_path,
)
from crashsafe.stack import Stack
from tests.support.stack import crashsafe


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_capability_key_new_writes_a_private_key_only_its_owner_reads_and_never_overwrites(
    tmp_path: Path,
) -> None:
    out = tmp_path / "keys" / "capability-2.key"
    made = await crashsafe("capability-key", "new", "--out", str(out))
    assert made.returncode == 0, made.stderr
    assert _mode(out) == 0o600 and public_path(out).exists()
    issuer = load_issuer(out)
    verifier = load_verifier([public_path(out)], ())
    assert issuer.kid in made.stdout and set(verifier.keys) == {issuer.kid}
    assert b"PRIVATE KEY" not in public_path(out).read_bytes()

    again = await crashsafe("capability-key", "new", "--out", str(out))
    assert again.returncode != 0 and "never overwritten" in again.stderr
    assert load_issuer(out).kid == issuer.kid


def test_a_stack_makes_its_key_pair_once_and_gives_the_private_key_to_runtimes_only(tmp_path: Path) -> None:
    stack = Stack(tmp_path, nats_url="nats://127.0.0.1:1", scale={"runtime": 2, "executor-payment": 2})
    kid = ensure_key_pair(stack.capability_key)
    assert stack.capability_key == tmp_path.resolve() / "keys" / "capability.key"
    assert _mode(stack.capability_key) == 0o600
    assert ensure_key_pair(stack.capability_key) == kid  # a restarted stack keeps its key
    for name, service in stack.services.items():
        env = stack.env_for(service)
        if service.base == "runtime":
            assert env[SIGNING_KEY_VARIABLE] == str(stack.capability_key), name
            assert VERIFY_KEYS_VARIABLE not in env, name
        elif service.base.startswith("executor-") or service.base == "gateway":
            # The gateway names the public key in the evidence bundles its console hands out (issue 34).
            assert env[VERIFY_KEYS_VARIABLE] == str(public_path(stack.capability_key)), name
            assert SIGNING_KEY_VARIABLE not in env, name
        else:
            assert SIGNING_KEY_VARIABLE not in env and VERIFY_KEYS_VARIABLE not in env, name


@pytest.mark.parametrize(
    ("service", "variable"),
    [(("runtime",), SIGNING_KEY_VARIABLE), (("executor", "--tool", "payment"), VERIFY_KEYS_VARIABLE)],
    ids=["runtime", "executor"],
)
async def test_a_service_without_its_capability_key_refuses_to_start_naming_the_variable(
    service: tuple[str, ...], variable: str, tmp_path: Path
) -> None:
    env = {
        SIGNING_KEY_VARIABLE: "",
        VERIFY_KEYS_VARIABLE: "",
        "CRASHSAFE_NATS_URL": "nats://127.0.0.1:1",
        "CRASHSAFE_DATA_DIR": str(tmp_path),
    }
    result = await crashsafe("serve", *service, env=env, timeout_s=30)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"crashsafe: {variable}="), result.stderr


def test_an_unusable_key_file_is_an_invalid_setting_naming_the_variable(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.key"
    garbage.write_text("not a key")
    with pytest.raises(InvalidSetting) as caught:
        load_issuer(garbage)
    assert caught.value.variable == SIGNING_KEY_VARIABLE
    with pytest.raises(InvalidSetting) as caught:
        load_verifier([garbage], ())
    assert caught.value.variable == VERIFY_KEYS_VARIABLE
    ensure_key_pair(tmp_path / "a.key")
    with pytest.raises(InvalidSetting):  # a private key where a public one is expected
        load_verifier([tmp_path / "a.key"], ())
    with pytest.raises(InvalidSetting):  # at most two during a rotation
        load_verifier([public_path(tmp_path / "a.key")] * 3, ())
