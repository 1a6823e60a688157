"""`crashsafe verify` against tampering: an intact bundle verifies, and each way of tampering with a run's evidence
(an edited, dropped, inserted, swapped or replaced event, altered intent args, a forged or missing checkpoint, a
truncated journal, a provider effect the journal does not account for) is caught and names the event it is about.

The bundles are built the way a deployment writes them (tests/support/evidence_builder.py) and, when it is there,
read from a real demo run (tests/fixtures/evidence/demo_run.json); every tamper runs against both."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crashsafe.contracts.capabilities import key_id
from crashsafe.contracts.checkpoints import CheckpointProof
from crashsafe.contracts.evidence import (
    EvidenceBundle,
    ExportHeader,
    JournalEntry,
    ProviderAnswer,
    bundle_decoder,
    bundle_encoder,
)
from crashsafe.contracts.journal_chain import CHAIN_HEADER, ChainHead, head_of, in_namespace
from crashsafe.contracts.keys import tool_input_hash
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    RunEvent,
    event_decoder,
    event_encoder,
)
from crashsafe.domain.registry import Registry
from crashsafe.evidence_findings import Check, Finding, Status, Verdict, Verification
from crashsafe.evidence_keys import unb64
from crashsafe.evidence_replay import installed_registry
from crashsafe.evidence_verify import verify
from crashsafe.services.agents import stayhub
from crashsafe.verify_command import verify_command
from tests.support import evidence_builder
from tests.support.evidence_builder import Runtime, b64, forged_checkpoint
from tests.support.paths import ROOT

DEMO = ROOT / "tests" / "fixtures" / "evidence" / "demo_run.json"
REGISTRY: Registry = stayhub()
RUNTIME = Runtime()
FORGER = Ed25519PrivateKey.generate()


@dataclass(frozen=True, slots=True)
class Source:
    """A bundle to tamper with, and the keys its verifier pins."""

    bundle: EvidenceBundle
    trusted: dict[str, bytes]


def _synthetic() -> Source:
    return Source(evidence_builder.bundle(RUNTIME), RUNTIME.trusted)


def _demo() -> Source:
    bundle = bundle_decoder.decode(DEMO.read_bytes())
    # The demo's runtime key is pinned as an operator pins theirs: the key it names, read once, trusted from then on.
    return Source(bundle, {kid: unb64(text) for kid, text in bundle.public_keys.items()})


SOURCES: dict[str, Callable[[], Source]] = {"synthetic": _synthetic}
if DEMO.exists():
    SOURCES["demo"] = _demo
_loaded: dict[str, Source] = {}


def source(name: str) -> Source:
    if name not in _loaded:
        _loaded[name] = SOURCES[name]()
    return _loaded[name]


def report(v: Verification) -> str:
    return "\n".join(f"{f.status} {f.check} @{f.position}: {f.message}" for f in v.problems())


# Editing a bundle as a forger would -----------------------------------------------------------------------------


def payload(b: EvidenceBundle, position: int) -> RunEvent:
    return event_decoder.decode(b.journal[position - 1].data)


def positions(b: EvidenceBundle, kind: type) -> list[int]:
    return [i for i in range(1, len(b.journal) + 1) if isinstance(payload(b, i), kind)]


def with_journal(b: EvidenceBundle, journal: list[JournalEntry]) -> EvidenceBundle:
    return msgspec.structs.replace(b, journal=journal)


def with_data(b: EvidenceBundle, position: int, data: bytes) -> EvidenceBundle:
    journal = list(b.journal)
    journal[position - 1] = msgspec.structs.replace(journal[position - 1], data=data)
    return with_journal(b, journal)


def with_event(b: EvidenceBundle, position: int, event: RunEvent) -> EvidenceBundle:
    return with_data(b, position, event_encoder.encode(event))


def one_byte_edited(data: bytes) -> bytes:
    """The event's time moved by one unit of its last digit: one byte, and still an event (a back-dated step)."""
    start = data.index(b'"at":"') + len(b'"at":"')
    end = data.index(b'"', start)
    at = end - 2 if data[end - 1 : end] == b"Z" else end - 1
    digit = data[at] - ord("0")
    return data[:at] + bytes([ord("0") + (digit + 1) % 10]) + data[at + 1 :]


