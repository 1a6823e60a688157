"""How an id of any spelling becomes one subject or key token, the same way in every name that holds it."""

from __future__ import annotations

import hashlib
import re

# A subject token that is a literal: no wildcard, separator, space or control character.
_LITERAL = re.compile(r"^[A-Za-z0-9_\-]+$")


def literal(token: str) -> str:
    if not _LITERAL.match(token):
        raise ValueError(f"{token!r} is not a literal subject token")
    return token


def digest(value: str) -> str:
    """An id of any spelling as one key token (a guest id may hold `@`, `:` and `.`)."""
    return hashlib.sha256(value.encode()).hexdigest()[:32]


def worker_token(worker_id: str) -> str:
    """A worker id as one subject token (a hostname's dots and anything else become `_`)."""
    return re.sub(r"[^A-Za-z0-9_\-]", "_", worker_id) or "_"
