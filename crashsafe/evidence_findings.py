"""What `crashsafe verify` says about one run's evidence: findings, each naming the event it is about, and the
verdict they add up to (issue 34; the checks live in the other `evidence_*` modules)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from enum import StrEnum

import msgspec

from crashsafe.contracts.evidence import JournalEntry
from crashsafe.contracts.journal_chain import Link
from crashsafe.contracts.run_events import JournalEvent
from crashsafe.export_file import event_type


class Check(StrEnum):
    """What a finding checked (`str` in `--json`: a reader may meet a check a newer verifier adds)."""

    BUNDLE = "bundle"  # the file is a bundle of this run: its subjects, payloads and keys read as they must
    CHAIN = "chain"  # each event's link commits to the event before it
    CHECKPOINT = "checkpoint"  # a signed checkpoint covers the journal up to a position
    CAPABILITY = "capability"  # the runtime signed exactly the intent the journal holds
    EFFECT = "effect"  # what the providers hold matches what the journal says happened
    REPLAY = "replay"  # the agent's code decides the journal again


class Status(StrEnum):
    PASS = "pass"
    FAIL = "fail"  # the evidence contradicts itself: something was altered, dropped, forged or lied about
    UNCHECKED = (
        "unchecked"  # nothing to check with (an older release's journal, no provider asked, no agent code)
    )
    UNCOVERED = "uncovered"  # a part of the run that no signature covers (yet): cannot be shown intact


class Verdict(StrEnum):
    VERIFIED = "verified"
    UNCHAINED = "unchained"  # journaled before the hash chain: no tamper evidence either way
    INCOMPLETE = "incomplete"  # nothing contradicts, but some events are covered by no checkpoint
    TAMPERED = "tampered"


# What each verdict tells a person, after the findings.
VERDICT_SAYS = {
    Verdict.VERIFIED: "every event is linked, covered by a valid checkpoint and consistent with the rest",
    Verdict.UNCHAINED: (
        "no event carries a chain link and no checkpoint covers the run: journaled before the hash chain (0.5.0), "
        "or links and checkpoints removed from the bundle; it can neither show nor rule out tampering, and "
        "`crashsafe verify --live` against the deployment tells which"
    ),
    Verdict.INCOMPLETE: (
        "nothing contradicts the journal, but part of it is covered by no checkpoint: export the run again "
        "once its runtime has signed its last events"
    ),
    Verdict.TAMPERED: "the evidence contradicts itself: see the failures above",
}


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    """One thing a check found. `position` (1-based place in the bundle's journal), `seq` (its stream sequence)
    and `event` (its type) name the event it is about, where there is one; `message` says what to do."""

    check: Check
    status: Status
    message: str
    position: int | None = None
    seq: int | None = None
    event: str | None = None


class Verification(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    verdict: Verdict
    findings: list[Finding]

    def passes(self) -> dict[str, int]:
        """How many findings of each check passed, in check order (zero counts left out)."""
        counted = Counter(f.check for f in self.findings if f.status == Status.PASS)
        return {str(check): counted[check] for check in Check if counted[check]}

    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.status != Status.PASS]


def verdict_of(findings: list[Finding], linked: bool) -> Verdict:
    """Any failure is tampering; else a part no signature covers leaves it incomplete; else a journal with no link
    at all is unchained (an older release's, never called tampered for that alone); else verified."""
    statuses = {f.status for f in findings}
    if Status.FAIL in statuses:
        return Verdict.TAMPERED
    if Status.UNCOVERED in statuses:
        return Verdict.INCOMPLETE
    return Verdict.VERIFIED if linked else Verdict.UNCHAINED


@dataclass(frozen=True, slots=True)
class Place:
    """One journal entry of the bundle as the checks read it: decoded where it decodes, its link where it has one.
    `problem` says why its payload is not an event of this run ("" when it is); `bad_link` why its link header
    does not parse ("" when it does, or it has none)."""

    position: int
    entry: JournalEntry
    event: JournalEvent | None
    problem: str
    link: Link | None
    bad_link: str

    @property
    def type(self) -> str | None:
        return event_type(self.event) if self.event is not None else None

    def named(self) -> str:
        """How a message names it: `event 5 (seq 113, run.model_answered)`."""
        return f"event {self.position} (seq {self.entry.seq}, {self.type or 'undecodable'})"

    def finding(self, check: Check, status: Status, message: str) -> Finding:
        return Finding(
            check=check,
            status=status,
            message=message,
            position=self.position,
            seq=self.entry.seq,
            event=self.type,
        )
