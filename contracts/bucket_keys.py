"""The key-value buckets of one namespace and the keys in them: leases, facts, clients, caps, sessions, beats."""

from __future__ import annotations

from crashsafe.contracts.tokens import digest as _digest
from crashsafe.contracts.tokens import literal as _literal
from crashsafe.contracts.tokens import worker_token


class BucketKeys:
    """The buckets' half of `Namespace` (`contracts.subjects`), which holds `name`."""

    __slots__ = ()
    name: str

    # Partition ownership: one key-value bucket per namespace (a JetStream stream `KV_<bucket>`).
    @property
    def leases_bucket(self) -> str:
        return f"{self.name}_leases"

    def lease_key(self, family: str, partition: int) -> str:
        """Who holds a partition now: renewed with a TTL; its KV revision is the fencing token."""
        return f"lease.{_literal(family)}.{partition}"

    def leases_of(self, family: str) -> str:
        return f"lease.{_literal(family)}.*"

    def holder_key(self, family: str, partition: int) -> str:
        """Which action store last held a partition (no TTL): a new owner with another store must look up first."""
        return f"holder.{_literal(family)}.{partition}"

    def member_key(self, family: str, worker_id: str) -> str:
        """One live replica of a family, renewed with a TTL; the live members split the partitions."""
        return f"member.{_literal(family)}.{worker_token(worker_id)}"

    def members_of(self, family: str) -> str:
        return f"member.{_literal(family)}.*"

    # What a business key's first ask, attempts and undoing were, beside the partition stores (issue 17): a store
    # that never saw a key (a new volume after a takeover) learns them here instead of calling the provider.
    @property
    def key_facts_bucket(self) -> str:
        return f"{self.name}_key_facts"

    def key_facts_key(self, family: str, key: str) -> str:
        """One action key's shared facts, `fact.<family>.<digest(key)>` (keys hold `:`, which KV keys may not)."""
        return f"fact.{_literal(family)}.{_digest(key)}"

    def partition_epoch_key(self, family: str, partition: int) -> str:
        """A partition's epoch, counted up at each acquisition beside the facts it orders, `fact.<family>.epoch-<n>`
        (a key's digest is 32 hex digits: the two never meet). Not a key's facts: whatever reads `fact.<family>.*`
        as facts (an expiry sweep) must leave it out."""
        return f"fact.{_literal(family)}.epoch-{partition}"

    # API client keys: one record per key, written by the operator, read by every gateway on every request.
    @property
    def clients_bucket(self) -> str:
        return f"{self.name}_clients"

    def client_key(self, key_id: str) -> str:
        return f"client.{_literal(key_id)}"

    @property
    def clients_all(self) -> str:
        return "client.*"

    # Active runs per guest and per session (the caps): the gateway adds a run, the runtime removes it.
    @property
    def active_bucket(self) -> str:
        return f"{self.name}_active"

    def guest_active_key(self, tenant: str, guest_id: str) -> str:
        return f"guest.{_literal(tenant)}.{_digest(guest_id)}"

    def stalled_run_key(self, run_id: str) -> str:
        """The stall mark of a run whose agent's code held a runtime's event loop until its watchdog ended it: no
        process drives that run's agent again (contracts/active.py, `StallMark`)."""
        return f"stalled.{_literal(run_id)}"

    # Guest profiles (verified address, remembered preferences): the operator sets the address, the memory
    # executor writes preferences, the runtime reads a profile when a run starts.
    @property
    def guests_bucket(self) -> str:
        return f"{self.name}_guests"

    def guest_key(self, tenant: str, guest_id: str) -> str:
        return f"guest.{_literal(tenant)}.{_digest(guest_id)}"

    # Approvals of held-back actions: one record per approval, decided once by compare-and-set.
    @property
    def approvals_bucket(self) -> str:
        return f"{self.name}_approvals"

    def approval_key(self, approval_id: str) -> str:
        return f"approval.{_literal(approval_id)}"

    @property
    def approvals_all(self) -> str:
        return "approval.*"

    # Session lanes: which run owns a guest session now (fenced by the record's revision), and its history.
    @property
    def sessions_bucket(self) -> str:
        return f"{self.name}_sessions"

    def session_key(self, tenant: str, session_id: str) -> str:
        return f"session.{_literal(tenant)}.{_digest(session_id)}"

    def turn_key(self, tenant: str, run_id: str) -> str:
        """Which run a guest message (`run_id`: the run it would have started) was last handed to as its turn."""
        return f"turn.{_literal(tenant)}.{_literal(run_id)}"

    # Version heartbeats (issue 30): each live service process keeps one key, renewed with a TTL, saying which
    # release it runs; `crashsafe upgrade check|status` and `infra contract` read them.
    @property
    def versions_bucket(self) -> str:
        return f"{self.name}_versions"

    def version_beat_key(self, service: str, worker_id: str) -> str:
        """One process's heartbeat, `beat.<service>.<worker>`: `service` is its NATS user (`executor-payment`)."""
        return f"beat.{_literal(service)}.{worker_token(worker_id)}"

    @property
    def version_beats_all(self) -> str:
        """Every live process's heartbeat: what the operator's commands scan."""
        return "beat.*.*"

    # The configuration catalog: one key, its history the published revisions; only the operator writes it.
    @property
    def catalog_bucket(self) -> str:
        return f"{self.name}_catalog"

    @property
    def catalog_key(self) -> str:
        return "catalog"
