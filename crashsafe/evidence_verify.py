"""`crashsafe verify`'s pure core: one run's evidence bundle checked offline, every check a list of findings and
the findings a verdict. No broker, no files, no clock; hostile input becomes findings, never an exception."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import msgspec

from crashsafe.contracts.evidence import BUNDLE_FORMAT, BUNDLE_TYPE, EvidenceBundle, JournalEntry
from crashsafe.contracts.journal_bus import read_event
from crashsafe.contracts.journal_chain import Link, link_of
from crashsafe.contracts.run_events import JournalEvent, RunStarted
from crashsafe.contracts.subjects import Namespace, receipt_family
from crashsafe.domain.registry import Registry
from crashsafe.evidence_actions import read_capabilities, read_effects
from crashsafe.evidence_chain import ChainReading, read_chain, read_checkpoints
from crashsafe.evidence_findings import Check, Finding, Place, Status, Verification, verdict_of
from crashsafe.evidence_keys import SigningKeys
from crashsafe.evidence_replay import read_replay

# The chain hashes a position in 8 bytes: a link naming one past that is no writer's, and is refused as malformed.
MAX_POSITION = 2**64 - 1


def verify(
    bundle: EvidenceBundle, trusted: Mapping[str, bytes] | None = None, registry: Registry | None = None
) -> Verification:
    """Every check over `bundle`. `trusted`: key id -> raw Ed25519 public key, the only keys accepted (None: the
    bundle's own, said in an unchecked finding). `registry`: the agents to replay with (None: the registry the
    bundle names, if it is installed here)."""
    places = read_places(bundle)
    keys = SigningKeys(bundle.public_keys, trusted)
    findings = _guarded(Check.BUNDLE, lambda: read_bundle(bundle, places, keys))
    try:
        chain = read_chain(places, bundle.namespace)
    except Exception as exc:  # noqa: BLE001 -- hostile input the chain check did not foresee: a failure, named
        chain = ChainReading([_broken(Check.CHAIN, exc)], [], [], linked=True)
    findings += chain.findings
    pinned = trusted is not None
    findings += _guarded(
        Check.CHECKPOINT,
        lambda: read_checkpoints(bundle.checkpoints, places, chain, keys, bundle.run_id, pinned),
    )
    findings += _guarded(Check.CAPABILITY, lambda: read_capabilities(places, keys))
    findings += _guarded(
        Check.EFFECT, lambda: read_effects(places, bundle.provider_answers, bundle.providers_asked)
    )
    export = bundle.export
    findings += _guarded(Check.REPLAY, lambda: read_replay(places, registry, export.registry, export.config))
    return Verification(run_id=bundle.run_id, verdict=verdict_of(findings, chain.linked), findings=findings)


def read_places(bundle: EvidenceBundle) -> list[Place]:
    """Each journal entry decoded as the runtime reads it from its subject (a receipt taken only from its own
    family's subject, `journal_bus.read_event`), with why it is not an event of this run, and its link."""
    try:
        ns: Namespace | None = Namespace(bundle.namespace)
    except ValueError:
        ns = None  # said by `read_bundle`; every subject then fails to be this run's
    places: list[Place] = []
    for position, entry in enumerate(bundle.journal, start=1):
        event, problem = _event_of(entry, ns, bundle.run_id)
        link, bad_link = _link_of(entry)
        places.append(Place(position, entry, event, problem, link, bad_link))
    return places


def _event_of(entry: JournalEntry, ns: Namespace | None, run_id: str) -> tuple[JournalEvent | None, str]:
    try:
        event = read_event(entry.data, receipt_family(entry.subject))
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError) as exc:
        return None, f"its payload is not a run event ({exc})"
    if ns is None or ns.journal_run(entry.subject) != run_id:
        where = f"namespace {ns.name!r}" if ns is not None else "this bundle's (invalid) namespace"
        return event, f"its subject {entry.subject!r} is not a journal subject of run {run_id} in {where}"
    if event.run_id != run_id:
        return event, f"it is an event of run {event.run_id!r}, spliced into the journal of {run_id}"
    return event, ""


def _link_of(entry: JournalEntry) -> tuple[Link | None, str]:
    try:
        link = link_of(entry.headers)
    except (ValueError, TypeError, AttributeError) as exc:  # BadLink, or a position in no ASCII digits
        return None, str(exc) or type(exc).__name__
    if link is not None and link.position > MAX_POSITION:
        return None, f"it names position {link.position}, past any journal"
    return link, ""


def read_bundle(bundle: EvidenceBundle, places: Sequence[Place], keys: SigningKeys) -> list[Finding]:
    """The file is a bundle this verifier reads, of one run: its subjects, payloads, order and keys."""
    findings: list[Finding] = []

    def fail(message: str) -> None:
        findings.append(Finding(check=Check.BUNDLE, status=Status.FAIL, message=message))

    if bundle.type != BUNDLE_TYPE or bundle.format != BUNDLE_FORMAT:
        fail(
            f"a bundle of type {bundle.type!r}, format {bundle.format}: this verifier reads {BUNDLE_TYPE!r} "
            f"format {BUNDLE_FORMAT} (a newer crashsafe may read it)"
        )
    try:
        Namespace(bundle.namespace)
    except ValueError:
        fail(f"its namespace {bundle.namespace!r} is not a namespace")
    if bundle.export.run_id != bundle.run_id:
        fail(f"its export header is of run {bundle.export.run_id!r}, not {bundle.run_id!r}")
    if not places:
        fail("its journal holds no events: a run's journal opens with run.started")
    findings += keys.findings()
    last_seq = 0
    for place in places:
        if place.problem:
            findings.append(place.finding(Check.BUNDLE, Status.FAIL, f"{place.named()}: {place.problem}"))
        elif place.position == 1 and not isinstance(place.event, RunStarted):
            message = f"{place.named()} opens the journal, but a run's journal opens with run.started"
            findings.append(place.finding(Check.BUNDLE, Status.FAIL, message))
        elif place.entry.seq <= last_seq:
            message = (
                f"{place.named()} stands after seq {last_seq} on the stream: the journal's events are out of "
                "the order the stream stored them in"
            )
            findings.append(place.finding(Check.BUNDLE, Status.FAIL, message))
        else:
            findings.append(place.finding(Check.BUNDLE, Status.PASS, "an event of this run, in stream order"))
        last_seq = max(last_seq, place.entry.seq)
    return findings


def _guarded(check: Check, run: Callable[[], list[Finding]]) -> list[Finding]:
    """A check's findings; a check that raised over input it did not foresee is a failure, never a crash and never
    a pass (hostile input must not buy a better verdict by breaking a check)."""
    try:
        return run()
    except Exception as exc:  # noqa: BLE001 -- see the docstring: every exception becomes a named failure
        return [_broken(check, exc)]


def _broken(check: Check, exc: Exception) -> Finding:
    return Finding(
        check=check,
        status=Status.FAIL,
        message=f"the {check} check could not read this bundle ({type(exc).__name__}: {exc}): it is malformed "
        "and cannot be verified",
    )
