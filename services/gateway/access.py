"""Who is calling and what they may do: parse a bearer key, check it against its stored record, check a scope."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from contracts.clients import ApiKeyRecord, Scope, secret_hash, split_key
from contracts.errors import Forbidden, Unauthenticated

BEARER = "bearer "


@dataclass(frozen=True, slots=True)
class Client:
    """An authenticated caller: its key's id (never its secret), tenant and scopes."""

    key_id: str
    tenant: str
    scopes: frozenset[str]

    @property
    def admin(self) -> bool:
        return Scope.ADMIN.value in self.scopes

    def may(self, scope: Scope) -> bool:
        return self.admin or scope.value in self.scopes

    def sees(self, tenant: str) -> bool:
        """A run of `tenant` exists for this client (else it is a 404, like a run that does not exist)."""
        return self.admin or tenant == self.tenant


def parse_bearer(header: str | None) -> tuple[str, str]:
    """`Bearer csk_<key_id>_<secret>` -> (key_id, secret); Unauthenticated (missing or malformed) otherwise."""
    if header is None or not header.strip():
        raise Unauthenticated("missing")
    if header[: len(BEARER)].lower() != BEARER:
        raise Unauthenticated("malformed")
    parts = split_key(header[len(BEARER) :])
    if parts is None:
        raise Unauthenticated("malformed")
    return parts


def authenticate(key_id: str, secret: str, record: ApiKeyRecord | None) -> Client:
    """The client a key proves, or Unauthenticated. The hash is compared in constant time; an unknown id and a
    wrong secret give the same answer, and only a holder of the right secret learns that it was revoked."""
    if record is None or record.key_id != key_id:
        # Spend the same work as a known key, so timing does not tell unknown ids from wrong secrets.
        hmac.compare_digest(secret_hash(secret), "0" * 64)
        raise Unauthenticated("invalid")
    if not hmac.compare_digest(secret_hash(secret), record.secret_sha256):
        raise Unauthenticated("invalid")
    if record.revoked_at is not None:  # whatever its time says: the operator's clock is not the gateway's
        raise Unauthenticated("revoked")
    return Client(key_id=record.key_id, tenant=record.tenant, scopes=frozenset(record.scopes))


def require(client: Client, scope: Scope) -> None:
    if not client.may(scope):
        raise Forbidden(scope=scope.value, key_id=client.key_id)
