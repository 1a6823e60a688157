"""`crashsafe infra apply|contract|nats-auth`: what a deployment's NATS must hold, declared (additively), what an
older release alone used, taken away once none is alive, and what was done, printed."""

from __future__ import annotations

from pathlib import Path

from crashsafe.contracts.subjects import Namespace
from crashsafe.deployment import settings_for
from crashsafe.domain import registry as registries
from crashsafe.services.operations.connection import operator_broker
from crashsafe.services.operations.contracting import contract
from crashsafe.services.operations.nats_setup import declare_streams, write_nats_auth
from crashsafe.services.platform.nats_users import creds_path
from crashsafe.services.platform.settings import Settings


async def infra_apply(state_dir: Path | None = None) -> int:
    """Provision the namespace's streams and buckets, as the operator (the only role that may)."""
    settings = settings_for(state_dir) if state_dir is not None else Settings.from_env()
    async with operator_broker(settings, "crashsafe-infra") as broker:
        streams, buckets = await declare_streams(broker, settings.namespace, settings.stream_replicas)
    for spec in streams:
        print(f"stream {spec.name}: {', '.join(spec.subjects)}")
    for kv in buckets:
        print(f"key-value bucket {kv.bucket}")
    return 0


async def infra_contract(state_dir: Path | None = None) -> int:
    """Run the contracting steps, as the operator: refused (UpgradeBlocked, exit 1, each older process named)
    while a process of an older release is alive; says so when there is nothing to contract."""
    settings = settings_for(state_dir) if state_dir is not None else Settings.from_env()
    async with operator_broker(settings, "crashsafe-infra") as broker:
        done = await contract(broker, settings.namespace, settings.stream_replicas)
    if done is None:
        print(
            "nothing to contract: every stream takes only this release's subjects, no journal is on an old layout"
        )
        return 0
    journals = done.journals
    print(f"journals copied onto event classes: {journals.runs} run(s), {journals.events} event(s)")
    for stream, subjects in done.narrowed.items():
        print(f"stream {stream}: no longer takes {', '.join(subjects)}")
    return 0


def infra_nats_auth(out: Path, namespace: str, registry: str, partitions: int) -> int:
    """Users, permissions and credentials for a real cluster: `auth.conf` to include in nats-server's config,
    and one credential file per role under `creds/` (0600) to mount as a Kubernetes secret."""
    auth = write_nats_auth(out, Namespace(namespace), registries.load(registry), partitions)
    for user in auth.users:
        print(f"{user.name}: {creds_path(auth.directory, user.name)}")
    print(f"server config fragment: {out / 'auth.conf'} (include it in nats-server.conf)")
    return 0
