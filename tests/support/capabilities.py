"""The tests' capability keys: one Ed25519 pair per test session, the issuer every in-process runtime signs with,
the verifier every in-process executor checks with, and `signed()` for a test that publishes requests itself.

A test that plays the runtime signs through `signed()` and nothing else; a test that plays an attacker builds
its requests without it (or with `OTHER_ISSUER`, a key no executor trusts)."""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from bench.workloads import registry as bench_registry
from crashsafe.contracts.capabilities import GRACE_S, CapabilityIssuer, CapabilityOrigin, CapabilityVerifier
from crashsafe.contracts.tool_messages import ActionRequest
from crashsafe.domain.registry import Registry
from crashsafe.services.records.capability_keys import VERIFY_KEYS_VARIABLE, public_path

_COMPENSATION_TOOLS = bench_registry().compensation_only
_SESSION_KEY = Ed25519PrivateKey.generate()
ISSUER = CapabilityIssuer(_SESSION_KEY)
# A well-formed key the executors were never given: what a forger holding "a" key can sign with.
OTHER_ISSUER = CapabilityIssuer(Ed25519PrivateKey.generate())


def verifier(registry: Registry) -> CapabilityVerifier:
    """What an executor of this deployment checks capabilities with: the session's public key."""
    return CapabilityVerifier([_SESSION_KEY.public_key()], registry.compensation_only, registry.model_tools)


def signed(
    request: ActionRequest,
    origin: CapabilityOrigin | None = None,
    expires_at: datetime | None = None,
    issuer: CapabilityIssuer = ISSUER,
    agent: str = "",
) -> ActionRequest:
    """`request` with the capability the runtime would attach: `plan`, or `compensation` for a compensation-only
    tool of the tests' registry, expiring at its deadline plus the grace, bound to `agent` if given."""
    if origin is None:
        compensation = request.tool in _COMPENSATION_TOOLS
        origin = CapabilityOrigin.COMPENSATION if compensation else CapabilityOrigin.PLAN
    expires_at = expires_at or request.deadline_at + timedelta(seconds=GRACE_S)
    return issuer.grant(request, origin, expires_at, agent)


def install(private_path: Path) -> None:
    """Put the session's key pair where a stack looks for it (`<state>/keys/capability.key`, 0600, and `.pub`),
    so a stack of real processes signs and verifies with the key the test signs with. A stack finding a pair
    there uses it instead of making its own."""
    private_path.parent.mkdir(parents=True, exist_ok=True)
    pem = _SESSION_KEY.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    public = _SESSION_KEY.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    public_path(private_path).write_bytes(public)


def executor_env(directory: Path) -> dict[str, str]:
    """The environment an executor process started by a test needs to verify the session's capabilities: the
    session's public key written under `directory`."""
    path = directory / "capability.pub"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_SESSION_KEY.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    return {VERIFY_KEYS_VARIABLE: str(path)}
