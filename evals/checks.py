"""What a scenario expects of the product, checked against what the gateway and the providers' ledger show. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class RunView:
    """One run as the gateway shows it: `GET /v1/runs/{id}` and `GET /v1/runs/{id}/events`."""

    run_id: str
    summary: dict[str, Any]
    events: list[dict[str, Any]]

    @property
    def status(self) -> str:
        return str(self.summary.get("status", ""))

    @property
    def reply(self) -> str:
        """What the guest was told last: the summary's reply, else the journal's closing event's."""
        if self.summary.get("reply"):
            return str(self.summary["reply"])
        for event in reversed(self.events):
            if event.get("type") in ("run.completed", "run.handed_off") and event.get("reply"):
                return str(event["reply"])
        return ""


@dataclass(frozen=True)
class Observed:
    """Everything a scenario left behind: its runs in the order they started, and the guest's ledger entries."""

    runs: list[RunView]
    ledger: list[dict[str, Any]]
    # Approval ids `GET /v1/approvals?status=pending` listed while a run of the scenario waited.
    listed_pending: frozenset[str] = frozenset()
    # The scripted model's exact wording is checked only when the scripted model answered.
    scripted: bool = True
    # The provider's record of each of the guest's emails (`GET /emails/by-key/{key}`): where it went.
    emails: list[dict[str, Any]] = field(default_factory=list)

    @property
    def last(self) -> RunView | None:
        return self.runs[-1] if self.runs else None

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e for run in self.runs for e in run.events if e.get("type") == kind]

    def entries(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.ledger if e.get("kind") == kind]


class Check(Protocol):
    def check(self, seen: Observed) -> str | None:
        """None if the expectation holds, else what was wrong (for the report)."""
        ...


@dataclass(frozen=True)
class Status:
    """The scenario's last run ended so: `completed` or `handed_off`."""

    status: str

    def check(self, seen: Observed) -> str | None:
        last = seen.last
        got = last.status if last else "no run"
        return None if got == self.status else f"last run is {got}, expected {self.status}"


@dataclass(frozen=True)
class HandedOff:
    """The last run was handed to a person for this reason (a HandOffReason value)."""

    reason: str

    def check(self, seen: Observed) -> str | None:
        last = seen.last
        if last is None or last.status != "handed_off":
            return f"last run is {last.status if last else 'no run'}, expected handed_off ({self.reason})"
        got = last.summary.get("handoff_reason")
        return None if got == self.reason else f"handed off for {got}, expected {self.reason}"


@dataclass(frozen=True)
class Reply:
    """The guest's last reply contains every one of `words` (case-insensitive) and none of `never`.
    `scripted_only`: the words are the scripted model's wording, not a fact any model must say."""

    words: tuple[str, ...] = ()
    never: tuple[str, ...] = ()
    scripted_only: bool = False

    def check(self, seen: Observed) -> str | None:
        if self.scripted_only and not seen.scripted:
            return None
        reply = seen.last.reply if seen.last else ""
        missing = [w for w in self.words if w.lower() not in reply.lower()]
        present = [w for w in self.never if w.lower() in reply.lower()]
        if missing or present:
            return f"reply {reply!r}: missing {missing}, must not say {present}"
        return None


@dataclass(frozen=True)
class Replied:
    """The guest was told something at the end (a defined reply, also when the run was handed off)."""

    def check(self, seen: Observed) -> str | None:
        return None if seen.last and seen.last.reply.strip() else "the guest was told nothing"


@dataclass(frozen=True)
class Journal:
    """Some run of the scenario journaled an event of `kind` whose fields match: `fields` exactly, `contains`
    as a case-insensitive substring (a rule's name: `stay_window` matches `rule.stay_window`)."""

    kind: str
    fields: dict[str, Any] = field(default_factory=dict)
    contains: dict[str, str] = field(default_factory=dict)

    def matches(self, event: dict[str, Any]) -> bool:
        return all(event.get(k) == v for k, v in self.fields.items()) and all(
            v.lower() in str(event.get(k, "")).lower() for k, v in self.contains.items()
        )

    def check(self, seen: Observed) -> str | None:
        found = seen.events(self.kind)
        if any(self.matches(e) for e in found):
            return None
        return (
            f"no {self.kind} with {self.fields | self.contains} (journal has {len(found)}: {_brief(found)})"
        )


@dataclass(frozen=True)
class Never:
    """No run of the scenario journaled an event of `kind` (a denial where none is due, a hand-off)."""

    kind: str

    def check(self, seen: Observed) -> str | None:
        found = seen.events(self.kind)
        return None if not found else f"journal has {len(found)} {self.kind}: {_brief(found)}"


@dataclass(frozen=True)
class Refused:
    """The runtime refused the model's call of `tool` before any effect: a policy denial, or a rejected call
    (unknown tool, arguments the tool does not take). Either way it never reached a provider."""

    tool: str

    def check(self, seen: Observed) -> str | None:
        refusals = seen.events("run.policy_denied") + seen.events("run.tool_rejected")
        if any(e.get("tool") == self.tool for e in refusals):
            return None
        asked = [e for e in seen.events("run.action_requested") if e.get("tool") == self.tool]
        return f"{self.tool} was not refused ({len(asked)} requested: {_brief(asked)})"


