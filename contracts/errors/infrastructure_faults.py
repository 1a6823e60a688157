"""What the infrastructure under a service answers: the broker (a moved run, a full subject, no answer, a
missing stream, a refused publish), the partition leases, the model, and a message no handler can take."""

from __future__ import annotations

from dataclasses import field

from crashsafe.contracts.errors.crashsafe_error import NOT_SENT, CrashsafeError, ErrorCode, RetryClass


class RunVersionConflict(CrashsafeError):
    """Another writer appended to the run first: re-fold and decide again, never append blind.

    Raised where the append is refused (the broker), which knows the run's journal, `<ns>.run.<run_id>.*`."""

    code = ErrorCode.RUN_VERSION_CONFLICT
    retry = RetryClass.RETRY_LATER

    subject: str
    expected_seq: int

    def explain(self) -> str:
        return f"{self.subject} moved past sequence {self.expected_seq}; re-fold the run and decide again"


class SubjectFull(CrashsafeError):
    """A publish to a subject that holds one message (discard new per subject) found it taken.

    For an inbound subject that is the run's lasting guard: read the message already there and compare."""

    code = ErrorCode.SUBJECT_FULL

    subject: str

    def explain(self) -> str:
        return f"{self.subject} already holds its one message; read it instead of publishing another"


class BrokerUnavailable(CrashsafeError):
    """NATS or JetStream did not answer; `message` names the call. Retried later: the message was not acked."""

    code = ErrorCode.BROKER_UNAVAILABLE
    retry = RetryClass.RETRY_LATER

    message: str = field(kw_only=False, metadata=NOT_SENT)
    subject: str | None = None
    url: str | None = None


class ArchiveUnavailable(CrashsafeError):
    """The journals' archive (CRASHSAFE_ARCHIVE_DIR) could not be read or written; `message` says what failed.
    Retried later: nothing is purged from `RUNS` until its archive is written and read back whole."""

    code = ErrorCode.ARCHIVE_UNAVAILABLE
    retry = RetryClass.RETRY_LATER

    message: str = field(kw_only=False, metadata=NOT_SENT)
    archive: str | None = None


class StoreBackupUnavailable(CrashsafeError):
    """A partition store's backup directory (CRASHSAFE_STORE_BACKUP_DIR) could not be written or read; `message`
    says what failed. Retried later: a round not written is written at the next; a partition whose newest
    backup cannot be read is handed back, never served from an empty store (check the volume, then its files)."""

    code = ErrorCode.STORE_BACKUP_UNAVAILABLE
    retry = RetryClass.RETRY_LATER

    message: str = field(kw_only=False, metadata=NOT_SENT)
    partition: int | None = None
    backup: str | None = None


class UpgradeBlocked(CrashsafeError):
    """A contracting step refused while processes of an older release are alive (their version heartbeats, or pull
    requests no heartbeat accounts for): nothing was changed."""

    code = ErrorCode.UPGRADE_BLOCKED
    retry = RetryClass.RETRY_LATER

    step: str  # the command refused: `infra contract`
    processes: list[str]  # each older process: service, worker, version (or how it was seen)

    def explain(self) -> str:
        alive = "; ".join(self.processes)
        return (
            f"`crashsafe {self.step}` refused, nothing changed: older processes are alive ({alive}). Finish the"
            " rollout first (`crashsafe upgrade status` says converged), then run it again"
        )


class StreamMissing(CrashsafeError):
    """A stream or bucket a service needs was never provisioned; services do not create streams."""

    code = ErrorCode.STREAM_MISSING
    retry = RetryClass.RETRY_LATER

    stream: str

    def explain(self) -> str:
        return (
            f"stream {self.stream} does not exist: run `crashsafe infra apply` (as the operator) to provision the"
            " namespace's streams and buckets, then start this service again"
        )


class NotPermitted(CrashsafeError):
    """NATS refused this process's user a publish: its role may not send there (docs/security.md)."""

    code = ErrorCode.NOT_PERMITTED
    retry = RetryClass.POISON

    user: str
    subject: str

    def explain(self) -> str:
        return (
            f"NATS user {self.user} may not publish to {self.subject}; nothing was stored. If this role should,"
            " change contracts/nats_permissions.py and regenerate the credentials' server config"
        )


class ModelUnavailable(CrashsafeError):
    """The model did not answer usably; the step is asked again later (nothing was journaled for it)."""

    code = ErrorCode.MODEL_UNAVAILABLE
    retry = RetryClass.RETRY_LATER

    problem: str = field(kw_only=False, metadata=NOT_SENT)
    model: str | None = None

    def explain(self) -> str:
        return f"{self.problem}; the step is asked again later (check CRASHSAFE_MODEL and OPENAI_BASE_URL)"


class PoisonMessage(CrashsafeError):
    """A message retrying cannot help: terminated and dead-lettered with `reason`, for a person to look at."""

    code = ErrorCode.POISON_MESSAGE
    retry = RetryClass.POISON

    reason: str = field(kw_only=False, metadata=NOT_SENT)
    key: str | None = None
    run_id: str | None = None
    missing: list[str] | None = None  # the arguments a tool needs that the request lacked

    def explain(self) -> str:
        return f"{self.reason}; retrying cannot help: dead-lettered, fix what published it"


class PartitionNotOwned(CrashsafeError):
    """This replica does not hold the partition's lease (never had it, released it, or lost it while paused):
    it must not commit an intent or a receipt for it. Retried later, so the message reaches the owner."""

    code = ErrorCode.PARTITION_NOT_OWNED
    retry = RetryClass.RETRY_LATER

    family: str
    partition: int
    key: str | None = None
    why: str = "not held"

    def explain(self) -> str:
        return (
            f"executor {self.family} does not hold partition {self.partition} ({self.why}); the message comes"
            " back to its owner"
        )


class LeaseConflict(CrashsafeError):
    """A key-value write expected a revision the key no longer has: someone else wrote it first."""

    code = ErrorCode.LEASE_CONFLICT
    retry = RetryClass.RETRY_LATER

    key: str
    expected_revision: int

    def explain(self) -> str:
        return f"{self.key} moved past revision {self.expected_revision}; read it again before writing"