def head_at(b: EvidenceBundle, upto: int) -> ChainHead:
    return head_of((in_namespace(b.namespace, e.subject), e.data) for e in b.journal[:upto])


def last_proof(b: EvidenceBundle) -> CheckpointProof:
    return max(b.checkpoints, key=lambda p: p.head.position)


def forged(b: EvidenceBundle, kid: str) -> EvidenceBundle:
    """The last event edited, and the last checkpoint replaced by one the forger signed over the edited journal
    under `kid`."""
    n = len(b.journal)
    b = with_data(b, n, one_byte_edited(b.journal[n - 1].data))
    proof = forged_checkpoint(FORGER, kid, b.run_id, head_at(b, n), last_proof(b).seq)
    return msgspec.structs.replace(b, checkpoints=[*(p for p in b.checkpoints if p != last_proof(b)), proof])


def forger_kid() -> str:
    return key_id(FORGER.public_key())


# The tampers: each gives the edited bundle and what must be found ------------------------------------------------

Expect = tuple[Check, Status, int | None, str]  # a finding that must be there: check, status, position, words
Tamper = Callable[[EvidenceBundle], tuple[EvidenceBundle, list[Expect]]]


def edit_middle(b: EvidenceBundle) -> tuple[EvidenceBundle, list[Expect]]:
    k = len(b.journal) // 2
    edited = with_data(b, k, one_byte_edited(b.journal[k - 1].data))
    return edited, [
        (Check.CHAIN, Status.FAIL, k, f"event {k} "),
        (Check.CHECKPOINT, Status.FAIL, k, f"breaks at event {k}"),
    ]


def edit_last(b: EvidenceBundle) -> tuple[EvidenceBundle, list[Expect]]:
    n = len(b.journal)
    edited = with_data(b, n, one_byte_edited(b.journal[n - 1].data))
    return edited, [(Check.CHECKPOINT, Status.FAIL, n, f"event {n} was altered")]


def drop_middle(b: EvidenceBundle) -> tuple[EvidenceBundle, list[Expect]]:
    k = len(b.journal) // 2
    dropped = with_journal(b, [e for i, e in enumerate(b.journal, 1) if i != k])
    return dropped, [(Check.CHAIN, Status.FAIL, k, "1 event before it was dropped")]


def insert_copy(b: EvidenceBundle) -> tuple[EvidenceBundle, list[Expect]]:
    """A receipt appended twice: its copy stands right after it."""
    k = positions(b, ActionCompleted)[0]
    journal = list(b.journal)
    journal.insert(k, b.journal[k - 1])
    return with_journal(b, journal), [(Check.CHAIN, Status.FAIL, k + 1, "inserted before it")]


def swap_adjacent(b: EvidenceBundle) -> tuple[EvidenceBundle, list[Expect]]:
    """Two events in each other's places, each keeping its stream sequence where it stood (the order looks right)."""
    k = len(b.journal) // 2
    journal = list(b.journal)
    first, second = journal[k - 1], journal[k]
    journal[k - 1] = msgspec.structs.replace(second, seq=first.seq)
    journal[k] = msgspec.structs.replace(first, seq=second.seq)
    return with_journal(b, journal), [(Check.CHAIN, Status.FAIL, k, "swapped")]


def replaced_receipt(change: dict[str, object]) -> Tamper:
    def tamper(b: EvidenceBundle) -> tuple[EvidenceBundle, list[Expect]]:
        k = positions(b, ActionCompleted)[-1]
        receipt = payload(b, k)
        assert isinstance(receipt, ActionCompleted)
        replaced = with_event(b, k, msgspec.structs.replace(receipt, **change))
        return replaced, [(Check.CHAIN, Status.FAIL, k, f"event {k} ")]

    return tamper


def altered_args(rehash: bool) -> Tamper:
    """The last intent's args changed after the runtime signed them (its input hash recomputed to match, or not)."""

    def tamper(b: EvidenceBundle) -> tuple[EvidenceBundle, list[Expect]]:
        k = positions(b, ActionRequested)[-1]
        intent = payload(b, k)
        assert isinstance(intent, ActionRequested)
        args = dict(intent.args)
        name = "amount_cents" if "amount_cents" in args else sorted(args)[0]
        args[name] = args[name] - 100 if isinstance(args[name], int) else f"{args[name]}x"
        new_hash = tool_input_hash(intent.tool, args) if rehash else intent.input_hash
        altered = with_event(b, k, msgspec.structs.replace(intent, args=args, input_hash=new_hash))
        says = "input_hash" if rehash else "altered after it was signed"
        return altered, [
            (Check.CAPABILITY, Status.FAIL, k, says),
            (Check.CHAIN, Status.FAIL, k, f"event {k} "),
        ]

    return tamper


