"""What a provider is asked and what it answers, as every operation reads it and as an adopter's Python client
(a `PythonOperation`'s) writes it: the whole contract is docs/providers.md. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from crashsafe.contracts.audit import ProviderEffect
from crashsafe.contracts.client_answers import ClientAnswer
from crashsafe.contracts.errors import ProviderAnswerInvalid
from crashsafe.contracts.tool_messages import CallAnswer, LookupAnswer

_KINDS = frozenset(ClientAnswer)


@dataclass(frozen=True, slots=True)
class ProviderAnswer:
    """What one provider call or lookup told us. `unknown`: no answer we can trust (timeout, 5xx, garbage).

    `kind` is one of the five (`crashsafe.sdk.Answer`); any other is a `ProviderAnswerInvalid` where it is built."""

    kind: CallAnswer | LookupAnswer | ClientAnswer
    body: dict[str, Any]
    ref: str | None = None
    detail: str = ""
    # The provider's Retry-After: how long to wait before asking it again (a 429, a key in use).
    retry_after_s: float | None = None
    # The provider said this answer replays an earlier request with the key (`Idempotent-Replayed: true`).
    replayed: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or self.kind not in _KINDS:
            raise ProviderAnswerInvalid(kind=str(self.kind), allowed=[k.value for k in ClientAnswer])


@dataclass(frozen=True, slots=True)
class ProviderCall:
    """One question to a provider client about one action, the same for `call` and `lookup`."""

    # The action's idempotency key: pass it to the provider as its own (`Idempotency-Key`, `idempotency_key=`).
    key: str
    # The prepared arguments, the client's own copy, without the account (below): what the provider's body needs.
    args: dict[str, Any]
    # The account at the provider the effect is made and asked about in (the run's tenant, from `in_account`):
    # send it as the provider's account (Stripe's `Stripe-Account` header, an SDK's `account=`), never in the body.
    # Asked in another account a key reads as never made. "": the provider's default account (a run of no tenant).
    account: str = ""
    # A `time.monotonic()` instant (the event loop's clock: `asyncio.timeout_at(call.deadline)`) by which to
    # answer; the executor stops waiting a grace after it, and the answer is then unknown.
    deadline: float = 0.0


class ProviderClient(Protocol):
    """A provider as an adopter writes it in Python (its SDK: Stripe's, a reservations API's). `call` makes the
    effect at most once per `call.key` and answers OK, REJECTED (a definitive no: nothing was made) or UNKNOWN;
    `lookup` answers FOUND, ABSENT (only when the provider says it never saw the key), REJECTED (it holds the key's
    record as refused) or UNKNOWN. Any exception, a timeout or an answer of another type is read as UNKNOWN: the
    effect may exist, so it is asked about by key, never called blind.

    A client whose provider lists what it holds also has `async def effects(self) -> list[ProviderEffect]` and
    its operation says `lists=True`: the audit then finds effects no run journaled."""

    async def call(self, call: ProviderCall) -> ProviderAnswer:
        """Make the effect of `call.key`, in `call.account`, by `call.deadline`."""
        ...

    async def lookup(self, call: ProviderCall) -> ProviderAnswer:
        """What became of `call.key` in `call.account` (`call.args`: the call's, naming the record it wrote)."""
        ...


class ListingClient(ProviderClient, Protocol):
    """A provider client that can also list every effect its provider holds (`PythonOperation(lists=True)`)."""

    async def effects(self) -> list[ProviderEffect]:
        """Every effect the provider holds, in every account its credential sees: kind, key, ref."""
        ...


class LegacyProviderClient(Protocol):
    """Deprecated, read until 0.4: the 0.2 client, which found the account in its arguments (`ACCOUNT_ARG`) and
    had to take it out of the body itself. A client of this shape is warned about when it is opened."""

    async def call(self, args: dict[str, Any], key: str, deadline: float) -> ProviderAnswer: ...

    async def lookup(self, key: str, args: dict[str, Any]) -> ProviderAnswer: ...
