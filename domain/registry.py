"""The deployment's agents and tools as one value a composition root builds and passes to every service. Pure."""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from crashsafe.contracts.audit import Finding, Intent
from crashsafe.contracts.errors import ProjectionToolsUndeclared, UnknownAgent
from crashsafe.contracts.projections import RetryPolicy
from crashsafe.contracts.provider_settings import DEFAULT_PROVIDER, PROVIDER_NAME, ProviderSettings
from crashsafe.contracts.streams import KvSpec
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.synthetic_turn import SYNTHETIC_AGENT
from crashsafe.contracts.tools import ToolContract
from crashsafe.domain.agent import Agent, AgentBase
from crashsafe.domain.probe import Probe, ProbeAgent, probe_agent

# What a provider is asked and answers lives beside this module; these names are read from here too.
from crashsafe.domain.provider_clients import LegacyProviderClient as LegacyProviderClient
from crashsafe.domain.provider_clients import ListingClient as ListingClient
from crashsafe.domain.provider_clients import ProviderAnswer as ProviderAnswer
from crashsafe.domain.provider_clients import ProviderCall as ProviderCall
from crashsafe.domain.provider_clients import ProviderClient as ProviderClient


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One request to a provider, as a tool's operation builds it from the action's arguments."""

    method: str
    path: str
    json: dict[str, Any] | None = None
    params: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class HttpOperation:
    """How a tool's effect is asked of its provider over HTTP, and how the provider is asked about a key."""

    request: Callable[[dict[str, Any]], HttpRequest]
    # The provider's "what happened to key K?" endpoint, `{key}` filled in; None: nothing to ask by key.
    lookup_path: str | None
    # The field of the provider's answer that names the effect (`payment_id`, `order_id` …).
    ref_field: str | None
    # Arguments the call cannot be made without: checked before any intent is committed.
    requires: tuple[str, ...] = ()
    # How the provider's answers are read. A record is read by its own status: `failed_statuses` mean the
    # provider refused it (a declined charge), `pending_statuses` that it has not decided yet.
    status_field: str = "status"
    failed_statuses: frozenset[str] = frozenset()
    pending_statuses: frozenset[str] = frozenset()
    # The provider's typed error codes for "no write was made with this key" (the only answer read as absent)
    # and for "a request with this key is still in progress" (unknown: ask again later).
    absent_codes: frozenset[str] = frozenset({"key_not_found"})
    in_use_codes: frozenset[str] = frozenset({"idempotency_key_in_use"})
    # Which provider's base URL and credential the request goes to (settings: CRASHSAFE_PROVIDER_<NAME>_URL).
    provider: str = DEFAULT_PROVIDER

    def __post_init__(self) -> None:
        _check_provider(self.provider)


def _check_provider(name: str) -> None:
    """A provider's name is part of its variables' names (CRASHSAFE_PROVIDER_<NAME>_URL): lower-case, or never
    found in settings."""
    if not PROVIDER_NAME.match(name):
        raise ValueError(
            f"provider {name!r}: a provider name is a lower-case letter, then letters, digits or _"
        )


@dataclass(frozen=True, slots=True)
class PythonOperation:
    """A tool's effect as an adopter's Python code: `client` is called once per process with its provider's
    settings (base URL, credential: never read from the environment by the adopter) and gives the ProviderClient
    the executor calls with the action's key and asks by key."""

    # A 0.2 client (`LegacyProviderClient`) is still served, with a deprecation warning, until 0.4.
    client: Callable[[ProviderSettings], ProviderClient | LegacyProviderClient]
    provider: str = DEFAULT_PROVIDER
    requires: tuple[str, ...] = ()
    # False: the provider cannot be asked about a key; an unknown outcome then stays unknown (never called again).
    looks_up: bool = True
    # True: the client also lists every effect its provider holds (`ListingClient.effects`), which the audit
    # reads to find effects no run journaled; False: the audit checks this tool's effects by key alone.
    lists: bool = False

    def __post_init__(self) -> None:
        _check_provider(self.provider)


