"""The journal's hashes checked against what its writers and its checkpoints committed to, so that an altered,
dropped, inserted or reordered event is named by its position, not only noticed (contracts/journal_chain.py)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from crashsafe.contracts.checkpoints import CheckpointProof, proof_holds, signed_bytes
from crashsafe.contracts.journal_chain import GENESIS, entry_hash, in_namespace
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    JournalEvent,
    RunCompleted,
    RunHandedOff,
)
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.evidence_findings import Check, Finding, Place, Status
from crashsafe.evidence_keys import SigningKeys, signature_holds


@dataclass(frozen=True, slots=True)
class ChainReading:
    """What the chain check found, and what the checkpoint check needs of it: `heads[p]`, the hash of the journal's
    first `p` events as they stand (from GENESIS, whatever the links say), and the positions where the links
    showed the journal breaks (an event altered, or standing where its link says it does not)."""

    findings: list[Finding]
    heads: list[str]
    broken: list[int]
    linked: bool
    misplaced: bool = False  # some event stands where its link says it does not (a drop, an insert, a swap)


def _plural(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def read_chain(places: Sequence[Place], namespace: str) -> ChainReading:
    """Each event's own hash is taken from the prev its link names (an unlinked event: from the event before it),
    so a break is pinned to the one event that no longer hashes to what the next link committed to, and the
    events after it are not blamed for it. Links are then checked by position, not by place: a link commits to
    the event that claims the position before it, wherever that event now stands."""
    findings: list[Finding] = []
    heads = [GENESIS]
    claimed: dict[int, list[tuple[Place, str]]] = defaultdict(list)
    linked = False
    position, prev = 0, GENESIS
    for place in places:
        subject = in_namespace(namespace, place.entry.subject)
        heads.append(entry_hash(heads[-1], place.position, subject, place.entry.data))
        if place.bad_link:
            linked = True
            findings.append(
                place.finding(
                    Check.CHAIN, Status.FAIL, f"{place.named()} carries a malformed link: {place.bad_link}"
                )
            )
        if place.link is not None:
            linked = True
            position, prev = place.link.position, place.link.prev
        else:
            position += 1
        prev = entry_hash(prev, position, subject, place.entry.data)
        claimed[position].append((place, prev))
    if not linked:
        findings.append(
            Finding(
                check=Check.CHAIN,
                status=Status.UNCHECKED,
                message="no event carries a chain link: this run was journaled by a release before the hash "
                "chain (0.5.0), so its events cannot show whether they were altered",
            )
        )
        return ChainReading(findings, heads, [], linked)
    misplaced = _misplaced(places)
    findings += misplaced
    altered: list[int] = []
    for place in places:
        link = place.link
        if link is None:
            continue
        before = claimed.get(link.position - 1, []) if link.position > 1 else []
        if link.position == 1 and link.prev != GENESIS:
            altered.append(place.position)
            findings.append(
                place.finding(
                    Check.CHAIN,
                    Status.FAIL,
                    f"{place.named()} claims to be the run's first event but links to an event before it: "
                    "the start of the journal was replaced",
                )
            )
        elif before and all(hash_ != link.prev for _, hash_ in before):
            culprit = before[-1][0]
            altered.append(culprit.position)
            start = _unlinked_from(places, culprit)
            which = (
                f"{culprit.named()} was"
                if start == culprit.position
                else (
                    f"one of events {start} to {culprit.position} (the last of them written without a link) was"
                )
            )
            findings.append(
                culprit.finding(
                    Check.CHAIN,
                    Status.FAIL,
                    f"{which} altered or replaced after it was written: the link of {place.named()} commits to "
                    f"another event at position {link.position - 1} (or that link itself was altered)",
                )
            )
        elif before or link.position == 1:
            findings.append(place.finding(Check.CHAIN, Status.PASS, "its link holds"))
    broken = {f.position for f in misplaced if f.position is not None} | set(altered)
    return ChainReading(findings, heads, sorted(broken), linked, bool(misplaced))


def _unlinked_from(places: Sequence[Place], culprit: Place) -> int:
    """The first position an alteration seen at `culprit` may lie at: an event written without a link is hashed
    after the one before it, so a break there may lie anywhere back to the nearest linked event (or the start)."""
    start = culprit.position
    while start > 1 and places[start - 1].link is None:
        start -= 1
    return start


def _misplaced(places: Sequence[Place]) -> list[Finding]:
    """Linked events standing where their link says they do not: one finding per run of events shifted alike (a
    drop shifts every event after it by one), and one for two adjacent events in each other's places."""
    shifts = [(p, p.link.position - p.position) for p in places if p.link is not None]
    findings: list[Finding] = []
    i = 0
    while i < len(shifts):
        place, shift = shifts[i]
        previous = shifts[i - 1][1] if i else 0
        if shift == previous or shift == 0:
            i += 1
            continue
        after = shifts[i + 1] if i + 1 < len(shifts) else None
        swapped = (
            shift == 1 and after is not None and after[1] == -1 and after[0].position == place.position + 1
        )
        if swapped and after is not None:
            findings.append(
                place.finding(
                    Check.CHAIN,
                    Status.FAIL,
                    f"{place.named()} and the event after it stand in each other's places: each carries the "
                    "other's link (two events were swapped)",
                )
            )
            i += 2
            continue
        where = f"{place.named()} carries the link of position {place.position + shift}"
        count = abs(shift)
        were = "was" if count == 1 else "were"
        if shift > 0:
            why = f"{_plural(count, 'event')} before it {were} dropped from the journal (or events were reordered)"
        else:
            why = (
                f"{_plural(count, 'event')} {were} inserted before it (or an event was repeated or reordered)"
            )
        findings.append(place.finding(Check.CHAIN, Status.FAIL, f"{where}: {why}"))
        i += 1
    return findings


