"""Every error crashsafe raises on purpose, importable from here; each theme has its own module beside this one."""

from crashsafe.contracts.errors.access_refused import (
    AgentNotAllowed,
    ApproverStartsRuns,
    Forbidden,
    RateLimited,
    RunInboxFull,
    TooManyActiveRuns,
    TurnLimitReached,
    Unauthenticated,
)
from crashsafe.contracts.errors.bad_input import (
    BodyTooLarge,
    IdempotencyConflict,
    InvalidRequest,
    InvalidSetting,
    RunNotFound,
    UnknownAgent,
    UnprocessableBody,
)
from crashsafe.contracts.errors.broker_mismatches import (
    ConsumerShapeChanged,
    SeamBroken,
    StreamShapeChanged,
)
from crashsafe.contracts.errors.catalog_faults import (
    AgentFault,
    CatalogRevisionGone,
    InvalidCatalog,
)
from crashsafe.contracts.errors.crashsafe_error import (
    NOT_SENT,
    CrashsafeError,
    ErrorCode,
    ErrorInfo,
    RetryClass,
)
from crashsafe.contracts.errors.decision_refusals import (
    ApprovalNotFound,
    ApprovalNotPending,
    DeadLetterNotFound,
    DeadLetterSettled,
    ReplayRefused,
)
from crashsafe.contracts.errors.infrastructure_faults import (
    BrokerUnavailable,
    LeaseConflict,
    ModelUnavailable,
    NotPermitted,
    PartitionNotOwned,
    PoisonMessage,
    RunVersionConflict,
    StreamMissing,
    SubjectFull,
    UpgradeBlocked,
)
from crashsafe.contracts.errors.trust_refusals import (
    CapabilityRefused,
    OutcomeRefused,
    SessionOfAnotherGuest,
)

__all__ = [
    "AgentFault",
    "AgentNotAllowed",
    "ApprovalNotFound",
    "ApprovalNotPending",
    "ApproverStartsRuns",
    "BodyTooLarge",
    "BrokerUnavailable",
    "CapabilityRefused",
    "CatalogRevisionGone",
    "ConsumerShapeChanged",
    "CrashsafeError",
    "DeadLetterNotFound",
    "DeadLetterSettled",
    "ErrorCode",
    "ErrorInfo",
    "Forbidden",
    "IdempotencyConflict",
    "InvalidCatalog",
    "InvalidRequest",
    "InvalidSetting",
    "LeaseConflict",
    "ModelUnavailable",
    "NOT_SENT",
    "NotPermitted",
    "OutcomeRefused",
    "PartitionNotOwned",
    "PoisonMessage",
    "RateLimited",
    "ReplayRefused",
    "RetryClass",
    "RunInboxFull",
    "RunNotFound",
    "RunVersionConflict",
    "SeamBroken",
    "SessionOfAnotherGuest",
    "StreamMissing",
    "StreamShapeChanged",
    "UpgradeBlocked",
    "SubjectFull",
    "TooManyActiveRuns",
    "TurnLimitReached",
    "Unauthenticated",
    "UnknownAgent",
    "UnprocessableBody",
]
