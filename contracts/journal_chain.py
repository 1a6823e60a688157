"""The hash chain of a run's journal: what each event's link commits to, so that a deleted, inserted, altered or
reordered event breaks the chain at a named position (issue 34; docs/evidence.md).

Every stored event has a hash, whoever wrote it: SHA-256 over a fixed prefix, the hash of the event before it in
its run, its position in the run (from 1), its subject within the namespace and its payload as stored. The writer
of an event (the runtime; an executor for the receipt it appends right after its intent) sends the previous
event's hash and the event's position in the `Crashsafe-Chain` header: a commitment to everything before it. The
hash is over what is stored, never over the link itself, so an event a release before the chain appended (no
link) is still covered by the next link and by the run's signed checkpoints.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

from crashsafe.contracts.headers import Header

# Domain separation: these bytes never mean anything else; another layout gets another prefix.
CHAIN_PREFIX = b"crashsafe.chain.v1\x00"
GENESIS = "0" * 64  # the hash "before" a run's first event
CHAIN_HEADER = Header.CHAIN.value


def entry_hash(prev: str, position: int, subject: str, payload: bytes) -> str:
    """The hash of the event stored at `position` of its run on `subject` (within the namespace) after `prev`."""
    name = subject.encode()
    return hashlib.sha256(
        b"".join(
            (
                CHAIN_PREFIX,
                bytes.fromhex(prev),
                position.to_bytes(8, "big"),
                len(name).to_bytes(2, "big"),
                name,
                payload,
            )
        )
    ).hexdigest()


def in_namespace(namespace: str, subject: str) -> str:
    """A journal subject as the chain hashes it: without its namespace (`run.<run_id>.step`)."""
    return subject.removeprefix(f"{namespace}.")


@dataclass(frozen=True, slots=True)
class Link:
    """What an event's writer committed to: its position in the run and the hash of the event before it."""

    position: int
    prev: str

    def header(self) -> str:
        return f"{self.position}:{self.prev}"


class BadLink(ValueError):
    """A `Crashsafe-Chain` header that is not `<position>:<64 hex digits>`."""


# A position fits the 8 bytes the hash gives it; a header claiming more is malformed, never an overflow.
MAX_POSITION = 2**63 - 1


_LINK = re.compile(r"([1-9][0-9]{0,18}):([0-9a-fA-F]{64})")


def parse_link(value: str) -> Link:
    """`<position>:<64 hex digits>`, ASCII only, the position at most MAX_POSITION; BadLink for anything else."""
    found = _LINK.fullmatch(value)
    if found is None or int(found[1]) > MAX_POSITION:
        raise BadLink(f"{CHAIN_HEADER} {value!r} is not <position>:<sha-256 in hex>")
    return Link(int(found[1]), found[2].lower())


def link_of(headers: dict[str, str] | None) -> Link | None:
    """The link a stored event carries (None: written without one, by a release before the chain)."""
    value = (headers or {}).get(CHAIN_HEADER)
    return None if value is None else parse_link(value)


@dataclass(frozen=True, slots=True)
class ChainHead:
    """A run's journal as far as it goes: how many events, and the hash of the last (GENESIS before any)."""

    position: int
    hash: str

    def link(self) -> Link:
        """The link of the next event appended after this head."""
        return Link(self.position + 1, self.hash)

    def after(self, subject: str, payload: bytes) -> ChainHead:
        """The head once the next event (`subject` within the namespace, `payload` as stored) is appended."""
        return ChainHead(self.position + 1, entry_hash(self.hash, self.position + 1, subject, payload))


START = ChainHead(0, GENESIS)


def head_of(events: Iterable[tuple[str, bytes]], start: ChainHead = START) -> ChainHead:
    """The head after `events` (each its subject within the namespace and its payload, in journal order)."""
    head = start
    for subject, payload in events:
        head = head.after(subject, payload)
    return head