def read_checkpoints(
    proofs: Sequence[CheckpointProof],
    places: Sequence[Place],
    chain: ChainReading,
    keys: SigningKeys,
    run_id: str,
    pinned: bool,
) -> list[Finding]:
    """Each proof: signed by a key we accept, its leaf in its signed root, about this run, and its head the hash of
    the journal up to its position. Then what no valid checkpoint covers, and, unless keys were pinned, that the
    keys came from the bundle itself."""
    findings: list[Finding] = []
    covered, failed = 0, False
    for proof in proofs:
        problem, about = _proof_problem(proof, places, chain, keys, run_id)
        failed = failed or bool(problem)
        if problem:
            findings.append(
                _about(about, places, Status.FAIL, f"the checkpoint at seq {proof.seq}: {problem}")
            )
            continue
        covered = max(covered, proof.head.position)
        message = f"the checkpoint at seq {proof.seq} covers the journal up to position {proof.head.position}"
        findings.append(_about(proof.head.position, places, Status.PASS, message))
    n = len(places)
    if not proofs and not chain.linked:
        findings.append(
            Finding(
                check=Check.CHECKPOINT,
                status=Status.UNCHECKED,
                message="no checkpoint covers this run: it was journaled before checkpoints (0.5.0)",
            )
        )
    elif covered < n:
        span = f"events {covered + 1} to {n}" if covered + 1 < n else f"event {n}"
        if failed:
            message = f"no checkpoint that holds covers {span} (see the failures above)"
        else:
            none = "no checkpoint covers this run" if not covered else f"no checkpoint covers {span}"
            message = (
                f"{none}: nothing signed shows that {span} are intact; export the run again once its runtime "
                "has checkpointed it (about a second after its last append)"
            )
        findings.append(places[covered].finding(Check.CHECKPOINT, Status.UNCOVERED, message))
    last = places[-1].event if places else None
    open_keys = _unanswered([p.event for p in places])
    if chain.linked and open_keys and isinstance(last, RunCompleted | RunHandedOff):
        # A receipt may be journaled after a hand-off (a late one): cut there, the bundle would look finished.
        message = (
            f"the journal ends with {len(open_keys)} action(s) whose outcome it does not hold"
            f" ({', '.join(sorted(open_keys)[:3])}): a receipt journaled later may have been cut from this bundle;"
            " `crashsafe verify --live` or a later bundle settles it"
        )
        findings.append(places[-1].finding(Check.CHECKPOINT, Status.UNCOVERED, message))
    if chain.linked and places and not isinstance(last, RunCompleted | RunHandedOff):
        # A bundle cut back to an older checkpoint looks exactly like a run still going: say which it can be.
        message = (
            f"the journal ends at position {n} before the run did (no run.completed or run.handed_off): a run"
            " still going, or a bundle cut short; `crashsafe verify --live` or a later bundle settles which"
        )
        findings.append(places[-1].finding(Check.CHECKPOINT, Status.UNCOVERED, message))
    if not pinned:
        findings.append(
            Finding(
                check=Check.CHECKPOINT,
                status=Status.UNCHECKED,
                message="the public keys were taken from the bundle itself, so a forger could have put their own "
                "there: pass the runtime's public key with --trust <PEM> to pin it",
            )
        )
    return findings