def forged_keeping_kid(b: EvidenceBundle) -> tuple[EvidenceBundle, list[Expect]]:
    kid = last_proof(b).kid
    return forged(b, kid), [(Check.CHECKPOINT, Status.FAIL, None, "signature does not hold")]


def forged_with_own_key(b: EvidenceBundle) -> tuple[EvidenceBundle, list[Expect]]:
    """The forger's own key carried in the bundle beside the runtime's: caught only once keys are pinned."""
    b = forged(b, forger_kid())
    keys = {**b.public_keys, forger_kid(): b64(FORGER.public_key().public_bytes_raw())}
    edited = msgspec.structs.replace(b, public_keys=keys)
    return edited, [(Check.CHECKPOINT, Status.FAIL, None, "not among the trusted keys")]


def truncated(b: EvidenceBundle) -> tuple[EvidenceBundle, list[Expect]]:
    n = len(b.journal)
    cut = with_journal(b, b.journal[:-2])
    return cut, [(Check.CHECKPOINT, Status.FAIL, n, "2 events cut off at its end: the journal was truncated")]


def no_checkpoints(b: EvidenceBundle) -> tuple[EvidenceBundle, list[Expect]]:
    bare = msgspec.structs.replace(b, checkpoints=[])
    return bare, [(Check.CHECKPOINT, Status.UNCOVERED, 1, "no checkpoint covers this run")]


def unchained(b: EvidenceBundle) -> tuple[EvidenceBundle, list[Expect]]:
    """A journal as a release before the chain wrote it: no links, no checkpoints."""
    journal = [
        msgspec.structs.replace(e, headers={k: v for k, v in e.headers.items() if k != CHAIN_HEADER})
        for e in b.journal
    ]
    old = msgspec.structs.replace(with_journal(b, journal), checkpoints=[])
    return old, [(Check.CHAIN, Status.UNCHECKED, None, "before the hash chain")]


def effect_without_intent(b: EvidenceBundle) -> tuple[EvidenceBundle, list[Expect]]:
    extra = ProviderAnswer(
        key="charge:not-asked",
        tool="create_payment",
        family="payment",
        answer="found",
        ref="pay_extra",
        effect={"amount_cents": 99_000, "currency": "EUR"},
    )
    edited = msgspec.structs.replace(b, provider_answers=[*b.provider_answers, extra])
    return edited, [(Check.EFFECT, Status.FAIL, None, "no intent here asked for")]


def _answer_edited(
    b: EvidenceBundle,
    pick: Callable[[ProviderAnswer], bool],
    edit: Callable[[ProviderAnswer], ProviderAnswer],
) -> tuple[EvidenceBundle, ProviderAnswer]:
    chosen = next(a for a in b.provider_answers if pick(a))
    answers = [edit(a) if a is chosen else a for a in b.provider_answers]
    return msgspec.structs.replace(b, provider_answers=answers), chosen


def _position_of(b: EvidenceBundle, kind: type, key: str) -> int:
    return next(i for i in positions(b, kind) if payload(b, i).key == key)  # type: ignore[union-attr]


def effect_other_amount(b: EvidenceBundle) -> tuple[EvidenceBundle, list[Expect]]:
    def more(a: ProviderAnswer) -> ProviderAnswer:
        return msgspec.structs.replace(a, effect={**a.effect, "amount_cents": a.effect["amount_cents"] + 1})

    edited, chosen = _answer_edited(b, lambda a: "amount_cents" in a.effect, more)
    k = _position_of(b, ActionRequested, chosen.key)
    return edited, [(Check.EFFECT, Status.FAIL, k, "amount_cents")]


def effect_absent(b: EvidenceBundle) -> tuple[EvidenceBundle, list[Expect]]:
    def absent(a: ProviderAnswer) -> ProviderAnswer:
        return msgspec.structs.replace(a, answer="absent", effect={}, ref=None)

    edited, chosen = _answer_edited(b, lambda a: a.answer == "found", absent)
    k = _position_of(b, ActionCompleted, chosen.key)
    return edited, [(Check.EFFECT, Status.FAIL, k, "never saw the key")]