@dataclass(frozen=True, slots=True)
class LocalOperation:
    """An effect that happens in the executor's own process (a benchmark's no-op): nothing to ask by key."""

    run: Callable[[dict[str, Any], str], Awaitable[dict[str, Any]]]
    requires: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class KvOperation:
    """An effect that is a compare-and-set rewrite of one record in a key-value bucket of the namespace (a guest's
    profile). The record remembers the keys that wrote it, in the same write as the effect, so "what became of
    key K?" is answered from the record: no provider, and a crash between write and receipt is looked up."""

    bucket: Callable[[Namespace], KvSpec]
    record_key: Callable[[Namespace, dict[str, Any]], str]
    # (the record now or None, arguments, action key) -> (the record to write, None to leave it; the result).
    # Pure, and called again on every compare-and-set clash with the record as it has become.
    apply: Callable[[bytes | None, dict[str, Any], str], tuple[bytes | None, dict[str, Any]]]
    # (the record now or None, arguments, action key) -> the result if the key took effect, else None.
    applied: Callable[[bytes | None, dict[str, Any], str], dict[str, Any] | None]
    requires: tuple[str, ...] = ()


Operation = HttpOperation | PythonOperation | LocalOperation | KvOperation


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool defined once: its contract, how its provider is asked, and whether the audit can check it by key."""

    contract: ToolContract
    operation: Operation
    # False where the provider keeps no record to check (a no-op leaves nothing behind).
    audited: bool = True
    # Only the runtime may call it, to undo an effect; the model never sees it.
    compensation_only: bool = False
    # A projection: planned from a run's journal by the agent's `projections` and delivered by the projector with
    # this retry policy, off the run's critical path; never a step, never offered to the model.
    projection: RetryPolicy | None = None

    @property
    def name(self) -> str:
        return self.contract.name

    def missing(self, args: dict[str, Any]) -> list[str]:
        return [name for name in self.operation.requires if args.get(name) in (None, "")]


# A rule an agent adds to the audit: every journaled keyed intent in, the disagreements it sees out.
AuditRule = Callable[[Mapping[str, Intent]], list[Finding]]


def model_contracts(tools: Iterable[Tool]) -> dict[str, ToolContract]:
    """The contracts the model may call, by name."""
    return {t.name: t.contract for t in tools if not t.compensation_only and t.projection is None}


def compensation_contracts(tools: Iterable[Tool]) -> dict[str, ToolContract]:
    """The contracts only the runtime may call, to undo effects, by name."""
    return {t.name: t.contract for t in tools if t.compensation_only}


@dataclass(frozen=True, slots=True)
class Registration:
    """One agent as a deployment registers it: the agent, the tools it uses, the audit rules it adds."""

    agent: Agent
    tools: tuple[Tool, ...]
    audit_rules: tuple[AuditRule, ...] = ()


@dataclass(frozen=True, slots=True)
class Registry:
    """Which agents a deployment runs and every tool they may use; what the gateway admits and executors enforce."""

    agents: Mapping[str, Agent]
    tools: Mapping[str, Tool]
    audit_rules: tuple[AuditRule, ...] = ()
    default_agent: str = ""
    families: frozenset[str] = field(default=frozenset())

    @classmethod
    def of(
        cls, *registrations: Registration, extra_tools: Iterable[Tool] = (), probe: Probe | None = None
    ) -> Registry:
        """The first registration's agent is the default one (for a guest event that names none).

        `extra_tools`: the deployment's own projection tools that no agent calls (the audit trail): delivered by
        the projector only, so their families get no executor. `probe`: the deployment's synthetic turn, run as
        the agent `synthetic` (`domain/probe.py`; reads only, else `ProbeWrites`)."""
        if not registrations:
            raise ValueError("a registry needs at least one agent")
        agents: dict[str, Agent] = {}
        tools: dict[str, Tool] = {}
        rules: list[AuditRule] = []
        for registration in registrations:
            _complete(registration.agent)
            name = registration.agent.name
            if name in agents:
                raise ValueError(f"agent {name!r} is registered twice")
            agents[name] = registration.agent
            for tool in registration.tools:
                if tool.name in tools and tools[tool.name] != tool:
                    raise ValueError(f"tool {tool.name!r} is defined twice, differently")
                tools[tool.name] = tool
            rules.extend(r for r in registration.audit_rules if r not in rules)
        families = frozenset(t.contract.family for t in tools.values())
        for tool in extra_tools:
            if tool.projection is None:
                raise ValueError(
                    f"tool {tool.name!r}: only a projection tool may be registered without an agent"
                )
            if tool.name in tools and tools[tool.name] != tool:
                raise ValueError(f"tool {tool.name!r} is defined twice, differently")
            tools[tool.name] = tool
        projection_tools = {name for name, tool in tools.items() if tool.projection is not None}
        for agent in agents.values():
            undeclared = sorted(set(agent.projection_tools) - projection_tools)
            if undeclared:
                raise ValueError(
                    f"agent {agent.name!r} names {', '.join(undeclared)} among its projection tools, which the "
                    "registry has as no projection tool"
                )
        for registration in registrations:
            _projects_what_it_declares(registration)
        if probe is not None:
            agents[SYNTHETIC_AGENT] = probe_agent(probe, agents)
        return cls(
            agents=agents,
            tools=tools,
            audit_rules=tuple(rules),
            default_agent=registrations[0].agent.name,
            # A projection tool's family keeps its executor: a step journaled before the tool became a projection
            # (a run in flight across the deploy) is still served, with the same key the projection uses.
            families=families,
        )

    def agent(self, name: str) -> Agent:
        try:
            return self.agents[name]
        except KeyError:
            raise UnknownAgent(name, known=sorted(self.agents)) from None

    def tools_of(self, family: str) -> dict[str, Tool]:
        return {name: t for name, t in self.tools.items() if t.contract.family == family}

    @property
    def compensation_only(self) -> frozenset[str]:
        """The tools an executor serves only with a compensation capability."""
        return frozenset(name for name, t in self.tools.items() if t.compensation_only)

    @property
    def model_tools(self) -> dict[str, frozenset[str]]:
        """Per agent, the tools its model may ask for (a capability bound to the agent may name them)."""
        return {name: frozenset(agent.tools) for name, agent in self.agents.items()}

    @property
    def projections(self) -> dict[str, Tool]:
        """The tools the projector delivers (each with its retry policy), by name."""
        return {name: t for name, t in self.tools.items() if t.projection is not None}

    @property
    def contracts(self) -> dict[str, ToolContract]:
        return {name: t.contract for name, t in self.tools.items()}

    @property
    def probe(self) -> Probe | None:
        """The synthetic turn the registry declared (None: none, or StayHub's own `synthetic` agent)."""
        agent = self.agents.get(SYNTHETIC_AGENT)
        return agent.probe if isinstance(agent, ProbeAgent) else None


# What an agent class must have (the Agent protocol): an agent written before a member was added (a plain class,
# not `AgentBase`) is refused when the registry is built, not found out at its first run.
AGENT_MEMBERS = (
    "name",
    "instructions",
    "tools",
    "compensation_tools",
    "config",
    "argument_types",
    "argument_limits",
    "policies",
    "prepare",
    "compensations",
    "script",
    "projections",
    "projection_tools",
    "approval_question",
)


def _projects_what_it_declares(registration: Registration) -> None:
    """An agent with `projections` of its own declares the projection tools it is registered with: the planner
    plans no projection of an undeclared tool, so one left out (an agent ported from before `projection_tools`,
    which declares none) would stop its emails and CRM records without a word. An agent that keeps `AgentBase`'s
    `projections` (none) may share a registration's tools, projection tools among them, with one that projects."""
    agent = registration.agent
    if getattr(type(agent), "projections", None) is AgentBase.projections:
        return
    registered = {t.name for t in registration.tools if t.projection is not None}
    undeclared = sorted(registered - set(agent.projection_tools))
    if undeclared:
        raise ProjectionToolsUndeclared(agent=agent.name, tools=undeclared)


def _complete(agent: Agent) -> None:
    missing = [member for member in AGENT_MEMBERS if member not in dir(agent)]
    if missing:
        raise ValueError(
            f"agent {type(agent).__name__} lacks {', '.join(missing)} of the Agent protocol: subclass "
            "crashsafe.sdk.AgentBase, which gives every member a default"
        )


def load(spec: str) -> Registry:
    """`package.module:function` -> the Registry that function returns (CRASHSAFE_REGISTRY names the deployment's)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(
            f"registry {spec!r} must be written module:function, e.g. crashsafe.services.agents:stayhub"
        )
    factory = getattr(importlib.import_module(module_name), attribute, None)
    if factory is None:
        raise ValueError(f"registry {spec!r}: {module_name} has no {attribute}")
    registry = factory() if callable(factory) else factory
    if not isinstance(registry, Registry):
        raise ValueError(f"registry {spec!r} gave a {type(registry).__name__}, not a Registry")
    return registry
