"""API clients of the gateway: the scopes a key carries, how a key is written and how it is stored (hashed)."""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from enum import StrEnum

import msgspec


class Scope(StrEnum):
    """What a client key may do; `admin` may do everything, for every tenant."""

    EVENTS_WRITE = "events:write"  # POST /v1/events
    RUNS_READ = "runs:read"  # GET /v1/runs/{id}, /v1/runs/{id}/events
    RUNS_OPERATE = "runs:operate"  # POST /v1/runs/{id}/reconcile
    # POST /v1/approvals/{id}: a manager's decision. Never on a key that may also start runs (`events:write`):
    # the key that asked for the action must not be the one that approves it (docs/security.md).
    APPROVALS_DECIDE = "approvals:decide"
    ADMIN = "admin"


# The scopes no one key may hold together: starting runs and approving what they hold back.
EXCLUSIVE_SCOPES = frozenset({Scope.EVENTS_WRITE.value, Scope.APPROVALS_DECIDE.value})
# `ApiKeyRecord.agents` naming every agent of the deployment.
EVERY_AGENT = "*"


# A key is `csk_<key_id>_<secret>`: the id names the stored record, the secret is what proves the holder.
KEY_PREFIX = "csk"
KEY_ID = re.compile(r"^[0-9a-f]{16}$")
SECRET = re.compile(r"^[A-Za-z0-9_\-]{43,128}$")  # urlsafe base64 of >= 32 random bytes
# A tenant is one subject and key-value token (it names `{ns}_active` keys), never a wildcard or separator.
TENANT = re.compile(r"^[a-z0-9][a-z0-9_\-]{0,62}$")
SECRET_BYTES = 32


def is_tenant(value: str) -> bool:
    return bool(TENANT.match(value))


def format_key(key_id: str, secret: str) -> str:
    """The key as the client sends it in `Authorization: Bearer <key>`; printed once, never stored."""
    return f"{KEY_PREFIX}_{key_id}_{secret}"


def split_key(key: str) -> tuple[str, str] | None:
    """`csk_<key_id>_<secret>` -> (key_id, secret), or None for anything else."""
    prefix, _, rest = key.strip().partition("_")
    key_id, _, secret = rest.partition("_")
    if prefix != KEY_PREFIX or not KEY_ID.match(key_id) or not SECRET.match(secret):
        return None
    return key_id, secret


def secret_hash(secret: str) -> str:
    """What is stored of a secret: SHA-256 hex. The secret is 256 random bits, so no dictionary can reverse it
    and a slow hash would only cost every request time (docs/decisions.md)."""
    return hashlib.sha256(secret.encode()).hexdigest()


class ApiKeyRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One client key as the `{ns}_clients` bucket holds it under `client.<key_id>`: never the secret itself.

    `scopes` is `str` on the wire (open): a newer writer may grant a scope an older gateway does not know, which
    that gateway then simply never matches."""

    key_id: str
    tenant: str
    scopes: list[str]
    secret_sha256: str
    name: str = ""
    created_at: datetime
    revoked_at: datetime | None = None
    # The agents this key may start with `POST /v1/events?agent=` (`*`: every one). None, a key minted before
    # keys named their agents: the deployment's default agent only, what a request without `?agent=` starts.
    agents: list[str] | None = None


api_key_encoder = msgspec.json.Encoder()
api_key_decoder = msgspec.json.Decoder(ApiKeyRecord)