TAMPERS: dict[str, tuple[Tamper, Verdict]] = {
    "one byte of a middle event": (edit_middle, Verdict.TAMPERED),
    "one byte of the last event": (edit_last, Verdict.TAMPERED),
    "a middle event dropped": (drop_middle, Verdict.TAMPERED),
    "a receipt appended twice": (insert_copy, Verdict.TAMPERED),
    "two adjacent events swapped": (swap_adjacent, Verdict.TAMPERED),
    "a receipt replaced (another status)": (replaced_receipt({"status": "failed"}), Verdict.TAMPERED),
    "a receipt replaced (another ref)": (replaced_receipt({"provider_ref": "pay_forged"}), Verdict.TAMPERED),
    "an intent's args altered": (altered_args(rehash=False), Verdict.TAMPERED),
    "an intent's args and hash altered": (altered_args(rehash=True), Verdict.TAMPERED),
    "a checkpoint forged under the runtime's kid": (forged_keeping_kid, Verdict.TAMPERED),
    "a checkpoint forged with the forger's own key": (forged_with_own_key, Verdict.TAMPERED),
    "the journal truncated after its end": (truncated, Verdict.TAMPERED),
    "every checkpoint removed": (no_checkpoints, Verdict.INCOMPLETE),
    "links and checkpoints stripped (an old journal)": (unchained, Verdict.UNCHAINED),
    "a provider effect no intent asked for": (effect_without_intent, Verdict.TAMPERED),
    "a provider effect of another amount": (effect_other_amount, Verdict.TAMPERED),
    "a receipt's effect the provider never saw": (effect_absent, Verdict.TAMPERED),
}


def found(v: Verification, expect: Expect) -> Finding | None:
    check, status, position, words = expect
    return next(
        (
            f
            for f in v.findings
            if f.check == check and f.status == status and f.position == position and words in f.message
        ),
        None,
    )


# The tests -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SOURCES))
def test_an_intact_bundle_verifies(name: str) -> None:
    s = source(name)
    v = verify(s.bundle, s.trusted, REGISTRY)
    assert v.verdict == Verdict.VERIFIED, report(v)
    passed = v.passes()
    assert passed["chain"] == len(s.bundle.journal) and passed["replay"] == 1 and passed["capability"] >= 2
    assert not [f for f in v.findings if f.status in (Status.FAIL, Status.UNCOVERED)]


@pytest.mark.parametrize("name", list(SOURCES))
@pytest.mark.parametrize("tamper", list(TAMPERS))
def test_a_tamper_is_caught_and_names_its_event(name: str, tamper: str) -> None:
    edit, verdict = TAMPERS[tamper]
    edited, expected = edit(source(name).bundle)
    v = verify(edited, source(name).trusted, REGISTRY)
    assert v.verdict == verdict, report(v)
    missing = [e for e in expected if found(v, e) is None]
    assert not missing, f"expected {missing} among:\n{report(v)}"


@pytest.mark.parametrize("name", list(SOURCES))
def test_an_old_journal_is_unchained_never_tampered(name: str) -> None:
    old, _ = unchained(source(name).bundle)
    for trusted in (None, source(name).trusted):
        v = verify(old, trusted, REGISTRY)
        assert v.verdict == Verdict.UNCHAINED, report(v)
        assert not [f for f in v.findings if f.status in (Status.FAIL, Status.UNCOVERED)], report(v)


@pytest.mark.parametrize("name", list(SOURCES))
def test_a_journal_begun_by_an_older_release_verifies(name: str) -> None:
    """Its first events written without links (a run that went on across the upgrade): the first link and the
    checkpoints commit to them all the same, so an edit among them is still caught and named."""
    b = source(name).bundle
    journal = [
        msgspec.structs.replace(e, headers={}) if i <= 4 else e for i, e in enumerate(b.journal, start=1)
    ]
    upgraded = with_journal(b, journal)
    assert verify(upgraded, source(name).trusted, REGISTRY).verdict == Verdict.VERIFIED
    edited = with_data(upgraded, 2, one_byte_edited(upgraded.journal[1].data))
    v = verify(edited, source(name).trusted, REGISTRY)
    assert v.verdict == Verdict.TAMPERED
    chain = [
        (f.position, f.message) for f in v.findings if f.check == Check.CHAIN and f.status == Status.FAIL
    ]
    # Unlinked events are pinned no closer than the stretch the first link covers.
    assert [p for p, _ in chain] == [4] and "one of events 1 to 4" in chain[0][1], report(v)


