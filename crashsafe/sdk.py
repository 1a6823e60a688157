"""The public surface an adopter's agent, tools and providers import: what is not here may change without notice."""

from __future__ import annotations

from crashsafe.contracts.audit import ProviderEffect
from crashsafe.contracts.catalog import AgentConfig, ModelApi, ModelRoute

# What a provider client may answer: the five of docs/providers.md (the executor's own answers are not an adopter's).
from crashsafe.contracts.client_answers import ClientAnswer as Answer
from crashsafe.contracts.errors import AgentFault, ErrorCode, ErrorInfo
from crashsafe.contracts.keys import ACCOUNT_ARG, CompensationKind
from crashsafe.contracts.memory import GuestProfile
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
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    ApprovalDecided,
    ApprovalRequested,
    ArgumentLimits,
    ModelAnswered,
    Origin,
    PolicyDenied,
    RunCompleted,
    RunEvent,
    RunHandedOff,
    RunStarted,
    ToolCall,
    ToolRejected,
    TurnReceived,
)
from crashsafe.contracts.tool_messages import ExistingEffect, OutcomeStatus
from crashsafe.contracts.tools import Effect, KeyRule, RetryRule, ToolContract
from crashsafe.domain.agent import Agent, AgentBase, Compensation, ProjectionCall, ScriptedStep
from crashsafe.domain.argument_checks import parameters_of
from crashsafe.domain.guest_scope import in_account
from crashsafe.domain.policy_verdicts import (
    Allow,
    Deny,
    Hold,
    PolicyRule,
    PreparedAction,
    Verdict,
    default_question,
)
from crashsafe.domain.probe import Probe, ProbeCall
from crashsafe.domain.registry import (
    AuditRule,
    HttpOperation,
    HttpRequest,
    ProviderAnswer,
    ProviderCall,
    ProviderClient,
    PythonOperation,
    Registration,
    Registry,
    Tool,
    compensation_contracts,
    model_contracts,
)
from crashsafe.domain.run_state import RunState

__all__ = [
    "ACCOUNT_ARG",
    "ActionCompleted",
    "ActionRequested",
    "Agent",
    "AgentBase",
    "AgentConfig",
    "AgentFault",
    "Allow",
    "Answer",
    "ApprovalAbove",
    "ApprovalDecided",
    "ApprovalRequested",
    "Approver",
    "ArgumentLimits",
    "AuditRule",
    "Compensation",
    "CompensationKind",
    "DEFAULT_PROVIDER",
    "DateWindow",
    "Deny",
    "Effect",
    "ErrorCode",
    "ErrorInfo",
    "ExistingEffect",
    "GuestProfile",
    "Hold",
    "HttpOperation",
    "HttpRequest",
    "KeyRule",
    "ModelAnswered",
    "ModelApi",
    "ModelRoute",
    "OneActiveHold",
    "Origin",
    "OutcomeStatus",
    "PolicyDenied",
    "PolicyRule",
    "Probe",
    "ProbeCall",
    "PreparedAction",
    "ProjectionCall",
    "ProviderAnswer",
    "ProviderCall",
    "ProviderClient",
    "ProviderEffect",
    "ProviderSettings",
    "PythonOperation",
    "RefundWithinPaid",
    "Registration",
    "Registry",
    "RetryPolicy",
    "RetryRule",
    "Rule",
    "RunCompleted",
    "RunEvent",
    "RunHandedOff",
    "RunStarted",
    "RunState",
    "ScriptedStep",
    "StayWindow",
    "Tool",
    "ToolCall",
    "ToolContract",
    "ToolRejected",
    "ToolsAllowed",
    "TurnReceived",
    "Verdict",
    "VerifiedRecipient",
    "compensation_contracts",
    "default_question",
    "in_account",
    "model_contracts",
    "parameters_of",
]
