"""Every NATS message of a phase, seen by one core subscription to `>`, counted by what it is: the per-step budget's
message half, measured (`bench/run.py --wiretap`). Ids in subjects are folded away, so a class counts every run's
messages of one kind: a journal append, a request, an ack, a KV read, a PubAck."""

from __future__ import annotations

import re
from collections import Counter

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from crashsafe.contracts.jetstream_api import ACK, API
from crashsafe.contracts.nats_permissions import NatsUser, Permissions, Role
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.nats_users import NatsAuth, creds_path
from crashsafe.services.platform.settings import NatsAccess
from crashsafe.stack import Stack

WIRETAP_USER = "bench-wiretap"


class TappedStack(Stack):
    """A bench stack whose nats-server admits one more user, which may only listen, to everything (`>`)."""

    def _nats_auth(self) -> NatsAuth:
        auth = super()._nats_auth()
        listener = Permissions(publish=(), subscribe=(">",))
        auth.users.append(NatsUser(name=WIRETAP_USER, role=Role.ANALYTICS, family=None, permissions=listener))
        return auth

    def wiretap_access(self) -> NatsAccess:
        assert self.nats_creds_dir is not None
        return NatsAccess(creds=creds_path(self.nats_creds_dir, WIRETAP_USER))


# Tokens that name one run, key, inbox or consumer instance; folded to `*` so a subject names a kind of message.
_ID = re.compile(r"^(run_|ev|bench-|[0-9a-f]{8,}|[A-Za-z0-9]{22,}$|\d+$)")


def kind_of(subject: str, reply: str) -> str:
    """A message's kind: its subject with ids folded away, and whether it is a JetStream delivery or a reply."""
    if subject.startswith("_INBOX.") or subject.startswith("_R_."):
        return "reply (PubAck, KV/direct get answer, pull delivery)"
    if subject.startswith(f"{ACK}."):
        parts = subject.split(".")
        return f"ack {parts[2]}/{parts[3]}"
    tokens = subject.split(".")
    if subject.startswith(f"{API}."):
        head = ".".join(tokens[:4])
        rest = [t if not _ID.match(t) else "*" for t in tokens[4:]]
        return ".".join([head, *rest[:2]])
    if subject.startswith("$KV."):
        return ".".join(tokens[:3]) + ".*"
    folded = [t if i < 2 or not _ID.match(t) else "*" for i, t in enumerate(tokens)]
    delivered = " (JetStream delivery)" if reply.startswith(f"{ACK}.") else ""
    return ".".join(folded) + delivered


class Wiretap:
    """Counts every message on the server while it listens (the bench's own traffic included, named as such)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.kinds: Counter[str] = Counter()
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._sub = await self.broker.nc.subscribe(">", cb=self._on_msg, pending_msgs_limit=1_000_000)

    async def _on_msg(self, msg: Msg) -> None:
        self.kinds[kind_of(msg.subject, msg.reply or "")] += 1

    async def stop(self) -> Counter[str]:
        if self._sub is not None:
            await self._sub.unsubscribe()
        return self.kinds

    def table(self, runs: int) -> str:
        lines = [f"NATS messages per run ({runs} runs), by kind, seen by a subscription to '>':"]
        for kind, n in sorted(self.kinds.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {n / max(runs, 1):>7.2f}  {kind}")
        lines.append(f"  {sum(self.kinds.values()) / max(runs, 1):>7.2f}  in all")
        return "\n".join(lines)
