"""StayHub's support agent: finds the guest's payments and refunds one of them, within what was paid.

The model may ask for `refund_payment` (compensation-only for the booking agent: the executor serves it to a
plan only under a capability bound to this agent). It never decides whose payment it is nor what was paid:
`prepare` takes both from a `find_payments` answer journaled in this run, which the runtime asked for this
run's guest. The amount is the guest's request (or, if none, what is left to refund) and never more than what
is left; above 150 EUR a manager approves (the catalog's `RefundWithinPaid` rule, checked by the policy)."""

from __future__ import annotations

from typing import Any

import msgspec

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.errors import ErrorCode, ErrorInfo
from crashsafe.contracts.policy import RefundWithinPaid
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.contracts.tools import ToolContract
from crashsafe.domain.agent import AgentBase, Compensation, ProjectionCall, ScriptedStep
from crashsafe.domain.guest_scope import in_account, owns, the_guest
from crashsafe.domain.policy_verdicts import Hold, PolicyRule, default_question
from crashsafe.domain.registry import model_contracts
from crashsafe.domain.run_state import RunState
from crashsafe.services.agents.booking.booking_arguments import RefundArgs
from crashsafe.services.agents.booking.booking_tools import REFUND_PAYMENT
from crashsafe.services.agents.support.support_tools import FIND_PAYMENTS, FindPaymentsArgs

INSTRUCTIONS = (
    "You are StayHub's support assistant. When a guest asks for a refund, call find_payments first, then "
    "refund_payment with the payment_id of the guest's payment and amount_cents in cents if the guest asked for "
    "a part (leave it out to refund what is left). You can only refund the guest's own payments, never more "
    "than was paid; refunds above 150 EUR wait for a manager's approval. Explain a refusal to the guest."
)

# A captured charge only: a declined or pending one has nothing to pay back (yet).
_REFUNDABLE = frozenset({"captured"})


def _invalid(code: ErrorCode, message: str, **details: Any) -> ErrorInfo:
    return ErrorInfo(code=code.value, message=message, details=details)


def _latest_find(state: RunState) -> tuple[int, dict[str, Any]] | None:
    """The step and answer of this run's latest successful `find_payments`."""
    found = [
        (req.step_no, done.result)
        for req, done in state.completed
        if req.tool == "find_payments" and done.status == OutcomeStatus.SUCCEEDED
    ]
    return max(found, key=lambda f: f[0]) if found else None


def found_payment(state: RunState, payment_id: str) -> dict[str, Any] | None:
    """The guest's payment as the latest `find_payments` answer of this run lists it, or None. Only the latest
    answer counts: an older one may not show the refunds made since."""
    latest = _latest_find(state)
    if latest is None:
        return None
    for payment in latest[1].get("payments", []):
        if isinstance(payment, dict) and payment.get("payment_id") == payment_id and owns(state, payment):
            return payment
    return None


def refunding_since_found(state: RunState, payment_id: str) -> int:
    """Cents this run asked to refund of the payment after its latest `find_payments` (pending, done, or maybe
    done): the listing's `refunded_cents` does not show them yet."""
    latest = _latest_find(state)
    since = latest[0] if latest is not None else 0
    asked = [(req, None) for req in state.pending] + [(req, done) for req, done in state.completed]
    return sum(
        int(req.args.get("amount_cents", 0))
        for req, done in asked
        if req.tool == "refund_payment"
        and req.step_no > since
        and req.args.get("payment_id") == payment_id
        and (done is None or done.status in (OutcomeStatus.SUCCEEDED, OutcomeStatus.UNKNOWN))
    )


class SupportAgent(AgentBase):
    name = "support"
    instructions = INSTRUCTIONS
    tools = model_contracts((FIND_PAYMENTS,)) | {REFUND_PAYMENT.name: REFUND_PAYMENT.contract}
    compensation_tools: dict[str, ToolContract] = {}
    # Every model call is checked against its tool's struct before `prepare` (unknown fields, wrong types).
    argument_types: dict[str, type[msgspec.Struct]] = {
        FIND_PAYMENTS.name: FindPaymentsArgs,
        REFUND_PAYMENT.name: RefundArgs,
    }
    config = AgentConfig(
        agent="support",
        rules=[
            RefundWithinPaid(
                tool="refund_payment",
                manager_above_cents=15_000,
                payment_field="payment_id",
                listing_tool="find_payments",
                listing_field="payments",
                charge_tool="create_payment",
            )
        ],
    )
    policies: tuple[PolicyRule, ...] = ()

    def approval_question(self, state: RunState, tool: ToolContract, args: dict[str, Any], hold: Hold) -> str:
        return default_question(state, tool, args, hold)  # the refund rule's own wording

    def script(self, state: RunState) -> ScriptedStep | None:
        return None  # the model decides

    def compensations(self, state: RunState, ending: bool) -> tuple[Compensation, ...]:
        return ()  # a refund is itself the undoing of a charge; nothing it does is undone automatically

    def projections(self, state: RunState) -> tuple[ProjectionCall, ...]:
        return ()

    def prepare(
        self, state: RunState, tool: ToolContract, args: dict[str, Any]
    ) -> dict[str, Any] | ErrorInfo:
        match tool.name:
            case "find_payments":
                return the_guest(state)  # the run's guest in its tenant's account, whatever the model names
            case "refund_payment":
                return self._refund(state, args)
        return _invalid(ErrorCode.INVALID_TOOL_ARGUMENTS, f"no argument rules for {tool.name}")

    @staticmethod
    def _refund(state: RunState, args: dict[str, Any]) -> dict[str, Any] | ErrorInfo:
        payment_id = args.get("payment_id")
        if not isinstance(payment_id, str) or not payment_id:
            return _invalid(ErrorCode.INVALID_TOOL_ARGUMENTS, "payment_id is required and must be a string")
        payment = found_payment(state, payment_id)
        if payment is None:
            return _invalid(
                ErrorCode.UNKNOWN_PAYMENT,
                f"payment {payment_id[:200]} is not one of this guest's payments found in this run;"
                " call find_payments and refund one of those",
                payment_id=payment_id[:200],
            )
        paid, refunded = payment.get("amount_cents"), payment.get("refunded_cents", 0)
        if (
            not isinstance(paid, int)
            or not isinstance(refunded, int)
            or payment.get("status") not in _REFUNDABLE
        ):
            return _invalid(
                ErrorCode.INVALID_TOOL_ARGUMENTS,
                f"payment {payment_id} is {payment.get('status')!r}: nothing was paid to refund",
                payment_id=payment_id,
            )
        left = paid - refunded - refunding_since_found(state, payment_id)
        asked = args.get("amount_cents", left)
        if isinstance(asked, bool) or not isinstance(asked, int) or asked <= 0:
            return _invalid(
                ErrorCode.INVALID_TOOL_ARGUMENTS, "amount_cents must be a positive whole number of cents"
            )
        if asked > left:
            return _invalid(
                ErrorCode.INVALID_TOOL_ARGUMENTS,
                f"payment {payment_id} has {left} cents left to refund of {paid} paid; asked for {asked}",
                payment_id=payment_id,
                left_cents=left,
                asked_cents=asked,
            )
        refund = {
            "payment_id": payment_id,
            "amount_cents": asked,
            "currency": str(payment.get("currency", "")),
            "booking_id": str(payment.get("booking_id", "")),
            "guest_id": state.guest_id,
        }
        return in_account(state, refund)
