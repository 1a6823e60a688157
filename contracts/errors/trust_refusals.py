"""Refusals at a trust boundary: an action request without a good capability, an outcome its run never asked
for, a message into another guest's session, a message for a run that was archived."""

from __future__ import annotations

from crashsafe.contracts.errors.crashsafe_error import CrashsafeError, ErrorCode, RetryClass


class CapabilityRefused(CrashsafeError):
    """An executor refused an action request whose capability is missing, forged, altered, expired or of the
    wrong origin (`reason`, a `crashsafe.contracts.capabilities.Refusal`). Nothing was attempted and no outcome is sent:
    whoever published it could otherwise inject an answer into a real run. Dead-lettered."""

    code = ErrorCode.CAPABILITY_REFUSED
    retry = RetryClass.POISON

    reason: str
    key: str
    tool: str
    run_id: str
    family: str

    def explain(self) -> str:
        return (
            f"capability refused ({self.reason}) for {self.tool} with key {self.key}: nothing was attempted; only"
            " the runtime signs action requests: check who published it, or that executors hold the runtime's"
            " current verification key (CRASHSAFE_CAPABILITY_VERIFY_KEYS)"
        )


class OutcomeRefused(CrashsafeError):
    """The runtime refused an outcome its run never asked for, or one from an executor family that does not own
    the tool (`reason`, a `crashsafe.contracts.capabilities.OutcomeRefusal`). Not journaled; dead-lettered."""

    code = ErrorCode.OUTCOME_REFUSED
    retry = RetryClass.POISON

    reason: str
    key: str
    tool: str
    run_id: str
    source: str

    def explain(self) -> str:
        return (
            f"outcome refused ({self.reason}) for {self.tool} with key {self.key} from {self.source!r}: not"
            " journaled; outcomes are accepted only for journaled requests, from the family that owns the tool"
        )


class SessionOfAnotherGuest(CrashsafeError):
    """A message names a session whose active run is another guest's (HTTP 409): it would become that run's turn
    (and could answer its approval), so it is refused; nothing was published."""

    code = ErrorCode.SESSION_OF_ANOTHER_GUEST
    retry = RetryClass.POISON

    session_id: str
    run_id: str

    def explain(self) -> str:
        return (
            f"session {self.session_id} is in use by another guest's run {self.run_id}; use a session id of your"
            " own"
        )


class RunArchived(CrashsafeError):
    """A message that would write into a run whose journal was archived and purged from `RUNS` (a receipt, a wake,
    a turn, its inbound message again): refused and dead-lettered, never appended to an empty subject, which would
    start a half journal. A run is archived only when no such message is expected; `archive` names the object."""

    code = ErrorCode.RUN_ARCHIVED
    retry = RetryClass.POISON

    run_id: str
    archive: str
    what: str = "a message"

    def explain(self) -> str:
        return (
            f"{self.what} for run {self.run_id}, whose journal was archived ({self.archive}) and purged: not"
            " journaled; an archived run takes no more events (read it from the archive: crashsafe runs export)"
        )
