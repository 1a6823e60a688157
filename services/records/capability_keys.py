"""Capability keys on disk: the runtime's Ed25519 signing key and the executors' verification keys (PEM files)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
    load_pem_public_key,
)

from crashsafe.contracts.capabilities import CapabilityIssuer, CapabilityVerifier, key_id
from crashsafe.contracts.errors import InvalidSetting

SIGNING_KEY_VARIABLE = "CRASHSAFE_CAPABILITY_SIGNING_KEY"
VERIFY_KEYS_VARIABLE = "CRASHSAFE_CAPABILITY_VERIFY_KEYS"


def public_path(private_path: Path) -> Path:
    """Where a key pair's public half lives: `capability.key` -> `capability.pub`."""
    return private_path.with_suffix(".pub")


def write_key_pair(private_path: Path) -> str:
    """A new Ed25519 key pair: the private key at `private_path` (0600, created exclusively: an existing key is
    never overwritten) and its public key beside it (`.pub`). Returns the key id."""
    key = Ed25519PrivateKey.generate()
    private_path.parent.mkdir(parents=True, exist_ok=True)
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    public_path(private_path).write_bytes(
        key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    )
    return key_id(key.public_key())


def ensure_key_pair(private_path: Path) -> str:
    """The key pair at `private_path`, made once: a restarted stack keeps signing with the same key."""
    if private_path.exists() and public_path(private_path).exists():
        return key_id(_read_public(public_path(private_path), VERIFY_KEYS_VARIABLE))
    return write_key_pair(private_path)


def load_issuer(path: Path | None) -> CapabilityIssuer:
    """The runtime's issuer from its private key file; a runtime without one must not start."""
    if path is None:
        raise InvalidSetting(
            variable=SIGNING_KEY_VARIABLE,
            value="",
            expected="the path of the runtime's Ed25519 private key (PEM); make one with "
            "`crashsafe capability-key new --out PATH`",
        )
    try:
        key = load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise InvalidSetting(
            variable=SIGNING_KEY_VARIABLE,
            value=str(path),
            expected=f"a readable, unencrypted Ed25519 private key in PEM ({type(exc).__name__})",
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise InvalidSetting(
            variable=SIGNING_KEY_VARIABLE, value=str(path), expected="an Ed25519 key, not another kind"
        )
    return CapabilityIssuer(key)


def _read_public(path: Path, variable: str) -> Ed25519PublicKey:
    try:
        key = load_pem_public_key(path.read_bytes())
    except (OSError, ValueError, TypeError) as exc:
        raise InvalidSetting(
            variable=variable,
            value=str(path),
            expected=f"a readable Ed25519 public key in PEM ({type(exc).__name__})",
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise InvalidSetting(variable=variable, value=str(path), expected="an Ed25519 key, not another kind")
    return key


def read_public_keys(paths: Iterable[Path]) -> list[Ed25519PublicKey]:
    """The runtime's public keys (PEM files): what a run's evidence names as the keys that signed it."""
    return [_read_public(p, VERIFY_KEYS_VARIABLE) for p in paths]


def load_verifier(
    paths: Iterable[Path],
    compensation_tools: Iterable[str],
    model_tools: Mapping[str, Iterable[str]] | None = None,
) -> CapabilityVerifier:
    """An executor's verifier from one or two public key files (two while the runtime's key is rotated)."""
    paths = list(paths)
    if not 1 <= len(paths) <= 2:
        raise InvalidSetting(
            variable=VERIFY_KEYS_VARIABLE,
            value=",".join(map(str, paths)),
            expected="one or two paths of the runtime's Ed25519 public keys (PEM), comma-separated",
        )
    return CapabilityVerifier(
        [_read_public(p, VERIFY_KEYS_VARIABLE) for p in paths], compensation_tools, model_tools
    )
