"""Carries out a tool whose effect is an adopter's Python code (a PythonOperation): whatever it raises or answers,
the executor gets one of the typed answers it understands, and anything it cannot trust is unknown."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from crashsafe.contracts.audit import ProviderEffect
from crashsafe.contracts.keys import ACCOUNT_ARG
from crashsafe.contracts.tool_messages import Answer
from crashsafe.domain.credential_masks import CredentialMask
from crashsafe.domain.registry import ListingClient, ProviderAnswer, ProviderCall
from crashsafe.services.platform.hook_limit import HookLimit, HookOverran
from crashsafe.services.providers.http_answers import provider_error

# What each question may be answered with (contracts.tool_messages.CallAnswer, LookupAnswer).
CALL_ANSWERS = frozenset({Answer.OK, Answer.REJECTED, Answer.UNKNOWN})
LOOKUP_ANSWERS = frozenset({Answer.FOUND, Answer.ABSENT, Answer.REJECTED, Answer.UNKNOWN})
_MAX_RETRY_AFTER_S = 60.0


async def asked(
    what: str,
    question: Callable[[], Awaitable[object]],
    allowed: frozenset[Answer],
    give_up_after: float,
    limit: HookLimit | None = None,
) -> ProviderAnswer:
    """The adopter's answer to one question, checked. An exception is unknown, never a refusal: a call that raised
    may have made its effect before it did (then it is asked about by key, never called blind); so is an answer
    past `give_up_after` seconds, one whose code held the event loop past `limit` between two awaits (a
    synchronous SDK call that hangs: stopped where it stands), and one of another type or kind. Only the process's
    own cancellation passes."""
    bound = asyncio.timeout(give_up_after)
    try:
        async with bound:
            answer = await (limit.sliced(question()) if limit is not None else question())
    except HookOverran as overran:
        return _unknown(f"{what} held the event loop: {overran}")
    except TimeoutError as exc:
        if bound.expired():
            return _unknown(f"{what}: no answer within {give_up_after:.1f}s")
        return _unknown(f"{what} raised {type(exc).__name__}: {exc}")
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the executor is stopping: not the adopter's answer
        return _unknown(f"{what} raised CancelledError")
    except Exception as exc:  # noqa: BLE001 -- any exception of the adopter's code is an unknown outcome
        return _unknown(f"{what} raised {type(exc).__name__}: {exc}")
    return checked(what, answer, allowed)


def checked(what: str, answer: object, allowed: frozenset[Answer]) -> ProviderAnswer:
    """`answer` as the executor may use it: a ProviderAnswer of an allowed kind, a JSON object body and a text
    ref; anything else is unknown, with a detail naming the operation and what was wrong."""
    if not isinstance(answer, ProviderAnswer):
        return _unknown(f"{what} answered a {type(answer).__name__}, not a ProviderAnswer")
    kinds = ", ".join(sorted(allowed))
    if not isinstance(answer.kind, str) or answer.kind not in allowed:
        return _unknown(f"{what} answered {answer.kind!r}, not one of {kinds}")
    if not isinstance(answer.body, dict) or not (answer.ref is None or isinstance(answer.ref, str)):
        return _unknown(f"{what} answered a body that is not a dict or a ref that is not a str")
    try:  # the body becomes the receipt's result: JSON, with nothing of the adopter's objects left in it
        body = msgspec.json.decode(msgspec.json.encode(answer.body))
    except (TypeError, msgspec.EncodeError, msgspec.DecodeError) as exc:
        return _unknown(f"{what} answered a body that is not JSON: {exc}")
    if answer.kind == Answer.REJECTED and (error := provider_error(body)) is not None:
        # Read as an HTTP provider's refusal is: the receipt's code is the provider's own (`card_declined`), which
        # the model and the agent's compensations read, never a bare `provider_rejected`.
        body = error
    retry_after = answer.retry_after_s
    if not isinstance(retry_after, int | float) or isinstance(retry_after, bool):
        retry_after = None
    return ProviderAnswer(
        Answer(answer.kind),  # type: ignore[arg-type]
        body,
        ref=answer.ref,
        detail=str(answer.detail),
        retry_after_s=min(max(float(retry_after), 0.0), _MAX_RETRY_AFTER_S)
        if retry_after is not None
        else None,
        replayed=answer.replayed is True,
    )


_DETAIL_CHARS = 500


def without(mask: CredentialMask | None, answer: ProviderAnswer) -> ProviderAnswer:
    """The answer as it may be journaled and shown to operators: its provider's credential masked wherever an
    SDK put it (an exception's text, an echoed request in the body, the ref; encoded or not), then its detail cut
    to 500 characters (cut first, a credential across the cut would leave its start behind)."""
    masked = mask.answer(answer) if mask is not None else answer
    return dataclasses.replace(masked, detail=masked.detail[:_DETAIL_CHARS])


def deadline_in(seconds: float) -> float:
    """The `deadline` a ProviderClient's call gets: a `time.monotonic()` instant (the event loop's clock)."""
    return time.monotonic() + seconds


def own_copy(args: dict[str, Any]) -> dict[str, Any]:
    """The arguments as the adopter's code may keep or change them: never the request's own."""
    return copy.deepcopy(args)


def question(args: dict[str, Any], key: str, timeout: float) -> ProviderCall:
    """What a client's `call` or `lookup` is given: its own copy of the arguments, the account taken out of them
    (`in_account` put it there for the journal; the provider gets it as its account, never in the body), and the
    deadline `timeout` from now."""
    own = own_copy(args)
    account = own.pop(ACCOUNT_ARG, None)
    return ProviderCall(key=key, args=own, account=str(account or ""), deadline=deadline_in(timeout))


async def listed(
    what: str, client: ListingClient, give_up_after: float, limit: HookLimit | None = None
) -> list[ProviderEffect] | str:
    """Every effect a client lists (`effects()`), checked: a list of `ProviderEffect`; else why there is none (it
    raised, answered late or answered something else), and the audit checks by key alone."""
    try:
        async with asyncio.timeout(give_up_after):
            effects = await (limit.sliced(client.effects()) if limit is not None else client.effects())
    except asyncio.CancelledError:
        raise
    except HookOverran as overran:
        return f"{what} held the event loop: {overran}"
    except Exception as exc:  # noqa: BLE001 -- the adopter's code: no listing, never a failed audit
        return f"{what} raised {type(exc).__name__}: {exc}"
    if not isinstance(effects, list) or not all(isinstance(e, ProviderEffect) for e in effects):
        return f"{what} answered a {type(effects).__name__}, not a list of ProviderEffect"
    return effects


def _unknown(detail: str) -> ProviderAnswer:
    return ProviderAnswer(Answer.UNKNOWN, {}, detail=detail)
