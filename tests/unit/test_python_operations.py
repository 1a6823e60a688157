"""A provider operation written in Python: whatever the adopter's code raises or answers, the executor gets a
typed answer it understands, and anything it cannot trust is unknown (asked about by key, never called blind)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from crashsafe.contracts.errors import ErrorCode, ErrorInfo, InvalidSetting, ProviderAnswerInvalid
from crashsafe.contracts.provider_settings import DEFAULT_PROVIDER, ProviderSettings
from crashsafe.contracts.tool_messages import ActionRequest, Answer, OutcomeStatus
from crashsafe.domain.execution import Done, after_call, after_lookup
from crashsafe.domain.registry import ProviderAnswer, ProviderCall, PythonOperation, Tool
from crashsafe.services.platform.settings import Settings
from crashsafe.services.providers.provider_calls import Providers
from tests.support.python_providers import ORDER, OrderBook, order_tool, registry


class Scripted:
    """A client whose call and lookup do what the test says: answer, raise, or wait."""

    def __init__(self, call: Any = None, lookup: Any = None, wait_s: float = 0.0) -> None:
        self.answers = {"call": call, "lookup": lookup}
        self.wait_s = wait_s
        self.seen: list[dict[str, Any]] = []

    async def _answer(self, what: str) -> Any:
        if self.wait_s:
            await asyncio.sleep(self.wait_s)
        answer = self.answers[what]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def call(self, call: ProviderCall) -> ProviderAnswer:
        self.seen.append(call.args)
        call.args["changed"] = True  # the adopter's code may change what it was given
        answer: ProviderAnswer = await self._answer("call")
        return answer

    async def lookup(self, call: ProviderCall) -> ProviderAnswer:
        answer: ProviderAnswer = await self._answer("lookup")
        return answer


def tool_of(client: Scripted, looks_up: bool = True) -> Tool:
    return Tool(ORDER, PythonOperation(lambda settings: client, looks_up=looks_up))


def providers() -> Providers:
    return Providers({DEFAULT_PROVIDER: ProviderSettings(DEFAULT_PROVIDER)})


def request(**args: Any) -> ActionRequest:
    now = datetime.now(UTC)
    return ActionRequest(
        run_id="run_1",
        step_no=1,
        tool=ORDER.name,
        family=ORDER.family,
        args={"item": "desk", **args},
        key="run_1:1",
        input_hash="h",
        timeout_s=2.0,
        deadline_at=now + timedelta(seconds=30),
        requested_at=now,
    )


@pytest.mark.parametrize(
    "raised",
    [ConnectionResetError("reset"), RuntimeError("sdk bug"), KeyError("x"), TimeoutError("sdk timeout")],
)
async def test_an_exception_from_call_is_unknown_never_rejected(raised: Exception) -> None:
    answer = await providers().call(tool_of(Scripted(call=raised)), request(), 1.0)
    assert answer.kind == Answer.UNKNOWN
    assert answer.detail.startswith(f"place_order's call raised {type(raised).__name__}")


async def test_an_exception_from_lookup_is_unknown_never_absent() -> None:
    answer = await providers().lookup(tool_of(Scripted(lookup=RuntimeError("down"))), "run_1:1", 1.0, {})
    assert (answer.kind, answer.detail) == (Answer.UNKNOWN, "place_order's lookup raised RuntimeError: down")


@pytest.mark.parametrize(
    ("answered", "why"),
    [
        ({"status": "ok"}, "answered a dict, not a ProviderAnswer"),
        (None, "answered a NoneType, not a ProviderAnswer"),
        (
            ProviderAnswer(Answer.FOUND, {}),
            "answered <Answer.FOUND: 'found'>, not one of ok, rejected, unknown",
        ),
        (ProviderAnswer(Answer.OK, ["a"]), "answered a body that is not a dict"),  # type: ignore[arg-type]
        (ProviderAnswer(Answer.OK, {"at": object()}), "answered a body that is not JSON"),
    ],
)
async def test_a_call_answer_of_the_wrong_type_or_kind_is_unknown_naming_the_operation(
    answered: object, why: str
) -> None:
    answer = await providers().call(tool_of(Scripted(call=answered)), request(), 1.0)
    assert answer.kind == Answer.UNKNOWN
    assert answer.detail.startswith(f"place_order's call {why}"), answer.detail


async def test_a_lookup_answer_of_a_call_kind_is_unknown() -> None:
    answer = await providers().lookup(tool_of(Scripted(lookup=ProviderAnswer(Answer.OK, {}))), "k", 1.0)
    assert answer.kind == Answer.UNKNOWN and "place_order's lookup answered" in answer.detail


@pytest.mark.parametrize(
    "typed",
    [
        ProviderAnswer(Answer.OK, {"order_id": "ord_1"}, ref="ord_1", replayed=True),
        ProviderAnswer(Answer.REJECTED, {"code": "card_declined", "message": "no"}, detail="declined"),
        ProviderAnswer(Answer.UNKNOWN, {}, detail="in use", retry_after_s=3.0),
    ],
)
async def test_typed_call_answers_pass_through(typed: ProviderAnswer) -> None:
    assert await providers().call(tool_of(Scripted(call=typed)), request(), 1.0) == typed


@pytest.mark.parametrize(
    "typed",
    [
        ProviderAnswer(Answer.FOUND, {"order_id": "ord_1"}, ref="ord_1"),
        ProviderAnswer(Answer.ABSENT, {}, detail="key_not_found"),
        ProviderAnswer(Answer.REJECTED, {"code": "declined"}),
        ProviderAnswer(Answer.UNKNOWN, {}, detail="pending"),
    ],
)
async def test_typed_lookup_answers_pass_through(typed: ProviderAnswer) -> None:
    assert await providers().lookup(tool_of(Scripted(lookup=typed)), "run_1:1", 1.0, {}) == typed


async def test_a_plain_string_kind_is_read_as_the_answer_it_names() -> None:
    answer = await providers().call(tool_of(Scripted(call=ProviderAnswer("ok", {}))), request(), 1.0)  # type: ignore[arg-type]
    assert answer.kind is Answer.OK


async def test_a_call_past_the_whole_call_bound_is_unknown_and_its_deadline_is_a_monotonic_instant() -> None:
    book = OrderBook()
    before = time.monotonic()
    answer = await providers().call(order_tool(book, DEFAULT_PROVIDER), request(), 1.5)
    ((deadline, arrived),) = book.deadlines
    assert (
        answer.kind == Answer.OK
        and before <= arrived <= deadline
        and deadline - before == pytest.approx(1.5, abs=0.2)
    )
    slow = Scripted(call=ProviderAnswer(Answer.OK, {}), wait_s=5.0)
    started = time.monotonic()
    late = await providers().call(tool_of(slow), request(), 0.1)
    assert (late.kind, late.detail) == (Answer.UNKNOWN, "place_order's call: no answer within 0.2s")
    assert time.monotonic() - started < 2.0


async def test_the_executor_stopping_cancels_the_call_and_is_not_an_answer() -> None:
    slow = Scripted(call=ProviderAnswer(Answer.OK, {}), wait_s=5.0)
    task = asyncio.create_task(providers().call(tool_of(slow), request(), 10.0))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_the_adopters_code_gets_its_own_copy_of_the_arguments() -> None:
    client = Scripted(call=ProviderAnswer(Answer.OK, {}))
    sent = request()
    await providers().call(tool_of(client), sent, 1.0)
    assert client.seen == [{"item": "desk", "changed": True}] and sent.args == {"item": "desk"}


async def test_an_operation_without_lookup_is_never_asked_and_says_unknown() -> None:
    client = Scripted(lookup=ProviderAnswer(Answer.ABSENT, {}))
    tool = tool_of(client, looks_up=False)
    assert not providers().can_look_up(tool) and providers().can_look_up(tool_of(client))
    answer = await providers().lookup(tool, "k", 1.0)
    assert (answer.kind, answer.detail) == (Answer.UNKNOWN, "place_order has no lookup by key")


async def test_a_client_that_cannot_open_is_unknown_at_the_call() -> None:
    def broken(settings: ProviderSettings) -> Scripted:
        raise ValueError("no api key")

    tool = Tool(ORDER, PythonOperation(broken))
    answer = await providers().call(tool, request(), 1.0)
    assert (answer.kind, answer.detail) == (
        Answer.UNKNOWN,
        "place_order: its client did not open: ValueError: no api key",
    )


# Opened at start, with the provider's settings ---------------------------------------------------------------


def settings(**providers: ProviderSettings) -> Settings:
    return Settings(sandbox_url="http://sandbox:8090", providers=tuple(providers.values()))


async def test_a_python_operation_is_opened_once_with_its_providers_url_and_credential() -> None:
    book = OrderBook()
    shop = ProviderSettings("shop", "https://shop.example", credential="sk_test_1")
    crm = ProviderSettings("crm", "https://crm.example")
    async with Providers.open(settings(shop=shop, crm=crm), registry(book).tools.values()) as opened:
        await opened.call(order_tool(book), request(), 1.0)
        assert sorted(opened.http_providers()) == ["crm", "default", "shop"]
    assert book.opened == [("shop", "https://shop.example", "sk_test_1")]
    assert "sk_test_1" not in repr(shop) and "sk_test_1" not in repr(settings(shop=shop))


def test_a_provider_the_registry_names_without_a_url_stops_the_start_naming_the_variable() -> None:
    tools = registry(OrderBook()).tools.values()
    with pytest.raises(InvalidSetting) as http_missing:
        Providers.open(settings(shop=ProviderSettings("shop", credential="sk")), tools)
    assert http_missing.value.variable == "CRASHSAFE_PROVIDER_CRM_URL"
    assert "tool 'send_note' names it" in http_missing.value.message
    with pytest.raises(InvalidSetting) as python_missing:
        Providers.open(settings(crm=ProviderSettings("crm", "https://crm.example")), tools)
    assert python_missing.value.variable == "CRASHSAFE_PROVIDER_SHOP_URL"
    assert "CRASHSAFE_PROVIDER_SHOP_CREDENTIAL_FILE" in python_missing.value.message


def test_a_client_that_cannot_open_at_start_stops_it_naming_its_provider() -> None:
    def broken(settings: ProviderSettings) -> Scripted:
        raise ValueError("no api key")

    with pytest.raises(InvalidSetting) as raised:
        Providers.open(settings(), [Tool(ORDER, PythonOperation(broken))])
    assert (
        raised.value.variable == "CRASHSAFE_SANDBOX_URL" and "ValueError: no api key" in raised.value.message
    )


def test_a_provider_name_that_no_variable_can_spell_is_refused_when_the_registry_is_built() -> None:
    for name in ("Stripe", "pay-pal", ""):
        with pytest.raises(ValueError, match="a provider name is a lower-case letter"):
            PythonOperation(lambda settings: Scripted(), provider=name)


async def test_an_exception_quoting_the_credential_is_journaled_without_it() -> None:
    client = Scripted(call=PermissionError("key sk_live_secret was refused"))
    endpoints = {DEFAULT_PROVIDER: ProviderSettings(DEFAULT_PROVIDER, credential="sk_live_secret")}
    answer = await Providers(endpoints).call(tool_of(client), request(), 1.0)
    assert (answer.kind, answer.detail) == (
        Answer.UNKNOWN,
        "place_order's call raised PermissionError: key [credential] was refused",
    )


async def test_a_credential_across_the_details_cut_or_echoed_in_a_refusals_body_is_masked() -> None:
    """Masked before the detail is cut (a credential straddling character 500 would leave its start), and in
    the body too: a refusal's body is the receipt's result, journaled."""
    secret = "sk_live_0123456789abcdef"
    endpoints = {DEFAULT_PROVIDER: ProviderSettings(DEFAULT_PROVIDER, credential=secret)}
    prefix = "x" * (500 - len("place_order's call raised PermissionError: ") - 5)
    raised = Scripted(call=PermissionError(f"{prefix}{secret} refused"))
    answer = await Providers(endpoints).call(tool_of(raised), request(), 1.0)
    assert secret[:5] not in answer.detail and len(answer.detail) <= 500
    refused = ProviderAnswer(Answer.REJECTED, {"error": {"code": "auth", "sent": [f"Bearer {secret}"]}})
    answer = await Providers(endpoints).call(tool_of(Scripted(call=refused)), request(), 1.0)
    # The provider's error is the refusal's body, as an HTTP provider's is (its code is the receipt's).
    assert answer.kind == Answer.REJECTED and answer.body == {"code": "auth", "sent": ["Bearer [credential]"]}


# A refusal keeps the provider's code ---------------------------------------------------------------------------

DECLINED = {"error": {"code": "card_declined", "message": "Your card was declined."}}


async def test_a_refusal_in_the_providers_error_shape_is_journaled_with_the_providers_code() -> None:
    """docs/providers.md: the failed receipt carries the provider's `code` (a declined card), read from the same
    `{"error": {"code", "message"}}` shape as an HTTP provider's refusal: the model and the agent's compensations
    see `card_declined`, not `provider_rejected`."""
    refused = ProviderAnswer(Answer.REJECTED, DECLINED, detail="card_declined")
    answer = await providers().call(tool_of(Scripted(call=refused)), request(), 1.0)
    step = after_call(request(), ORDER, answer, attempts=1, deliveries=1)
    assert isinstance(step, Done) and step.outcome.status == OutcomeStatus.FAILED
    assert step.outcome.error == ErrorInfo(
        code="card_declined", message="Your card was declined.", details={"provider": DECLINED["error"]}
    )
    held = ProviderAnswer(
        Answer.REJECTED, DECLINED
    )  # a lookup: the provider holds the key's record as refused
    found = await providers().lookup(tool_of(Scripted(lookup=held)), "run_1:1", 1.0, {})
    again = after_lookup(request(), ORDER, found, attempts=1, deliveries=1)
    assert isinstance(again, Done) and again.outcome.error is not None
    assert again.outcome.error.code == "card_declined"


async def test_a_refusal_with_no_code_of_the_provider_is_provider_rejected_with_its_detail() -> None:
    refused = ProviderAnswer(Answer.REJECTED, {"reason": "no"}, detail="the SDK said no")
    answer = await providers().call(tool_of(Scripted(call=refused)), request(), 1.0)
    step = after_call(request(), ORDER, answer, attempts=1, deliveries=1)
    assert isinstance(step, Done) and step.outcome.error is not None
    assert (step.outcome.error.code, step.outcome.error.message) == ("provider_rejected", "the SDK said no")


# What a client may answer: the five, and a typed error where another is built ----------------------------------


@pytest.mark.parametrize("kind", [Answer.REPLAYED, Answer.CONFLICT, Answer.REPUBLISHED, "done"])
def test_an_answer_of_a_kind_no_client_may_give_is_a_typed_error_where_it_is_built(kind: str) -> None:
    with pytest.raises(ProviderAnswerInvalid) as raised:
        ProviderAnswer(kind, {})  # type: ignore[arg-type]
    assert raised.value.code == ErrorCode.PROVIDER_ANSWER_INVALID and raised.value.kind == kind
    assert raised.value.allowed == ["ok", "rejected", "unknown", "found", "absent"]


class SaysReplayed:
    """A client that answers the executor's own `replayed` (it read the evidence's vocabulary as its own)."""

    async def call(self, call: ProviderCall) -> ProviderAnswer:
        return ProviderAnswer(Answer.REPLAYED, {})  # type: ignore[arg-type]

    async def lookup(self, call: ProviderCall) -> ProviderAnswer:
        return await self.call(call)


async def test_a_client_answering_an_executors_own_kind_is_unknown_naming_the_typed_error() -> None:
    """Unknown, never taken at its word: the call may have made its effect before the client built its answer."""
    tool = Tool(ORDER, PythonOperation(lambda settings: SaysReplayed()))
    answer = await providers().call(tool, request(), 1.0)
    assert answer.kind == Answer.UNKNOWN
    assert answer.detail.startswith(
        "place_order's call raised ProviderAnswerInvalid: a provider answer of kind"
    )


# The account: a typed field of the call, never among the arguments ----------------------------------------------


async def test_a_client_is_given_the_account_as_a_field_of_the_call_and_not_in_its_arguments() -> None:
    """A tenant's run acts in its account at the provider (`in_account` journals it in the arguments): the client
    sends `call.account` as the provider's account; the arguments it may pass as the body do not hold it."""
    book = OrderBook()
    tool = order_tool(book, DEFAULT_PROVIDER)
    opened = providers()
    sent = request(account="acme")
    await opened.call(tool, sent, 1.0)
    await opened.lookup(tool, sent.key, 1.0, sent.args)
    await opened.call(tool, request(), 1.0)  # a run of no tenant: the provider's default account
    assert [(c.key, c.account, c.args) for c in book.asked] == [
        ("run_1:1", "acme", {"item": "desk"}),
        ("run_1:1", "acme", {"item": "desk"}),
        ("run_1:1", "", {"item": "desk"}),
    ]
    assert sent.args == {"item": "desk", "account": "acme"}, "the journaled request is untouched"
    assert all(c.deadline > 0 for c in book.asked)


