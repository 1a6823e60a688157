"""A run's evidence gathered from a deployment (issue 34): its journal as stored, the signed checkpoints that cover
it, the keys that signed, what each provider answers about each of its keys, the configuration it was pinned to.
The one home `crashsafe runs export --evidence`, the console's download and `crashsafe verify --live` call."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from crashsafe.contracts.capabilities import key_id
from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.checkpoints import (
    FIRST_PREV,
    CheckpointProof,
    checkpoint_decoder,
    proofs,
    root_holds,
    signature_holds,
    stored_hash,
)
from crashsafe.contracts.errors import CatalogRevisionGone
from crashsafe.contracts.evidence import (
    EvidenceBundle,
    ExportHeader,
    JournalEntry,
    ProviderAnswer,
    kept_headers,
)
from crashsafe.contracts.release import VERSION
from crashsafe.contracts.run_events import JournalEvent, RunStarted, decode_event
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.domain.registry import Registry
from crashsafe.services.operations.provider_audit import provider_view
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.jetstream_reads import StoredMessage
from crashsafe.services.records.run_catalog import RunCatalog
from crashsafe.services.records.run_journal import RunJournal

# Checkpoints are read from a little before the run started: a runtime's clock and the server's may differ.
CLOCK_SLACK = timedelta(seconds=30)
PAGE = 256


def public_key_text(key: Ed25519PublicKey) -> tuple[str, str]:
    """(key id, raw public key in base64url without padding): how a bundle names the keys that signed."""
    return key_id(key), base64.urlsafe_b64encode(key.public_bytes_raw()).rstrip(b"=").decode()


async def checkpoints_of(
    broker: Broker, ns: Namespace, run_id: str, since: datetime, events: int
) -> list[CheckpointProof]:
    """Every checkpoint of the run's heads from `since` on, until one covers its `events` events (or the stream
    ends): each as the run's proof in it."""
    stream = ns.stream(StreamKind.CHECKPOINTS)
    found: list[CheckpointProof] = []
    page = await broker.read_page_since(stream, ns.checkpoints, since - CLOCK_SLACK, PAGE)
    while page:
        for message in page:
            try:
                checkpoint = checkpoint_decoder.decode(message.data)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue  # not ours to judge here: `verify --live` names a checkpoint that does not decode
            if any(h.run_id == run_id for h in checkpoint.heads):
                proof = proofs(checkpoint, message.seq)[run_id]
                found.append(proof)
                if proof.head.position >= events:
                    return found
        page = await broker.read_page(stream, ns.checkpoints, after_seq=page[-1].seq, batch=PAGE)
    return found


async def pinned_header(
    broker: Broker,
    ns: Namespace,
    registry: Registry,
    registry_spec: str,
    run_id: str,
    first: JournalEvent | None,
) -> ExportHeader:
    """The configuration the run was pinned to (its catalog revision, read as the runtime reads it)."""
    revision = first.catalog_revision if isinstance(first, RunStarted) else 0
    config: AgentConfig | None = None
    if revision and isinstance(first, RunStarted):
        try:
            config = await RunCatalog(registry, broker, ns).pinned(revision, first.agent)
        except CatalogRevisionGone:
            config = None  # as the runtime does: it hands the run off and decides under the built-in config
    return ExportHeader(run_id=run_id, catalog_revision=revision, config=config, registry=registry_spec)


def _first(stored: list[StoredMessage]) -> JournalEvent | None:
    try:
        return decode_event(stored[0].data) if stored else None
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


async def gather(
    broker: Broker,
    ns: Namespace,
    registry: Registry,
    registry_spec: str,
    run_id: str,
    public_keys: list[Ed25519PublicKey],
    ask_providers: bool = True,
    known_proofs: list[CheckpointProof] | None = None,
) -> EvidenceBundle | None:
    """The run's evidence bundle (None: no such run, in the stream or the archive). `known_proofs`: every proof of
    the run from a walk of the whole checkpoint stream (`verify --live`), instead of those from its start on."""
    journal = RunJournal(broker, ns)
    stored = await journal.stored(run_id)
    if not stored:
        return None
    first = _first(stored)
    since = first.at if isinstance(first, RunStarted) else datetime.fromtimestamp(0, UTC)
    answers: list[ProviderAnswer] = []
    if ask_providers:
        events = [journal.event(m) for m in stored]
        for row in await provider_view(broker, ns, registry, events):
            reply = row.provider
            answers.append(
                ProviderAnswer(
                    key=row.request.key,
                    tool=row.request.tool,
                    family=row.request.family,
                    answer=reply.answer,
                    detail=reply.detail,
                    ref=reply.ref,
                    effect=reply.effect,
                )
            )
    return EvidenceBundle(
        run_id=run_id,
        namespace=ns.name,
        exported_at=datetime.now(UTC),
        release=VERSION,
        export=await pinned_header(broker, ns, registry, registry_spec, run_id, first),
        journal=[
            JournalEntry(seq=m.seq, subject=m.subject, data=m.data, headers=kept_headers(m.headers))
            for m in stored
        ],
        checkpoints=(
            known_proofs
            if known_proofs is not None
            else await checkpoints_of(broker, ns, run_id, since, len(stored))
        ),
        public_keys=dict(public_key_text(k) for k in public_keys),
        provider_answers=answers,
        providers_asked=ask_providers,
    )


@dataclass
class CheckpointWalk:
    """The whole checkpoint stream read once: each break in it, and every proof of every run it signed."""

    breaks: list[str] = field(default_factory=list)
    proofs: dict[str, list[CheckpointProof]] = field(default_factory=dict)
    checkpoints: int = 0


async def walk_checkpoints(broker: Broker, ns: Namespace, keys: Mapping[str, bytes]) -> CheckpointWalk:
    """Every checkpoint from the first: one that does not decode, is not signed by a key of this deployment, does
    not carry the heads its root and size sign, or does not name the stored hash of the one before it (a rewrite,
    a deletion, a fork) is a break; every head is kept as its run's proof, so a run is checked against every head
    ever signed for it, not only those a window around its `run.started` (which a rewrite could move) finds."""
    stream = ns.stream(StreamKind.CHECKPOINTS)
    walk = CheckpointWalk()
    prev, after = FIRST_PREV, 0
    while page := await broker.read_page(stream, ns.checkpoints, after_seq=after, batch=512):
        for message in page:
            after = message.seq
            walk.checkpoints += 1
            if _prev_of(message.data) != prev:
                walk.breaks.append(
                    f"checkpoint at seq {message.seq} does not name the stored hash of the one before it:"
                    " rewritten, deleted or forked before it"
                )
            prev = stored_hash(message.data)
            try:
                checkpoint = checkpoint_decoder.decode(message.data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                walk.breaks.append(f"checkpoint at seq {message.seq} does not decode ({exc})")
                continue
            if not signature_holds(checkpoint, keys):
                walk.breaks.append(
                    f"checkpoint at seq {message.seq}: signature does not hold under key {checkpoint.kid}"
                )
            elif not root_holds(checkpoint):
                walk.breaks.append(
                    f"checkpoint at seq {message.seq}: its heads are not the ones its root signs"
                )
            else:
                for run_id, proof in proofs(checkpoint, message.seq).items():
                    walk.proofs.setdefault(run_id, []).append(proof)
    return walk


class _Prev(msgspec.Struct):
    prev: str = ""


def _prev_of(data: bytes) -> str:
    try:
        return msgspec.json.decode(data, type=_Prev).prev
    except (msgspec.DecodeError, msgspec.ValidationError):
        return ""
