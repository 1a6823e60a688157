"""The bundle's journal decided again by its agent's own code (`replay_check.divergences`), where that code is
installed here: a journal whose events the agent would not have decided was not written by the runtime."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
from collections.abc import Sequence

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.run_events import JournalEvent, RunStarted
from crashsafe.domain.registry import Registry
from crashsafe.evidence_findings import Check, Finding, Place, Status
from crashsafe.replay_check import divergences

# `package.module:function`, as CRASHSAFE_REGISTRY is written: nothing else is ever imported.
_SPEC = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


def installed_registry(spec: str) -> tuple[Registry | None, str]:
    """The registry a bundle names, if it is installed here; else None and why. A bundle is hostile input and the
    spec is part of it: only a module that is installed is imported, and only a registry, or a function that
    declares it returns one, is used (never `os:abort`)."""
    if not spec:
        return None, "the bundle names no registry"
    if not _SPEC.match(spec):
        return None, f"the bundle's registry {spec!r} is not written module:function"
    module_name, _, attribute = spec.partition(":")
    try:
        try:
            found = importlib.util.find_spec(module_name)
        except ModuleNotFoundError:
            found = None  # a parent package is not installed
        if found is None:
            return None, f"{module_name} is not installed here"
        factory = getattr(importlib.import_module(module_name), attribute, None)
        if isinstance(factory, Registry):
            return factory, ""
        if not callable(factory) or inspect.signature(factory).return_annotation not in (
            Registry,
            "Registry",
        ):
            return None, f"{spec} is not a registry"
        registry = factory()
    except Exception as exc:  # noqa: BLE001 -- an adopter's registry that breaks leaves replay unchecked, no more
        return None, f"registry {spec} could not be loaded ({type(exc).__name__}: {exc})"
    if not isinstance(registry, Registry):
        return None, f"{spec} gave a {type(registry).__name__}, not a Registry"
    return registry, ""


def read_replay(
    places: Sequence[Place], registry: Registry | None, spec: str, config: AgentConfig | None
) -> list[Finding]:
    """Each divergence a failure at its position; unchecked when the journal does not decode (the bundle check
    says where) or the agent's code is not installed here."""
    if not places or any(p.event is None or p.problem for p in places):
        return [
            _unchecked("the journal is not one run's events (see the bundle's failures): replay was skipped")
        ]
    events: list[JournalEvent] = [p.event for p in places if p.event is not None]
    first = events[0]
    if not isinstance(first, RunStarted):
        return [_unchecked("the journal does not open with run.started: replay was skipped")]
    why = ""
    if registry is None:
        registry, why = installed_registry(spec)
    agent = registry.agents.get(first.agent) if registry is not None else None
    if agent is None:
        why = why or f"its registry has no agent {first.agent!r}"
        return [_unchecked(f"agent {first.agent}'s code is not installed here ({why}): replay was not run")]
    try:
        found = divergences(events, agent, config)
    except Exception as exc:  # noqa: BLE001 -- the agent's code on a journal it never wrote: unchecked, named
        return [_unchecked(f"replaying with agent {first.agent}'s code raised {type(exc).__name__}: {exc}")]
    if not found:
        return [
            Finding(
                check=Check.REPLAY,
                status=Status.PASS,
                message=f"agent {first.agent}'s code decides every event of the journal again",
            )
        ]
    findings: list[Finding] = []
    for d in found:
        message = (
            f"journaled {d.journaled!r}, but agent {first.agent}'s code decides {d.decided!r} here: the runtime "
            "did not write this event as it stands, or this is not the code that ran"
        )
        if 1 <= d.position <= len(places):
            findings.append(places[d.position - 1].finding(Check.REPLAY, Status.FAIL, message))
        else:
            message = f"after the run's last event, {message}"
            findings.append(
                Finding(check=Check.REPLAY, status=Status.FAIL, message=message, position=d.position)
            )
    return findings


def _unchecked(message: str) -> Finding:
    return Finding(check=Check.REPLAY, status=Status.UNCHECKED, message=message)