class OldShape:
    """A client written for 0.2: the account among its arguments, taken out of the body by the client itself."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    async def call(self, args: dict[str, Any], key: str, deadline: float) -> ProviderAnswer:
        self.seen.append(("call", dict(args)))
        return ProviderAnswer(Answer.OK, {"order_id": "ord_1"})

    async def lookup(self, key: str, args: dict[str, Any]) -> ProviderAnswer:
        self.seen.append(("lookup", dict(args)))
        return ProviderAnswer(Answer.FOUND, {"order_id": "ord_1"})


async def test_a_client_of_the_02_shape_is_still_served_the_account_in_its_arguments_and_warned_about() -> (
    None
):
    client = OldShape()
    tool = Tool(ORDER, PythonOperation(lambda settings: client))
    opened = providers()
    sent = request(account="acme")
    with pytest.warns(DeprecationWarning, match="tool 'place_order': its provider client has the 0.2 shape"):
        answer = await opened.call(tool, sent, 1.0)
    found = await opened.lookup(tool, sent.key, 1.0, sent.args)  # opened once: warned once
    assert (answer.kind, found.kind) == (Answer.OK, Answer.FOUND)
    assert client.seen == [
        ("call", {"item": "desk", "account": "acme"}),
        ("lookup", {"item": "desk", "account": "acme"}),
    ]
