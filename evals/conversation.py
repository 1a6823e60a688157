"""What a scenario is made of: its class, the guest, the steps of the conversation (say, decide, wait, restart) and the checks it must pass."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from crashsafe.evals.checks import Check


class ScenarioClass(StrEnum):
    BOOKS = "books"
    CLARIFIES = "clarifies"
    REFUSED = "refused"
    APPROVAL = "approval"
    HANDS_OFF = "hands_off"
    DOCUMENTS = "documents"
    INJECTION = "injection"


@dataclass(frozen=True)
class Say:
    """The guest sends `text` (`{booking_id}`: the guest's latest booking in the ledger) to `agent`. `new_session`:
    in a session of its own (another conversation), else in the scenario's session (the next turn)."""

    text: str
    agent: str = "booking"
    new_session: bool = False


@dataclass(frozen=True)
class Decide:
    """A manager decides the approval the scenario's run waits for: `POST /v1/approvals/{id}`. `again`: decide
    the one already decided once more, which must be refused with 409 `approval_not_pending`."""

    decision: str  # approve | reject
    approver: str = "manager@acme.example"
    reason: str = ""
    again: bool = False


@dataclass(frozen=True)
class RestartAll:
    """Every service of the stack is killed (SIGKILL) and started again while the run waits."""


@dataclass(frozen=True)
class AwaitExpiry:
    """Nobody answers: the scenario waits for the approval to expire (its catalog gives it a short ttl)."""


Action = Say | Decide | AwaitExpiry | RestartAll


@dataclass(frozen=True)
class Guest:
    """The guest's profile, set by an operator before the conversation (`crashsafe guests set`)."""

    verified_email: str = ""
    corporate: bool = False
    manager: str = ""


@dataclass(frozen=True)
class Scenario:
    name: str
    klass: ScenarioClass
    actions: tuple[Action, ...]
    expect: tuple[Check, ...]
    guest: Guest | None = None
    # Publish a catalog whose approvals expire after this many seconds, for this scenario only.
    approval_ttl_s: float | None = None
    # The parts of issue 9 this scenario needs beyond what the product had before it (for the report).
    needs: tuple[str, ...] = field(default=())
    # Played only against the scripted model: it needs a model that obeys a hostile script to the letter.
    scripted_only: bool = False
