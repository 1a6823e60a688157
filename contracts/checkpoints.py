"""Signed checkpoints of run heads: one Ed25519 signature over the Merkle root of many runs' heads, each checkpoint
chained to the one before it on a stream of its own (issue 34; docs/evidence.md).

A run's head (its id, the position of its last event, that event's chain hash) is a leaf; a checkpoint names the
root of the tree over a batch of leaves (RFC 6962's hashing: a leaf and a node hash under different prefixes, so
one can never pose as the other), the hash of the checkpoint before it, its key and its time, and signs them. A
run's evidence carries the checkpoint's signed fields, its own leaf and the path from it to the root: never the
other runs of the batch.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

import msgspec
import nacl.exceptions
import nacl.signing

from crashsafe.contracts.journal_chain import GENESIS

SIGNED_PREFIX = b"crashsafe.checkpoint.v1\x00"
_LEAF, _NODE = b"\x00", b"\x01"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class RunHead(msgspec.Struct, frozen=True, array_like=True):
    """A run's journal as a checkpoint saw it: [run id, position of its last event, that event's chain hash]."""

    run_id: str
    position: int
    head: str


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="checkpoint"):
    """A batch of run heads under one signature, on `<ns>.checkpoint.runs`, each after the one before it there."""

    kid: str  # the runtime key that signed (`capabilities.key_id`)
    signed_at: datetime
    prev: str  # `stored_hash` of the checkpoint before it on the stream (GENESIS for the first)
    root: str  # Merkle root over `heads`, hex
    size: int  # how many heads
    sig: str  # Ed25519 over `signed_bytes` (base64url, no padding)
    heads: list[RunHead] = []


class CheckpointProof(msgspec.Struct, frozen=True, kw_only=True):
    """One run's share of a checkpoint: its signed fields, the run's leaf and the path from the leaf to the root
    (each step `l:<hex>` or `r:<hex>`, the sibling's side). `seq`: where the checkpoint stands on its stream."""

    seq: int
    kid: str
    signed_at: datetime
    prev: str
    root: str
    size: int
    sig: str
    head: RunHead
    path: list[str]


_encoder = msgspec.json.Encoder()


def _micros(at: datetime) -> int:
    return (at - _EPOCH) // timedelta(microseconds=1)


def signed_bytes(kid: str, signed_at: datetime, prev: str, root: str, size: int) -> bytes:
    """What the signature covers: the prefix, then a JSON array of the signed fields in this fixed order."""
    return SIGNED_PREFIX + _encoder.encode((kid, _micros(signed_at), prev, root, size))


def stored_hash(data: bytes) -> str:
    """What the next checkpoint names as `prev`: SHA-256 of the checkpoint as the stream stores it (its bytes, not
    its fields, so a checkpoint a later release writes with more fields, or one that does not decode, still
    chains)."""
    return hashlib.sha256(data).hexdigest()


def leaf_hash(head: RunHead) -> bytes:
    return hashlib.sha256(_LEAF + _encoder.encode(head)).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(_NODE + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two below `n` (RFC 6962: the left subtree is complete)."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaves[0]
    k = _split(len(leaves))
    return _node(merkle_root(leaves[:k]), merkle_root(leaves[k:]))


def inclusion_path(leaves: Sequence[bytes], index: int) -> list[str]:
    """The siblings from leaf `index` up to the root, nearest first."""
    if len(leaves) <= 1:
        return []
    k = _split(len(leaves))
    if index < k:
        return [*inclusion_path(leaves[:k], index), "r:" + merkle_root(leaves[k:]).hex()]
    return [*inclusion_path(leaves[k:], index - k), "l:" + merkle_root(leaves[:k]).hex()]


def root_from_path(leaf: bytes, path: Sequence[str]) -> bytes:
    """The root a leaf and its path lead to; ValueError for a path that is not `l:`/`r:` hex steps."""
    node = leaf
    for step in path:
        side, _, sibling = step.partition(":")
        other = bytes.fromhex(sibling)
        if side == "l":
            node = _node(other, node)
        elif side == "r":
            node = _node(node, other)
        else:
            raise ValueError(f"a path step is l:<hex> or r:<hex>, not {step!r}")
    return node


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign(
    key: nacl.signing.SigningKey, kid: str, heads: Sequence[RunHead], prev: str, now: datetime
) -> Checkpoint:
    """A checkpoint over `heads`, after the checkpoint whose hash is `prev`."""
    root = merkle_root([leaf_hash(h) for h in heads]).hex()
    signature = key.sign(signed_bytes(kid, now, prev, root, len(heads))).signature
    return Checkpoint(
        kid=kid, signed_at=now, prev=prev, root=root, size=len(heads), sig=_b64(signature), heads=list(heads)
    )


def proofs(checkpoint: Checkpoint, seq: int) -> dict[str, CheckpointProof]:
    """Each run's proof in `checkpoint` (stored at `seq`), by run id (a run twice in one batch: its last head)."""
    leaves = [leaf_hash(h) for h in checkpoint.heads]
    c = checkpoint
    return {
        head.run_id: CheckpointProof(
            seq=seq,
            kid=c.kid,
            signed_at=c.signed_at,
            prev=c.prev,
            root=c.root,
            size=c.size,
            sig=c.sig,
            head=head,
            path=inclusion_path(leaves, i),
        )
        for i, head in enumerate(c.heads)
    }


def root_holds(checkpoint: Checkpoint) -> bool:
    """Whether the signed root and size are those of the heads it carries."""
    leaves = [leaf_hash(h) for h in checkpoint.heads]
    return checkpoint.size == len(leaves) and merkle_root(leaves).hex() == checkpoint.root


def signature_holds(proof: CheckpointProof | Checkpoint, public_keys: Mapping[str, bytes]) -> bool:
    """Whether the signature verifies under the raw Ed25519 public key its `kid` names in `public_keys`."""
    raw = public_keys.get(proof.kid)
    if raw is None:
        return False
    try:
        nacl.signing.VerifyKey(raw).verify(
            signed_bytes(proof.kid, proof.signed_at, proof.prev, proof.root, proof.size), _unb64(proof.sig)
        )
    except (nacl.exceptions.CryptoError, ValueError, TypeError, binascii.Error):
        return False
    return True


def proof_holds(proof: CheckpointProof) -> bool:
    """Whether the run's leaf and path lead to the signed root."""
    try:
        return root_from_path(leaf_hash(proof.head), proof.path).hex() == proof.root
    except ValueError:
        return False


checkpoint_encoder = msgspec.json.Encoder()
checkpoint_decoder = msgspec.json.Decoder(Checkpoint)
FIRST_PREV = GENESIS
