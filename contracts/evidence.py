"""The evidence bundle (issue 34; docs/evidence.md) and the export header: files outsiders read. A bundle is one
file holding everything an outsider needs to check one run without our broker, our credentials or our word:
`crashsafe runs export --evidence` writes it, `crashsafe verify` checks it offline (crashsafe/evidence_verify.py).

Format (JSON, one object): the run's journal as stored (each event's stream sequence, subject, payload bytes in
base64 and the headers that carry meaning: its chain link, the release that wrote it), the signed checkpoints that
cover the run (each with the run's leaf and its path to the signed root), the public keys that signed them and the
capabilities, what each provider answers about each of the run's keys when the bundle was made, and the
configuration the run was pinned to (the export header `crashsafe replay --file` reads)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.checkpoints import CheckpointProof
from crashsafe.contracts.headers import Header

EXPORT_TYPE = "crashsafe.export"


EXPORT_FORMAT = 1


class ExportHeader(msgspec.Struct, frozen=True, kw_only=True):
    """The first line of an export: what replaying the run needs besides its events."""

    type: str = EXPORT_TYPE
    format: int = EXPORT_FORMAT
    run_id: str
    catalog_revision: int = 0
    config: AgentConfig | None = None  # None: the agent's built-in configuration
    registry: str = ""  # the deployment's CRASHSAFE_REGISTRY (which agents' code decided), "" if not known


BUNDLE_TYPE = "crashsafe.evidence"
BUNDLE_FORMAT = 1
# The stored headers a bundle keeps: what the chain and the release record say. Trace context and the server's own
# headers mean nothing to a verifier.
KEPT_HEADERS = (Header.CHAIN.value, Header.VERSION.value, Header.FOLLOWS.value, Header.RUN_ENDED.value)


class JournalEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One event as the RUNS stream stores it: `data` byte for byte (base64 in the file)."""

    seq: int
    subject: str
    data: bytes
    headers: dict[str, str] = {}


class ProviderAnswer(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a provider answered, when the bundle was made, about one key the run journaled an intent for
    (`contracts.provider_view`): found (with the effect it holds), absent, unknown, no_lookup or no_answer."""

    key: str
    tool: str
    family: str
    answer: str
    detail: str = ""
    ref: str | None = None
    effect: dict[str, Any] = {}


class EvidenceBundle(msgspec.Struct, frozen=True, kw_only=True):
    type: str = BUNDLE_TYPE
    format: int = BUNDLE_FORMAT
    run_id: str
    namespace: str
    exported_at: datetime
    release: str  # the release of the code that made the bundle
    export: ExportHeader  # the catalog revision and configuration the run was pinned to, and its registry
    journal: list[JournalEntry]
    checkpoints: list[CheckpointProof] = []
    public_keys: dict[str, str] = {}  # key id -> raw Ed25519 public key (base64url, no padding)
    provider_answers: list[ProviderAnswer] = []
    # False: the bundle was made without asking the providers (`--no-providers`): effects go unchecked.
    providers_asked: bool = True


bundle_encoder = msgspec.json.Encoder(order="sorted")
bundle_decoder = msgspec.json.Decoder(EvidenceBundle)


def kept_headers(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k in KEPT_HEADERS}
