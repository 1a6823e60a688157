"""Which release this code is, and the releases before it: what a rolling upgrade must run beside.

A release N+1 reads everything release N writes and writes nothing N cannot read (docs/upgrading.md). Each
release names the oldest release it can run beside on one broker (`RUNS_BESIDE_SINCE`); a contracting step
(`crashsafe infra contract`) may run only once no process older than that is alive.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from crashsafe.contracts.headers import Header

# Bumped by every release (the changelog's newest heading says the same; tests/unit/test_release.py checks it).
VERSION = "0.5.0"
# The oldest release this one runs beside on one broker, forward and back: the rolling upgrade's window.
RUNS_BESIDE_SINCE = "0.4.0"
# What every service stamps on each message it publishes: the header's one home is `Header`.
VERSION_HEADER = Header.VERSION.value


@dataclass(frozen=True, slots=True)
class Release:
    """A published release: its version and the commit it was cut from (checked out by the version-skew test)."""

    version: str
    commit: str
    date: str
    notes: str = ""


def version_key(version: str) -> tuple[int, ...]:
    """`0.10.1` sorts after `0.9.3`; anything after a `-` or `+` (a pre-release, a build) is ignored."""
    core = version.split("-", 1)[0].split("+", 1)[0]
    return tuple(int(part) for part in core.split("."))


def releases() -> list[Release]:
    """The release record (contracts/releases.json), oldest first."""
    text = resources.files("crashsafe.contracts").joinpath("releases.json").read_text()
    items = json.loads(text)["releases"]
    return sorted((Release(**item) for item in items), key=lambda r: version_key(r.version))


def previous_release(current: str = VERSION) -> Release | None:
    """The newest recorded release older than `current`: what `current` must roll forward from and back to."""
    older = [r for r in releases() if version_key(r.version) < version_key(current)]
    return older[-1] if older else None