@pytest.mark.parametrize("name", list(SOURCES))
def test_a_forger_carrying_their_own_key_passes_unless_keys_are_pinned(name: str) -> None:
    """The limit of a self-contained bundle, said in a finding: keys read from it are the forger's to choose."""
    edited, _ = forged_with_own_key(source(name).bundle)
    unpinned = verify(edited, None, REGISTRY)
    assert unpinned.verdict == Verdict.VERIFIED, report(unpinned)
    assert any("--trust" in f.message and f.status == Status.UNCHECKED for f in unpinned.findings)
    assert verify(edited, source(name).trusted, REGISTRY).verdict == Verdict.TAMPERED


@pytest.mark.parametrize("name", list(SOURCES))
def test_a_key_swapped_under_the_runtimes_kid_is_caught_without_pinning(name: str) -> None:
    b = source(name).bundle
    kid = last_proof(b).kid
    edited = msgspec.structs.replace(
        forged(b, kid), public_keys={kid: b64(FORGER.public_key().public_bytes_raw())}
    )
    v = verify(edited, None, REGISTRY)
    assert v.verdict == Verdict.TAMPERED
    assert any(f.check == Check.BUNDLE and "swapped" in f.message for f in v.findings), report(v)
    assert any(f.check == Check.CAPABILITY and f.status == Status.FAIL for f in v.findings), report(v)


def test_a_bundle_not_asked_of_providers_leaves_effects_unchecked() -> None:
    b = msgspec.structs.replace(source("synthetic").bundle, providers_asked=False, provider_answers=[])
    v = verify(b, RUNTIME.trusted, REGISTRY)
    assert v.verdict == Verdict.VERIFIED
    assert [f.status for f in v.findings if f.check == Check.EFFECT] == [Status.UNCHECKED]


def test_replay_resolves_the_bundles_registry_and_says_when_the_agent_is_not_installed() -> None:
    b = source("synthetic").bundle
    assert verify(b, RUNTIME.trusted).passes()["replay"] == 1  # the bundle's own registry, installed here
    elsewhere = msgspec.structs.replace(
        b, export=ExportHeader(run_id=b.run_id, registry="no_such_pkg.agents:hub")
    )
    (replay,) = [f for f in verify(elsewhere, RUNTIME.trusted).findings if f.check == Check.REPLAY]
    assert (
        replay.status == Status.UNCHECKED
        and "agent booking's" in replay.message
        and "not installed" in replay.message
    )
    assert installed_registry("os:abort") == (None, "os:abort is not a registry")  # never called


def test_replay_fails_a_journal_the_agents_code_would_not_have_written() -> None:
    """A hold for another hotel, re-signed and re-linked by someone holding the runtime's key: every signature
    holds, the chain holds, only the agent's own decision gives it away."""
    events = evidence_builder.driven_run()
    k = next(i for i, e in enumerate(events) if isinstance(e, ActionRequested) and e.tool == "create_booking")
    intent = events[k]
    assert isinstance(intent, ActionRequested)
    args = {**intent.args, "hotel_id": "lis-3"}
    events[k] = msgspec.structs.replace(intent, args=args, input_hash=tool_input_hash(intent.tool, args))
    entries, head = evidence_builder.journal(events, RUNTIME)
    b = source("synthetic").bundle
    proof = evidence_builder.checkpoint(RUNTIME.issuer, b.run_id, head, seq=9)
    resigned = msgspec.structs.replace(b, journal=entries, checkpoints=[proof], provider_answers=[])
    v = verify(resigned, RUNTIME.trusted, REGISTRY)
    assert v.verdict == Verdict.TAMPERED
    assert [(f.check, f.position) for f in v.findings if f.status == Status.FAIL] == [(Check.REPLAY, k + 1)]


# Hostile input: findings, never an exception -------------------------------------------------------------------


def _entry(b: EvidenceBundle, position: int, **change: object) -> EvidenceBundle:
    journal = list(b.journal)
    journal[position - 1] = msgspec.structs.replace(journal[position - 1], **change)
    return with_journal(b, journal)