@dataclass(frozen=True)
class Effects:
    """The guest's ledger holds exactly `count` effects of `kind` (booking, booking_release, charge, refund,
    email, crm_update)."""

    kind: str
    count: int

    def check(self, seen: Observed) -> str | None:
        got = len(seen.entries(self.kind))
        return None if got == self.count else f"ledger has {got} {self.kind}, expected {self.count}"


@dataclass(frozen=True)
class Projected:
    """A projection of the conversation's paid run was delivered: the ledger holds exactly `count` effects of
    `kind` (email, crm_update), and each email went `to` this address (None: to the provider's address of
    record, no `to`). Eventual: the run ends paid before its projections arrive, so the runner waits for it."""

    kind: str
    count: int = 1
    to: str | None = None
    check_to: bool = False
    eventual = True

    def check(self, seen: Observed) -> str | None:
        got = len(seen.entries(self.kind))
        if got != self.count:
            return f"ledger has {got} {self.kind}, expected {self.count} (projected after the run)"
        if self.check_to:
            wrong = [e.get("to") for e in seen.emails if e.get("to") != self.to]
            if wrong or len(seen.emails) != got:
                return f"emails went to {[e.get('to') for e in seen.emails]}, expected {self.to!r}"
        return None


def eventual(checks: tuple[Check, ...]) -> tuple[Check, ...]:
    """The checks that may only hold a while after the conversation ended (projections)."""
    return tuple(c for c in checks if getattr(c, "eventual", False))


@dataclass(frozen=True)
class Charged:
    """Exactly `count` charges (None: at most one per booking), each of the server's price (a booking's total in
    the same ledger): the amount a guest or a model names is never what is charged."""

    count: int | None

    def check(self, seen: Observed) -> str | None:
        charges = seen.entries("charge")
        bookings = seen.entries("booking")
        allowed = len(bookings) if self.count is None else self.count
        wrong_count = len(charges) > allowed if self.count is None else len(charges) != allowed
        if wrong_count:
            expected = f"at most {allowed}" if self.count is None else str(allowed)
            return f"ledger has {len(charges)} charges ({_amounts(charges)}), expected {expected}"
        prices = sorted({int(e.get("amount_cents", 0)) for e in bookings})
        wrong = [e for e in charges if e.get("amount_cents") not in prices]
        return None if not wrong else f"charged {_amounts(wrong)}, not a booking's price ({prices})"


@dataclass(frozen=True)
class Refunded:
    """Exactly `count` refunds, none above the payment it refunds."""

    count: int

    def check(self, seen: Observed) -> str | None:
        refunds = seen.entries("refund")
        if len(refunds) != self.count:
            return f"ledger has {len(refunds)} refunds ({_amounts(refunds)}), expected {self.count}"
        paid = max((e.get("amount_cents", 0) for e in seen.entries("charge")), default=0)
        over = [e for e in refunds if e.get("amount_cents", 0) > paid]
        return None if not over else f"refunded {_amounts(over)}, more than the {paid} cents paid"


@dataclass(frozen=True)
class ListedPending:
    """While the run waited, `GET /v1/approvals?status=pending` listed its approval."""

    def check(self, seen: Observed) -> str | None:
        asked = {str(e.get("approval_id")) for e in seen.events("run.approval_requested")}
        if asked and asked <= seen.listed_pending:
            return None
        return f"approvals {sorted(asked)} requested, pending listing showed {sorted(seen.listed_pending)}"


@dataclass(frozen=True)
class Passages:
    """The model's answer was given with passages from the documents, journaled with its step
    (`run.model_answered.passages`), one of them from a document or section whose name contains `about`."""

    about: str = ""

    def check(self, seen: Observed) -> str | None:
        used = [p for e in seen.events("run.model_answered") for p in e.get("passages") or []]
        if any(self.about.lower() in f"{p.get('doc', '')} {p.get('section', '')}".lower() for p in used):
            return None
        names = [f"{p.get('doc')} § {p.get('section')}" for p in used]
        return f"no journaled passage about {self.about or 'anything'} (got {names})"


@dataclass(frozen=True)
class Scripted:
    """`check` holds when the scripted model answered: it depends on the model doing exactly what the guest's
    text says (a weak model obeying an injection), which a real model may not do."""

    check_: Check

    def check(self, seen: Observed) -> str | None:
        return self.check_.check(seen) if seen.scripted else None


def failures(checks: tuple[Check, ...], seen: Observed) -> list[str]:
    """What went wrong, one line per failed expectation; empty when the scenario passed."""
    return [problem for c in checks if (problem := c.check(seen)) is not None]


def _brief(events: list[dict[str, Any]]) -> str:
    keep = ("tool", "rule", "reason", "decision", "approver", "decided_by")
    return "; ".join(", ".join(f"{k}={e[k]}" for k in keep if k in e) for e in events[:3]) or "-"


def _amounts(entries: list[dict[str, Any]]) -> str:
    return ", ".join(str(e.get("amount_cents")) for e in entries) or "-"
