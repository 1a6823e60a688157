"""What archiving the journals needs of NATS (issue 31, months of runs), granted to the reconciler that archives:
read the version heartbeats and the contract record, and purge run subjects of RUNS. Apart from the role table
(contracts/nats_permissions.py) because it is the one destructive grant a service role holds, and it says so here.

A purge's filter travels in the request's body, which a subject permission cannot read: the grant is "purge
RUNS", whatever the filter. The reconciler purges only a run it archived and read back (`<ns>.run.<run_id>.>`);
every other stream's purge stays denied by name, and the rest of `DESTRUCTIVE` as for every service."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from crashsafe.contracts.jetstream_api import API, direct_get, stream_info
from crashsafe.contracts.subjects import StreamKind

if TYPE_CHECKING:
    from crashsafe.contracts.nats_permissions import NatsUser

PURGE_ANY = f"{API}.STREAM.PURGE.>"


class Streams(Protocol):
    """The stream names of the scope the table is made for (`nats_permissions.Scope`)."""

    def stream(self, kind: StreamKind) -> str: ...

    def kv_stream(self, name: str) -> str: ...


def purge(stream: str) -> str:
    return f"{API}.STREAM.PURGE.{stream}"


def archiver(user: NatsUser, s: Streams, versions_bucket: str) -> NatsUser:
    """`user` allowed to purge RUNS (one run's subjects at a time) and to read `<ns>_versions` (who is alive, what
    was contracted); every other stream's purge denied by name, the rest of DESTRUCTIVE as before."""
    runs, versions = s.stream(StreamKind.RUNS), s.kv_stream(versions_bucket)
    others = [s.stream(k) for k in StreamKind if s.stream(k) != runs]
    permissions = user.permissions
    return replace(
        user,
        permissions=replace(
            permissions,
            publish=(*permissions.publish, purge(runs), stream_info(versions), *direct_get(versions)),
            publish_deny=(
                *(d for d in permissions.publish_deny if d != PURGE_ANY),
                *(purge(x) for x in others),
            ),
        ),
    )
