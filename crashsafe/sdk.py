"""The public surface an adopter's agent, tools and providers import: what is not here may change without notice."""

from __future__ import annotations

from crashsafe.contracts.catalog import AgentConfig, ModelApi, ModelRoute
from crashsafe.contracts.errors import AgentFault, ErrorInfo
from crashsafe.contracts.keys import ACCOUNT_ARG, CompensationKind
from crashsafe.contracts.policy import (
    ApprovalAbove,
    Approver,
    DateWindow,
    OneActiveHold,
    RefundWithinPaid,
    Rule,
    StayWindow,
    ToolsAllowed,
    VerifiedRecipient,
)
from crashsafe.contracts.projections import RetryPolicy
from crashsafe.contracts.provider_settings import DEFAULT_PROVIDER, ProviderSettings
from crashsafe.contracts.run_events import ArgumentLimits, Origin, ToolCall
from crashsafe.contracts.tool_messages import Answer, OutcomeStatus
from crashsafe.contracts.tools import Effect, KeyRule, RetryRule, ToolContract
from crashsafe.domain.agent import Agent, Compensation, ProjectionCall, ScriptedStep
from crashsafe.domain.argument_checks import parameters_of
from crashsafe.domain.policy_verdicts import (
    Allow,
    Deny,
    Hold,
    PolicyRule,
    PreparedAction,
    Verdict,
    default_question,
)
from crashsafe.domain.registry import (
    AuditRule,
    HttpOperation,
    HttpRequest,
    ProviderAnswer,
    ProviderClient,
    PythonOperation,
    Registration,
    Registry,
    Tool,
)
from crashsafe.domain.run_state import RunState

__all__ = [
    "ACCOUNT_ARG",
    "Agent",
    "AgentConfig",
    "AgentFault",
    "Allow",
    "Answer",
    "ApprovalAbove",
    "Approver",
    "ArgumentLimits",
    "AuditRule",
    "Compensation",
    "CompensationKind",
    "DEFAULT_PROVIDER",
    "DateWindow",
    "Deny",
    "Effect",
    "ErrorInfo",
    "Hold",
    "HttpOperation",
    "HttpRequest",
    "KeyRule",
    "ModelApi",
    "ModelRoute",
    "OneActiveHold",
    "Origin",
    "OutcomeStatus",
    "PolicyRule",
    "PreparedAction",
    "ProjectionCall",
    "ProviderAnswer",
    "ProviderClient",
    "ProviderSettings",
    "PythonOperation",
    "RefundWithinPaid",
    "Registration",
    "Registry",
    "RetryPolicy",
    "RetryRule",
    "Rule",
    "RunState",
    "ScriptedStep",
    "StayWindow",
    "Tool",
    "ToolCall",
    "ToolContract",
    "ToolsAllowed",
    "Verdict",
    "VerifiedRecipient",
    "default_question",
    "parameters_of",
]