def _proof_problem(
    proof: CheckpointProof, places: Sequence[Place], chain: ChainReading, keys: SigningKeys, run_id: str
) -> tuple[str, int | None]:
    """Why the proof does not hold ("" if it does), and the position of the event to name."""
    raw, why = keys.key(proof.kid)
    if raw is None:
        return why, None
    try:
        message = signed_bytes(proof.kid, proof.signed_at, proof.prev, proof.root, proof.size)
    except (TypeError, ValueError, OverflowError):
        return "its signed fields cannot be read (a time without a zone?)", None
    if not signature_holds(raw, message, proof.sig):
        return f"its signature does not hold under key {proof.kid!r}: it was forged or altered", None
    if not proof_holds(proof):
        return "the run's leaf and path do not lead to the signed root: the run's head was altered", None
    head = proof.head
    if head.run_id != run_id:
        return f"it signs a head of run {head.run_id!r}, not of this run", None
    n = len(places)
    if head.position > n:
        missing = _plural(head.position - n, "event")
        how = (
            "dropped (see the chain)" if chain.misplaced else "cut off at its end: the journal was truncated"
        )
        # Named by the position it signed: the last of the events that are gone.
        return (
            f"it signed this run at position {head.position}, but the journal ends at {n}: {missing} {how}",
            head.position,
        )
    if head.position < 1:
        return f"it signs position {head.position}, which no journal has", None
    if chain.heads[head.position] != head.head:
        # With every event linked, the links pin an alteration to one event; when none did, it is the one at the
        # signed position itself (the last, which no later link covers) or, in an unlinked journal, one before it.
        earlier = [p for p in chain.broken if p <= head.position]
        mismatch = f"the journal up to position {head.position} does not hash to the signed head"
        if earlier:
            return f"{mismatch}: it breaks at event {earlier[0]} (see the chain)", earlier[0]
        return f"{mismatch}: event {head.position} was altered or replaced after it was signed", head.position
    return "", None


def _about(position: int | None, places: Sequence[Place], status: Status, message: str) -> Finding:
    if position is not None and 1 <= position <= len(places):
        return places[position - 1].finding(Check.CHECKPOINT, status, message)
    return Finding(check=Check.CHECKPOINT, status=status, message=message, position=position)


def _unanswered(events: Sequence[JournalEvent | None]) -> set[str]:
    """The keys the journal asked a provider for whose outcome it never held (no receipt, or only unknown ones)."""
    asked = {e.key for e in events if isinstance(e, ActionRequested)}
    known = {e.key for e in events if isinstance(e, ActionCompleted) and e.status != OutcomeStatus.UNKNOWN}
    return asked - known
