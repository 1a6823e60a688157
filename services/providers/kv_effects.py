"""Carries out a tool whose effect is a compare-and-set write of a JetStream KV record (a guest's profile)."""

from __future__ import annotations

import msgspec

from crashsafe.contracts.errors import CrashsafeError, LeaseConflict
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.tool_messages import ActionRequest, Answer
from crashsafe.domain.registry import KvOperation, ProviderAnswer
from crashsafe.services.platform.jetstream import Broker

# Clashes with other writers of the same record before the answer is "unknown" (the executor then looks up by
# key, and calls again only once the record says the key never took effect).
MAX_CLASHES = 8
UNREADABLE = "record_unreadable"


class KvEffects:
    """The executor's key-value "provider": reads the record, applies the tool's pure rewrite, writes it back only
    if nobody wrote in between (its revision), and answers "what became of key K?" from the record itself."""

    def __init__(self, broker: Broker, ns: Namespace) -> None:
        self.broker = broker
        self.ns = ns

    async def call(self, operation: KvOperation, request: ActionRequest) -> ProviderAnswer:
        spec = operation.bucket(self.ns)
        key = operation.record_key(self.ns, request.args)
        try:
            for _ in range(MAX_CLASHES):
                entry = await self.broker.kv_get(spec, key)
                try:
                    record, result = operation.apply(
                        entry.value if entry else None, request.args, request.key
                    )
                except msgspec.DecodeError as exc:
                    # A record nobody can read (written by hand, past the CLI): refused, nothing was written.
                    return ProviderAnswer(
                        Answer.REJECTED,
                        {"code": UNREADABLE, "message": f"record {key} is unreadable ({exc}); fix it first"},
                        detail=UNREADABLE,
                    )
                if record is None:  # nothing to change (already applied, or the same value): no write
                    return ProviderAnswer(Answer.OK, result, ref=request.key)
                try:
                    await self.broker.kv_write(spec, key, record, revision=entry.revision if entry else 0)
                except LeaseConflict:
                    continue  # another writer came first: apply again to the record as it is now
                return ProviderAnswer(Answer.OK, result, ref=request.key)
        except CrashsafeError as exc:  # the broker did not answer: the write may or may not have landed
            return ProviderAnswer(Answer.UNKNOWN, {}, detail=f"{exc.code}: {exc.message}")
        return ProviderAnswer(Answer.UNKNOWN, {}, detail=f"{MAX_CLASHES} write clashes on {key}")

    async def lookup(
        self, operation: KvOperation, request_key: str, args: dict[str, object]
    ) -> ProviderAnswer:
        spec = operation.bucket(self.ns)
        try:
            entry = await self.broker.kv_get(spec, operation.record_key(self.ns, dict(args)))
        except CrashsafeError as exc:
            return ProviderAnswer(Answer.UNKNOWN, {}, detail=f"lookup failed: {exc.code}: {exc.message}")
        try:
            result = operation.applied(entry.value if entry else None, dict(args), request_key)
        except msgspec.DecodeError as exc:
            return ProviderAnswer(Answer.UNKNOWN, {}, detail=f"{UNREADABLE}: {exc}")
        if result is None:
            return ProviderAnswer(Answer.ABSENT, {}, detail="the record holds no write with this key")
        return ProviderAnswer(Answer.FOUND, result, ref=request_key)
