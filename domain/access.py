"""Who is calling and what they may do: parse a bearer key, check it against its stored record, check a scope."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from crashsafe.contracts.clients import EVERY_AGENT, ApiKeyRecord, Scope, secret_hash, split_key
from crashsafe.contracts.errors import (
    AgentNotAllowed,
    ApproverStartedRun,
    ApproverStartsRuns,
    Forbidden,
    Unauthenticated,
)

BEARER = "bearer "


@dataclass(frozen=True, slots=True)
class Client:
    """An authenticated caller: its key's id (never its secret), tenant and scopes."""

    key_id: str
    tenant: str
    scopes: frozenset[str]
    # The agents the key may start (`*`: every one); None: a key minted before keys named them.
    agents: frozenset[str] | None = None

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
    agents = frozenset(record.agents) if record.agents is not None else None
    return Client(key_id=record.key_id, tenant=record.tenant, scopes=frozenset(record.scopes), agents=agents)


def require(client: Client, scope: Scope) -> None:
    if not client.may(scope):
        raise Forbidden(scope=scope.value, key_id=client.key_id)


def allowed_agents(client: Client, default_agent: str) -> frozenset[str]:
    """The agents a client may start: what its key names; a key that names none (minted before keys did), only
    the default agent, which is what it started before `?agent=` existed."""
    if client.agents is None:
        return frozenset({default_agent})
    return client.agents


def require_agent(client: Client, agent: str, default_agent: str) -> None:
    """A key starts only the agents it names (an admin key: any). Another tenant's guest ids are never reachable
    from an agent, but a key for a customer-facing app must not become a refund desk (`?agent=support`)."""
    if client.admin:
        return
    allowed = allowed_agents(client, default_agent)
    if EVERY_AGENT not in allowed and agent not in allowed:
        raise AgentNotAllowed(
            agent=agent, allowed=", ".join(sorted(allowed)), tenant=client.tenant, key_id=client.key_id
        )


def may_approve(client: Client) -> bool:
    """A manager's key: `approvals:decide` (or admin), and not a key that may also start runs."""
    starts_runs = not client.admin and Scope.EVENTS_WRITE.value in client.scopes
    return client.may(Scope.APPROVALS_DECIDE) and not starts_runs


def require_approver(client: Client) -> None:
    """A manager's decision: never by a key that may start runs, so the key whose run holds an action (the
    `events:write` key of the run's tenant) never approves it."""
    require(client, Scope.APPROVALS_DECIDE)
    if not may_approve(client):
        raise ApproverStartsRuns(key_id=client.key_id)


def require_not_starter(decider: str, started_by: str, run_id: str) -> None:
    """The key whose message started a run never decides its approvals, whatever its scopes (an admin's too: the
    stack's admin key both starts runs and holds approvals:decide). `started_by` "" (a run journaled by a release
    that recorded no starting key): not known, so the scope rule alone decides, as it did."""
    if started_by and decider == started_by:
        raise ApproverStartedRun(key_id=decider, run_id=run_id)
