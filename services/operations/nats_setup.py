"""What a deployment's NATS must hold, declared by the operator (the only role that may): the namespace's streams
and buckets (`crashsafe infra apply`, additive only; its contracting steps are `infra contract`'s,
services/operations/contracting.py), and the users and credentials of a real cluster (`infra nats-auth`)."""

from __future__ import annotations

from pathlib import Path

from crashsafe.contracts.streams import KvSpec, StreamSpec
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain.registry import Registry
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.nats_users import NatsAuth, write_private
from crashsafe.services.platform.provisioning import provision


async def declare_streams(
    broker: Broker, ns: Namespace, replicas: int
) -> tuple[list[StreamSpec], list[KvSpec]]:
    """Create every stream and bucket of the namespace, or add what this release needs to it (idempotent): never
    a delete, a purge or a subject taken away, so a release still running beside this one is never disturbed;
    what was declared."""
    return await provision(broker, ns, replicas)


def write_nats_auth(out: Path, ns: Namespace, registry: Registry, partitions: int) -> NatsAuth:
    """`auth.conf` (to include in nats-server's config) and one credential file per role under `creds/` (0600)."""
    auth = NatsAuth.for_deployment(out / "creds", ns, registry.families, partitions)
    write_private(out / "auth.conf", auth.config() + "\n")
    return auth