def _link(value: str) -> dict[str, str]:
    return {CHAIN_HEADER: value}


def _hostile_proof(b: EvidenceBundle) -> EvidenceBundle:
    proof = msgspec.structs.replace(
        last_proof(b), path=["zz", "q:00", "l:not-hex"], sig="!!!", signed_at=datetime(2026, 1, 1)
    )
    return msgspec.structs.replace(b, checkpoints=[proof])


def _naive_capability(b: EvidenceBundle) -> EvidenceBundle:
    k = positions(b, ActionRequested)[-1]
    intent = payload(b, k)
    assert isinstance(intent, ActionRequested) and intent.capability is not None
    cap = msgspec.structs.replace(intent.capability, expires_at=datetime(2030, 1, 1), sig="%%")
    return with_event(b, k, msgspec.structs.replace(intent, capability=cap))


HOSTILE: dict[str, Callable[[EvidenceBundle], EvidenceBundle]] = {
    "bytes that are not JSON": lambda b: _entry(b, 3, data=b"\x00\xff{not json"),
    "an event missing its fields": lambda b: _entry(b, 2, data=b'{"type":"run.model_answered"}'),
    "a subject outside the journal": lambda b: _entry(b, 2, subject="evil.run.x.step"),
    "another run's subject": lambda b: _entry(
        b, 2, subject=b.journal[1].subject.replace(b.run_id, "run_" + "f" * 24)
    ),
    "a link that is not one": lambda b: _entry(b, 4, headers=_link("abc")),
    "a link past any position": lambda b: _entry(b, 4, headers=_link("9" * 30 + ":" + "0" * 64)),
    "a link in superscript digits": lambda b: _entry(b, 4, headers=_link("\u00b2:" + "0" * 64)),
    "a garbage public key": lambda b: msgspec.structs.replace(
        b, public_keys={last_proof(b).kid: "@@not-base64"}
    ),
    "a garbage checkpoint proof": _hostile_proof,
    "a capability without a time zone": _naive_capability,
    "no events at all": lambda b: with_journal(b, []),
    "a namespace that is not one": lambda b: msgspec.structs.replace(b, namespace="Not A Namespace!"),
    "a bundle of another format": lambda b: msgspec.structs.replace(b, format=99),
    "the first event not run.started": lambda b: with_journal(b, b.journal[1:]),
}


@pytest.mark.parametrize("hostile", list(HOSTILE))
def test_a_hostile_bundle_becomes_findings_never_an_exception(hostile: str) -> None:
    edited = HOSTILE[hostile](source("synthetic").bundle)
    for trusted in (None, RUNTIME.trusted):
        v = verify(edited, trusted, REGISTRY)
        assert v.verdict == Verdict.TAMPERED, report(v)
        assert all(f.message for f in v.findings)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_one_byte_changed_anywhere_is_never_verified(data: st.DataObject) -> None:
    b = source("synthetic").bundle
    position = data.draw(st.integers(1, len(b.journal)), label="position")
    raw = b.journal[position - 1].data
    at = data.draw(st.integers(0, len(raw) - 1), label="byte")
    value = data.draw(st.integers(0, 255).filter(lambda v: v != raw[at]), label="value")
    edited = with_data(b, position, raw[:at] + bytes([value]) + raw[at + 1 :])
    v = verify(edited, RUNTIME.trusted, REGISTRY)
    assert v.verdict == Verdict.TAMPERED, report(v)


entries = st.builds(
    JournalEntry,
    seq=st.integers(-5, 2**70),
    subject=st.text(max_size=60),
    data=st.binary(max_size=80) | st.just(b'{"type":"run.started","run_id":"x","at":"2026-01-01T00:00:00Z"}'),
    headers=st.dictionaries(st.sampled_from([CHAIN_HEADER, "Crashsafe-Version", "x"]), st.text(max_size=80)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(entries, max_size=6), st.dictionaries(st.text(max_size=20), st.text(max_size=50), max_size=2))
def test_a_journal_of_garbage_never_raises(journal: list[JournalEntry], keys: dict[str, str]) -> None:
    b = msgspec.structs.replace(source("synthetic").bundle, journal=journal, public_keys=keys)
    verify(b, None, REGISTRY)  # any verdict, but an answer


# The command ---------------------------------------------------------------------------------------------------


def _pem(tmp_path: Path, name: str, public: object) -> Path:
    path = tmp_path / name
    path.write_bytes(public.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))  # type: ignore[attr-defined]
    return path


