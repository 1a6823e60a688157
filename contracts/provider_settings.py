"""A provider as a deployment configures it (its base URL and credential, from settings, never a catalog), and the
names of the variables that say so: the one place settings, executors and the docs agree on them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# The provider an operation talks to when it names none: the one at CRASHSAFE_SANDBOX_URL (the sandbox in a demo).
DEFAULT_PROVIDER = "default"
PROVIDER_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
# CRASHSAFE_PROVIDER_<NAME>_URL and CRASHSAFE_PROVIDER_<NAME>_CREDENTIAL_FILE, <NAME> the provider's name upper-cased.
PROVIDER_PREFIX = "CRASHSAFE_PROVIDER_"
URL_SUFFIX = "_URL"
CREDENTIAL_FILE_SUFFIX = "_CREDENTIAL_FILE"
DEFAULT_URL_VARIABLE = "CRASHSAFE_SANDBOX_URL"
# Shorter than this, a credential is refused at start (InvalidSetting), not masked (domain/credential_masks.py): a
# 7-byte secret's base64 at the worst of its three alignments is one 4-character group, which any id or token can
# contain, so every answer would turn to noise; masking only its whole text instead would journal its encodings in
# the clear. At 8, every encoded piece is at least 8 characters (48 bits), and no provider issues a key that short.
MIN_CREDENTIAL_CHARS = 8


@dataclass(frozen=True, slots=True)
class ProviderSettings:
    """One named provider: where it answers and what proves us to it. The credential is read once, at start, from
    a file; it is never in a catalog, a journal, a log line or a repr."""

    name: str
    base_url: str = ""
    credential: str | None = field(default=None, repr=False)


def url_variable(provider: str) -> str:
    """The variable holding `provider`'s base URL."""
    if provider == DEFAULT_PROVIDER:
        return DEFAULT_URL_VARIABLE
    return f"{PROVIDER_PREFIX}{provider.upper()}{URL_SUFFIX}"


def credential_variable(provider: str) -> str:
    """The variable naming the file that holds `provider`'s credential (a bearer token, an API key)."""
    return f"{PROVIDER_PREFIX}{provider.upper()}{CREDENTIAL_FILE_SUFFIX}"


def unmaskable(credential: str) -> str | None:
    """Why `credential` cannot be masked in what its provider answers (what the setting must hold instead), or
    None if it can."""
    if len(credential) < MIN_CREDENTIAL_CHARS:
        return (
            f"a credential of at least {MIN_CREDENTIAL_CHARS} characters (this one has {len(credential)}): "
            "shorter, its encoded forms match ordinary text and could not be masked in what the provider answers"
        )
    return None
