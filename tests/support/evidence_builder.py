"""Evidence bundles built the way a deployment writes them, for the verifier's tests: a booking run driven through
the runtime's own decisions, each intent signed by a real runtime key and journaled on its executor's subject, each
receipt on its family's, every event linked as its writer links it, and signed checkpoints over the run's heads."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import nacl.signing
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from crashsafe.contracts import checkpoints
from crashsafe.contracts.capabilities import CapabilityIssuer
from crashsafe.contracts.checkpoints import FIRST_PREV, CheckpointProof, RunHead, proofs, stored_hash
from crashsafe.contracts.evidence import EvidenceBundle, ExportHeader, JournalEntry, ProviderAnswer
from crashsafe.contracts.headers import Header
from crashsafe.contracts.journal_bus import request_for
from crashsafe.contracts.journal_chain import CHAIN_HEADER, START, ChainHead, head_of, in_namespace
from crashsafe.contracts.keys import partition_of
from crashsafe.contracts.provider_view import NO_LOOKUP
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    RunEvent,
    RunStarted,
    event_class,
    event_encoder,
    event_type,
)
from crashsafe.contracts.subjects import DEFAULT_ACTION_PARTITIONS, Namespace
from crashsafe.domain.authority import terms_for
from tests.support.runs import booking_model, drive, started

NS = Namespace("evidence")
REGISTRY_SPEC = "crashsafe.services.agents:stayhub"
RELEASE = "0.5.0"
# Tools whose provider cannot be asked by key (the sandbox's search): answered `no_lookup`.
NOT_LOOKED_UP = frozenset({"search_hotels"})
_ref_fields = {"create_booking": "booking_id", "create_payment": "payment_id"}


class Runtime:
    """A runtime's signing key: what signs the run's capabilities and checkpoints (and what `--trust` pins)."""

    def __init__(self) -> None:
        self.private = Ed25519PrivateKey.generate()
        self.issuer = CapabilityIssuer(self.private)
        self.kid = self.issuer.kid
        self.raw = self.private.public_key().public_bytes_raw()

    @property
    def trusted(self) -> dict[str, bytes]:
        return {self.kid: self.raw}

    @property
    def public_text(self) -> str:
        return b64(self.raw)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def driven_run() -> list[RunEvent]:
    """A booking run to its end through `next_move` (search, hold, pay, reply): 12 events."""
    return list(drive(started(), booking_model, lambda request: "succeeded").events)


def journal(
    events: list[RunEvent], runtime: Runtime, ns: Namespace = NS
) -> tuple[list[JournalEntry], ChainHead]:
    """The events as the RUNS stream stores them: an intent signed and on its executor's subject, its receipt on its
    family's (appended by the executor right after it), every other event on its class's; each linked."""
    first = events[0]
    assert isinstance(first, RunStarted)
    head, seq = START, 40
    entries: list[JournalEntry] = []
    intents: dict[str, ActionRequested] = {}
    for event in events:
        headers = {Header.VERSION.value: RELEASE, CHAIN_HEADER: head.link().header()}
        if isinstance(event, ActionRequested):
            terms = terms_for(event, event.at)
            granted = runtime.issuer.grant(request_for(event), terms.origin, terms.expires_at, first.agent)
            event = msgspec.structs.replace(event, capability=granted.capability)
            partition = partition_of(event.key, DEFAULT_ACTION_PARTITIONS)
            subject = ns.run_intent(event.run_id, event.family, partition)
            intents[event.key] = event
        elif isinstance(event, ActionCompleted):
            intent = intents[event.key]
            event = msgspec.structs.replace(event, tool=intent.tool, family=intent.family)
            subject = ns.run_receipt(event.run_id, intent.family)
            headers[Header.FOLLOWS.value] = str(seq - 1)
        else:
            subject = ns.run_event(event.run_id, event_class(event_type(event), after_end=False))
        payload = event_encoder.encode(event)
        entries.append(JournalEntry(seq=seq, subject=subject, data=payload, headers=headers))
        head = head.after(in_namespace(ns.name, subject), payload)
        # Other runs' events stand between a run's own on the stream; a receipt right after its intent.
        seq += 1 if isinstance(event, ActionRequested) else 3
    return entries, head


def checkpoint(
    issuer: CapabilityIssuer, run_id: str, head: ChainHead, seq: int, prev: str = FIRST_PREV
) -> CheckpointProof:
    """The run's proof in a checkpoint of a batch of three runs' heads (so its path is not empty)."""
    others = [RunHead(f"run_{n:024x}", 4, f"{n:064x}") for n in (1, 2)]
    signed = issuer.checkpoint(
        [others[0], RunHead(run_id, head.position, head.hash), others[1]], prev, _now()
    )
    return proofs(signed, seq)[run_id]


def forged_checkpoint(
    forger: Ed25519PrivateKey, kid: str, run_id: str, head: ChainHead, seq: int
) -> CheckpointProof:
    """A checkpoint a forger signs with their own key under any key id they choose."""
    key = nacl.signing.SigningKey(forger.private_bytes_raw())
    signed = checkpoints.sign(key, kid, [RunHead(run_id, head.position, head.hash)], FIRST_PREV, _now())
    return proofs(signed, seq)[run_id]


def _now() -> datetime:
    return datetime(2026, 12, 1, 9, 5, tzinfo=UTC)


def answers(entries: list[JournalEntry]) -> list[ProviderAnswer]:
    """What the providers hold for each intent's key, as the sandbox answers a lookup: the receipt's record."""
    found: list[ProviderAnswer] = []
    receipts: dict[str, dict[str, Any]] = {}
    decoded = [msgspec.json.decode(e.data) for e in entries]
    for d in decoded:
        if d["type"] == "run.action_completed":
            receipts[d["key"]] = d
    for d in decoded:
        if d["type"] != "run.action_requested":
            continue
        if d["tool"] in NOT_LOOKED_UP:
            found.append(
                ProviderAnswer(
                    key=d["key"], tool=d["tool"], family=d["family"], answer=NO_LOOKUP, detail="no lookup"
                )
            )
            continue
        receipt = receipts[d["key"]]
        found.append(
            ProviderAnswer(
                key=d["key"],
                tool=d["tool"],
                family=d["family"],
                answer="found",
                ref=receipt["provider_ref"],
                effect={**receipt["result"], "key": d["key"]},
            )
        )
    return found


def bundle(runtime: Runtime) -> EvidenceBundle:
    """The intact bundle of a driven booking run: two checkpoints (mid-run and at its end), the provider answers."""
    events = driven_run()
    entries, head = journal(events, runtime)
    run_id = events[0].run_id
    mid_head = head_of((in_namespace(NS.name, e.subject), e.data) for e in entries[:6])
    first = checkpoint(runtime.issuer, run_id, mid_head, seq=5)
    last = checkpoint(
        runtime.issuer, run_id, head, seq=9, prev=stored_hash(msgspec.json.encode(first))
    )  # its stored bytes, as near as a proof has them
    return EvidenceBundle(
        run_id=run_id,
        namespace=NS.name,
        exported_at=events[-1].at + timedelta(minutes=5),
        release=RELEASE,
        export=ExportHeader(run_id=run_id, registry=REGISTRY_SPEC),
        journal=entries,
        checkpoints=[first, last],
        public_keys={runtime.kid: runtime.public_text},
        provider_answers=answers(entries),
    )