def _file(tmp_path: Path, b: EvidenceBundle) -> Path:
    path = tmp_path / "bundle.json"
    path.write_bytes(bundle_encoder.encode(b))
    return path


@pytest.mark.parametrize(
    ("tamper", "code", "says"),
    [
        (None, 0, "verdict: verified"),
        ("one byte of a middle event", 1, "verdict: tampered"),
        ("every checkpoint removed", 3, "verdict: incomplete"),
        ("links and checkpoints stripped (an old journal)", 4, "verdict: unchained"),
    ],
)
def test_the_command_exits_by_the_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tamper: str | None, code: int, says: str
) -> None:
    b = source("synthetic").bundle
    if tamper is not None:
        b, _ = TAMPERS[tamper][0](b)
    trust = _pem(tmp_path, "runtime.pub", RUNTIME.private.public_key())
    assert verify_command(_file(tmp_path, b), [trust], as_json=False) == code
    out = capsys.readouterr().out
    assert says in out and "passed: bundle" in out
    if code == 1:
        k = len(b.journal) // 2
        assert f"fail      chain      position {k} (seq" in out


def test_the_command_speaks_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert verify_command(_file(tmp_path, source("synthetic").bundle), [], as_json=True) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["verdict"] == "verified" and body["exit"] == 0 and body["passed"]["replay"] == 1
    unchecked = [f for f in body["findings"] if f["status"] == "unchecked" and f["check"] == "checkpoint"]
    assert len(unchecked) == 1 and "--trust" in unchecked[0]["message"]


def _export_file(tmp_path: Path) -> Path:
    path = tmp_path / "run.jsonl"
    path.write_bytes(b'{"type":"crashsafe.export","format":1,"run_id":"run_x"}\n{"type":"run.started"}\n')
    return path


def _other_format(tmp_path: Path) -> Path:
    path = tmp_path / "future.json"
    path.write_bytes(msgspec.json.encode({"type": "crashsafe.evidence", "format": 2, "run_id": "r"}))
    return path


def _text(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("hello\n")
    return path


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: p / "missing.json", "cannot be read"),
        (_text, "not an evidence bundle"),
        (_export_file, "a run export"),
        (_other_format, "format 2"),
    ],
)
def test_a_file_that_is_no_bundle_exits_2_naming_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Callable[[Path], Path], says: str
) -> None:
    assert verify_command(make(tmp_path), [], as_json=False) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("ec", "not an Ed25519 public key"),
        ("garbage", "not a public key in PEM"),
        ("missing", "cannot be read"),
    ],
)
def test_a_trusted_key_that_is_no_ed25519_key_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, says: str
) -> None:
    if key == "ec":
        pem = _pem(tmp_path, "ec.pub", ec.generate_private_key(ec.SECP256R1()).public_key())
    else:
        pem = tmp_path / "key.pem"
        if key == "garbage":
            pem.write_text("-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n")
    assert verify_command(_file(tmp_path, source("synthetic").bundle), [pem], as_json=False) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("name", list(SOURCES))
def test_a_bundle_cut_back_to_before_the_runs_end_is_never_verified(name: str) -> None:
    """Events dropped from the end together with the checkpoints over them: what is left is a run that looks still
    going. Nothing in the bundle contradicts it, so it is incomplete, naming where the journal stops; never
    verified."""
    s = source(name)
    kept = len(s.bundle.journal) // 2
    # A careful forger drops the provider answers about what was cut too (else: tampered, an effect unasked for).
    keys = {getattr(payload(s.bundle, i), "key", None) for i in range(1, kept + 1)}
    cut = msgspec.structs.replace(
        s.bundle,
        journal=s.bundle.journal[:kept],
        checkpoints=[p for p in s.bundle.checkpoints if p.head.position <= kept],
        provider_answers=[a for a in s.bundle.provider_answers if a.key in keys],
    )
    v = verify(cut, s.trusted, REGISTRY)
    assert v.verdict == Verdict.INCOMPLETE, report(v)
    assert any(f.position == kept and "before the run did" in f.message for f in v.problems()), report(v)
