"""Who a run's guest is at the providers: (tenant, guest), never the guest id alone. Pure.

Every argument that names the guest to a provider and every check that a record is the guest's goes through
here, so no agent (and no model) decides whose account a call acts in."""

from __future__ import annotations

from typing import Any

from crashsafe.contracts.keys import ACCOUNT_ARG
from crashsafe.domain.run_state import RunState


def in_account(state: RunState, args: dict[str, Any]) -> dict[str, Any]:
    """`args` acting in the run's provider account (the executor sends it as `Provider-Account`). A run journaled
    before tenant accounts acts in the default account: its arguments stay as they were, so replay decides them."""
    return {**args, ACCOUNT_ARG: state.account} if state.account else dict(args)


def the_guest(state: RunState) -> dict[str, Any]:
    """The run's guest as a provider call names it: the guest id, in the tenant's account."""
    return in_account(state, {"guest_id": state.guest_id})


def owns(state: RunState, record: dict[str, Any]) -> bool:
    """Whether a provider's record (a listed payment, a charge this run made) is this run's guest's: the same guest
    id in the same account. The same guest id of another tenant is another guest."""
    account = record.get(ACCOUNT_ARG) or ""
    return record.get("guest_id") == state.guest_id and account == state.account
