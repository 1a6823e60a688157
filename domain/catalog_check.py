"""Whether a configuration catalog can run on this deployment: a pure check, the same at publish and at reload."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Protocol

from crashsafe.contracts.catalog import AgentConfig, Catalog, ModelApi, ModelRoute
from crashsafe.contracts.policy import (
    ApprovalAbove,
    DateWindow,
    OneActiveHold,
    RefundWithinPaid,
    Rule,
    ToolsAllowed,
    VerifiedRecipient,
)
from crashsafe.domain.agent import Agent
from crashsafe.domain.policy_upgrade import upgraded

# Upper bounds past which a figure is a typo, not a choice: a week-long run, a week-long approval wait.
MAX_STEPS = 1_000
MAX_TOKENS = 10_000_000
MAX_DEADLINE_S = 7 * 24 * 3600.0
MAX_APPROVAL_TTL_S = 7 * 24 * 3600.0
MAX_ROUTE_TIMEOUT_S = 600.0
MAX_NIGHTS = 365
MAX_DAYS_AHEAD = 3660
MAX_REPEATS = 100
_APIS = frozenset(api.value for api in ModelApi)
_KEY_VARIABLE = re.compile(r"[A-Z][A-Z0-9_]*_API_KEY")


class Agents(Protocol):
    """What validation needs of a deployment (the registry has it): its agents by name."""

    @property
    def agents(self) -> Mapping[str, Agent]: ...


def validate_catalog(catalog: Catalog, registry: Agents) -> list[str]:
    """Every problem that stops `catalog` from running on this deployment; empty: it may be published."""
    problems: list[str] = []
    if not catalog.agents:
        problems.append("the catalog names no agent")
    for key, config in sorted(catalog.agents.items()):
        where = f"agents.{key}"
        agent = registry.agents.get(key)
        if agent is None:
            problems.append(f"{where}: unknown agent (this deployment runs {sorted(registry.agents)})")
            continue
        if config.agent != key:
            problems.append(f"{where}.agent is {config.agent!r}, not {key!r}")
        problems.extend(_config_problems(where, config, agent))
    return problems


def _config_problems(where: str, config: AgentConfig, agent: Agent) -> list[str]:
    problems: list[str] = []
    model_tools = set(agent.tools)
    unknown = [t for t in config.tools if t not in model_tools]
    if unknown:
        problems.append(f"{where}.tools: {unknown} are not {agent.name}'s model tools {sorted(model_tools)}")
    if len(set(config.tools)) != len(config.tools):
        problems.append(f"{where}.tools: a tool is named twice")
    # A rule from before its parameters existed is checked as it runs: with the agent's built-in rule's.
    for index, rule in enumerate(upgraded(config.rules, agent.config.rules)):
        problems.extend(_rule_problems(f"{where}.rules[{index}]", rule, model_tools))
    budget = config.budget
    if not 0 < budget.max_steps <= MAX_STEPS:
        problems.append(f"{where}.budget.max_steps must be in 1..{MAX_STEPS}, not {budget.max_steps}")
    if not 0 < budget.max_tokens <= MAX_TOKENS:
        problems.append(f"{where}.budget.max_tokens must be in 1..{MAX_TOKENS}, not {budget.max_tokens}")
    if not _positive(budget.deadline_s, MAX_DEADLINE_S):
        problems.append(
            f"{where}.budget.deadline_s must be in (0, {MAX_DEADLINE_S:g}], not {budget.deadline_s}"
        )
    if not 0 < config.max_repeats <= MAX_REPEATS:
        problems.append(f"{where}.max_repeats must be in 1..{MAX_REPEATS}, not {config.max_repeats}")
    problems.extend(_route_problems(where, config.routes))
    return problems


def _rule_problems(where: str, rule: Rule, known: set[str]) -> list[str]:
    problems: list[str] = []
    named: list[str]
    match rule:
        case ToolsAllowed(tools=tools) | DateWindow(tools=tools) | VerifiedRecipient(tools=tools):
            named = list(tools)
        case ApprovalAbove(tool=tool) | OneActiveHold(tool=tool) | RefundWithinPaid(tool=tool):
            named = [tool]
    unknown = [t for t in named if t not in known]
    if unknown:
        problems.append(f"{where} names tools {unknown} the agent does not have")
    match rule:
        case DateWindow(max_nights=nights) if not 0 < nights <= MAX_NIGHTS:
            problems.append(f"{where}.max_nights must be in 1..{MAX_NIGHTS}, not {nights}")
        case DateWindow(max_days_ahead=int(ahead)) if not 0 <= ahead <= MAX_DAYS_AHEAD:
            problems.append(f"{where}.max_days_ahead must be in 0..{MAX_DAYS_AHEAD}, not {ahead}")
        case DateWindow(tools=tools, start_field=field) if not (tools and field):
            problems.append(f"{where} names no tools or no start_field: it would check nothing")
        case OneActiveHold(tool=tool, start_field=field) if not (tool and field):
            problems.append(f"{where} names no tool or no start_field: it would check nothing")
        case RefundWithinPaid(tool=tool, payment_field=field) if not (tool and field):
            problems.append(f"{where} names no tool or no payment_field: it would allow no refund")
        case ApprovalAbove(limit_cents=limit, ttl_s=ttl) if limit < 0 or not _positive(
            ttl, MAX_APPROVAL_TTL_S
        ):
            problems.append(
                f"{where}: limit_cents must be >= 0 (is {limit}) and ttl_s in (0, {MAX_APPROVAL_TTL_S:g}] (is {ttl})"
            )
        case RefundWithinPaid(manager_above_cents=limit, ttl_s=ttl) if limit < 0 or not _positive(
            ttl, MAX_APPROVAL_TTL_S
        ):
            problems.append(
                f"{where}: manager_above_cents must be >= 0 (is {limit}) and ttl_s in"
                f" (0, {MAX_APPROVAL_TTL_S:g}] (is {ttl})"
            )
        case ApprovalAbove(approver=approver) if approver not in ("guest", "manager"):
            problems.append(f"{where}.approver must be guest or manager, not {approver!r}")
        case _:
            pass
    return problems


def _route_problems(where: str, routes: list[ModelRoute]) -> list[str]:
    problems: list[str] = []
    names = [r.name for r in routes]
    if len(set(names)) != len(names):
        problems.append(f"{where}.routes: names must be unique, got {names}")
    for index, route in enumerate(routes):
        at = f"{where}.routes[{index}]"
        if not route.name:
            problems.append(f"{at}.name is empty")
        if not route.model:
            problems.append(f"{at}.model is empty")
        if route.api not in _APIS:
            problems.append(f"{at}.api {route.api!r} is not one of {sorted(_APIS)}")
        if route.base_url and not route.base_url.startswith(("http://", "https://")):
            problems.append(f"{at}.base_url must be an http(s) URL, not {route.base_url!r}")
        if not _KEY_VARIABLE.fullmatch(route.api_key_env) or route.api_key_env.startswith("CRASHSAFE_"):
            # The key is sent to the route's base URL: a catalog naming any other variable (a signing key's path,
            # a credential) would send it to whatever host the catalog names.
            problems.append(
                f"{at}.api_key_env must name a `…_API_KEY` variable outside CRASHSAFE_*, not {route.api_key_env!r}"
            )
        if not _positive(route.timeout_s, MAX_ROUTE_TIMEOUT_S):
            problems.append(f"{at}.timeout_s must be in (0, {MAX_ROUTE_TIMEOUT_S:g}], not {route.timeout_s}")
    return problems


def _positive(value: float, upper: float) -> bool:
    return math.isfinite(value) and 0 < value <= upper


def builtin_catalog(registry: Agents) -> Catalog:
    """Revision 0: each registered agent's own configuration, as the code ships it."""
    return Catalog(agents={name: agent.config for name, agent in registry.agents.items()}, label="built-in")
