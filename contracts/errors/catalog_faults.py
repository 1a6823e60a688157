"""Faults of the configuration catalog and of the agents it configures: an invalid catalog, a pinned revision
that left the bucket's history, an agent's own code that fails, a provider client's answer of a kind it may not
give."""

from __future__ import annotations

from dataclasses import field

from crashsafe.contracts.errors.crashsafe_error import CrashsafeError, ErrorCode, RetryClass


class InvalidCatalog(CrashsafeError):
    """A catalog that fails validation: refused at publish, and refused at reload (the last working one stays)."""

    code = ErrorCode.INVALID_CATALOG
    retry = RetryClass.POISON

    problems: list[str] = field(kw_only=False)
    revision: int | None = None

    def explain(self) -> str:
        at = f" (revision {self.revision})" if self.revision is not None else ""
        return (
            f"catalog{at} is invalid: {'; '.join(self.problems)}; fix it and check it with `crashsafe config"
            " validate`"
        )


class CatalogRevisionGone(CrashsafeError):
    """A run is pinned to a catalog revision the bucket no longer holds (more publishes than its history since
    the run started). Never answered with another revision: the run would change its rules half-way."""

    code = ErrorCode.CATALOG_REVISION_GONE
    retry = RetryClass.POISON

    revision: int
    agent: str
    run_id: str | None = None

    def explain(self) -> str:
        return (
            f"catalog revision {self.revision} (agent {self.agent}) is no longer in the catalog bucket's history;"
            " the run cannot go on under the rules it started with: hand it off (`crashsafe reconcile`) and"
            " publish less often than the bucket's history (docs/architecture.md, the catalog)"
        )


class AgentFault(CrashsafeError):
    """An agent's code (`prepare`, `compensations`, `script`) raised, answered something that is not what the
    runtime asks of it, or asked for a move that makes no progress (undo an effect already undone). Retrying
    cannot help (the agent is pure over the journal): the run is handed off with reason `agent_fault`."""

    code = ErrorCode.AGENT_FAULT
    retry = RetryClass.POISON

    agent: str
    hook: str
    problem: str

    def explain(self) -> str:
        return (
            f"agent {self.agent}'s {self.hook} {self.problem}; the run is handed to a person: fix the agent's code"
            " and redeploy (its journal replays as it stands)"
        )


class ProviderAnswerInvalid(CrashsafeError):
    """A `ProviderAnswer` built with a kind a provider client may not give: one of the executor's own (`replayed`,
    `conflict`, `republished`) or no answer at all. Raised where it is built, in the adopter's code: an exception
    there is read as an unknown outcome (asked about by key, never called blind), like any other."""

    code = ErrorCode.PROVIDER_ANSWER_INVALID

    kind: str
    allowed: list[str]

    def explain(self) -> str:
        return (
            f"a provider answer of kind {self.kind!r}: a provider client answers one of {', '.join(self.allowed)}"
            " (crashsafe.sdk.Answer; docs/providers.md, the five answers)"
        )


class ProjectionToolsUndeclared(CrashsafeError, ValueError):
    """An agent registered with projection tools its `projection_tools` does not name: the planner plans none of
    its projections of them, and the projector reads no journal of an agent that declares none, so they would
    be lost without a word (an agent ported from before the declaration existed declares none). Refused when the
    registry is built, so no service starts with it; a `ValueError` too, as the registry's other refusals are."""

    code = ErrorCode.INVALID_REGISTRY

    agent: str
    tools: list[str]

    def explain(self) -> str:
        named = ", ".join(self.tools)
        return (
            f"agent {self.agent!r} is registered with the projection tools {named}, which its projection_tools"
            f" does not name: its projections of them would never be planned. Declare them"
            f" (projection_tools = frozenset({{{', '.join(repr(t) for t in self.tools)}}})), or leave them out of"
            " its Registration's tools"
        )
