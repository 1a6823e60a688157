"""Which public key a signature in a bundle is checked with: the bundle's own, or, once `--trust` pins keys, only
a pinned one (a bundle carries its keys, so a forger who re-signs can carry a key of their own too)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping

import nacl.exceptions
import nacl.signing
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from crashsafe.contracts.capabilities import key_id
from crashsafe.evidence_findings import Check, Finding, Status


def unb64(text: str) -> bytes:
    """base64url without padding, as keys and signatures are written; ValueError (binascii.Error) if it is not."""
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def raw_key_id(raw: bytes) -> str:
    """The key id of a raw Ed25519 public key (`capabilities.key_id`); ValueError if it is not one."""
    return key_id(Ed25519PublicKey.from_public_bytes(raw))


def signature_holds(raw: bytes, message: bytes, sig: str) -> bool:
    try:
        nacl.signing.VerifyKey(raw).verify(message, unb64(sig))
    except (nacl.exceptions.CryptoError, ValueError, TypeError, binascii.Error):
        return False
    return True


class SigningKeys:
    """The keys signatures are checked with. Without `trusted`: the bundle's, each of which must be the key its id
    names. With `trusted` (key id -> raw key, read from the PEM files given): only those; a kid the bundle maps to
    another key, or a kid that is not trusted, is refused."""

    def __init__(self, bundle_keys: Mapping[str, str], trusted: Mapping[str, bytes] | None) -> None:
        self.trusted = dict(trusted) if trusted is not None else None
        self.bundled: dict[str, bytes] = {}
        self.malformed: dict[str, str] = {}  # kid -> why the bundle's key for it cannot be used
        for kid, text in bundle_keys.items():
            try:
                raw = unb64(text)
                named = raw_key_id(raw)
            except (ValueError, TypeError, binascii.Error):
                self.malformed[kid] = f"the bundle's public key {kid!r} is not a raw Ed25519 key in base64url"
                continue
            if named != kid:
                # A key filed under another key's id: what a forger who swapped the key but kept the id leaves.
                self.malformed[kid] = (
                    f"the bundle files a public key under id {kid!r}, but that key's id is {named!r}: "
                    "the key was swapped"
                )
                continue
            self.bundled[kid] = raw

    def key(self, kid: str) -> tuple[bytes | None, str]:
        """The raw key to check a signature by `kid` with, or None and why not (a sentence)."""
        if kid in self.malformed:
            return None, self.malformed[kid]
        if self.trusted is not None:
            pinned = self.trusted.get(kid)
            if pinned is None:
                return None, (
                    f"signed by key {kid!r}, which is not among the trusted keys (--trust): whoever made this "
                    "bundle signed it, not a runtime you trust"
                )
            bundled = self.bundled.get(kid)
            if bundled is not None and bundled != pinned:
                return None, f"the bundle's key {kid!r} is not the trusted key of that id"
            return pinned, ""
        raw = self.bundled.get(kid)
        if raw is None:
            return None, f"signed by key {kid!r}, which the bundle does not hold"
        return raw, ""

    def findings(self) -> list[Finding]:
        """The bundle's keys that cannot be used at all, each a failure of the bundle."""
        return [
            Finding(check=Check.BUNDLE, status=Status.FAIL, message=why) for why in self.malformed.values()
        ]
