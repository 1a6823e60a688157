"""Declares a namespace's streams and buckets: the operator's job (`crashsafe infra apply`, `crashsafe up`).

Additive only (issue 30): a stream keeps every subject it already takes (`Broker.ensure_stream`), since a release
still running beside this one may write there; narrowing a stream to this release's subjects is a contracting step
(`crashsafe infra contract`, services/operations/contracting.py), run once no older release is left.

Services never create or change streams (their NATS users may not); each checks at start that what it uses
exists (`required_streams`) and stops with `StreamMissing`, telling the operator to run `crashsafe infra apply`.
"""

from __future__ import annotations

from crashsafe.contracts.streams import (
    KvSpec,
    StreamSpec,
    active_spec,
    approvals_spec,
    catalog_spec,
    clients_spec,
    dead_marks_spec,
    guests_spec,
    key_facts_spec,
    leases_spec,
    projections_spec,
    sessions_spec,
    stream_specs,
    versions_spec,
)
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.services.platform.jetstream import Broker


def buckets(ns: Namespace, replicas: int = 1) -> list[KvSpec]:
    """Executor partition leases and key facts, the gateway's API client keys (hashed), active runs per guest and session, the
    configuration catalog, guest profiles, approval records, session lanes and projection receipts."""
    return [
        leases_spec(ns, replicas),
        key_facts_spec(ns, replicas),  # business keys' facts that outlive a partition's store (issue 17)
        clients_spec(ns, replicas),
        active_spec(ns, replicas),
        catalog_spec(ns, replicas),
        guests_spec(ns, replicas),
        approvals_spec(ns, replicas),
        sessions_spec(ns, replicas),
        projections_spec(ns, replicas),  # projection receipts (issue 10)
        dead_marks_spec(ns, replicas),  # dead letters an operator replayed or discarded (issue 11)
        versions_spec(ns, replicas),  # which release each live service process runs (issue 30)
    ]


async def provision(
    broker: Broker, ns: Namespace, replicas: int = 1
) -> tuple[list[StreamSpec], list[KvSpec]]:
    """Create every stream and bucket of `ns`, or add to it what this release needs (idempotent; never a subject
    taken away); needs the operator's user."""
    streams = stream_specs(ns, replicas)
    for spec in streams:
        await broker.ensure_stream(spec)
    kvs = buckets(ns, replicas)
    for kv in kvs:
        await broker.ensure_kv(kv)
    return streams, kvs


async def require(broker: Broker, streams: list[str]) -> None:
    """Stop with StreamMissing (naming `crashsafe infra apply`) unless every one of `streams` exists."""
    for name in streams:
        await broker.require_stream(name)


def executor_streams(ns: Namespace) -> list[str]:
    kinds = (StreamKind.ACTIONS, StreamKind.OUTCOMES, StreamKind.DEAD_LETTERS)
    return [ns.stream(k) for k in kinds] + [leases_spec(ns).stream, key_facts_spec(ns).stream]


def all_streams(ns: Namespace) -> list[str]:
    return [ns.stream(k) for k in StreamKind]
