"""The README's table of every environment variable the product reads: its name, its default, what it means."""

from __future__ import annotations

from dataclasses import dataclass

from crashsafe.contracts.subjects import DEFAULT_ACTION_PARTITIONS, DEFAULT_NAMESPACE


@dataclass(frozen=True, slots=True)
class Variable:
    """One environment variable: its name, its default as written in the README, and what it means."""

    name: str
    default: str
    meaning: str


# The README's configuration table lists exactly these (tests/…/test_settings.py checks it). A name with `<NAME>`
# in it is a family of variables, one per provider (services/platform/provider_variables.py reads them).
VARIABLES: tuple[Variable, ...] = (
    Variable(
        "CRASHSAFE_NATS_URL",
        "nats://127.0.0.1:4222",
        "the NATS server (a cluster: its URLs, comma-separated)",
    ),
    Variable("CRASHSAFE_NAMESPACE", DEFAULT_NAMESPACE, "prefix of every subject and stream"),
    Variable(
        "CRASHSAFE_REGISTRY", "crashsafe.services.agents:stayhub", "the agents and tools this deployment runs"
    ),
    Variable(
        "CRASHSAFE_ACTION_PARTITIONS",
        str(DEFAULT_ACTION_PARTITIONS),
        "partitions per tool family (a migration)",
    ),
    Variable(
        "CRASHSAFE_PARTITIONS",
        "all",
        "`all`: the live replicas of a family share the partitions; `0-1`, `2,3`: only these (still leased)",
    ),
    Variable("CRASHSAFE_DATA_DIR", ".crashsafe/data", "executor SQLite files, one per owned partition"),
    Variable("CRASHSAFE_SQLITE_SYNC", "NORMAL", "`FULL` fsyncs every receipt (power-loss safe)"),
    Variable("CRASHSAFE_ACK_WAIT_S", "1", "ack wait of every consumer"),
    Variable("CRASHSAFE_STREAM_REPLICAS", "1", "`3` on a three-node JetStream cluster"),
    Variable("CRASHSAFE_GATEWAY_HOST", "127.0.0.1", "gateway listen address"),
    Variable("CRASHSAFE_GATEWAY_PORT", "8080", "gateway listen port"),
    Variable(
        "CRASHSAFE_SANDBOX_URL",
        "http://127.0.0.1:8090",
        "the default provider: every operation that names no provider ([docs/providers.md](docs/providers.md))",
    ),
    Variable(
        "CRASHSAFE_PROVIDER_<NAME>_URL",
        "unset",
        'the base URL of the provider an operation names (`provider="stripe"`: `CRASHSAFE_PROVIDER_STRIPE_URL`); '
        "required at start for every provider the registry's HTTP operations name",
    ),
    Variable(
        "CRASHSAFE_PROVIDER_<NAME>_CREDENTIAL_FILE",
        "unset",
        "a file holding that provider's credential, read once at start: sent as `Authorization: Bearer`, or given "
        "to a Python operation; `<NAME>` = `DEFAULT` for the default provider",
    ),
    Variable("CRASHSAFE_SANDBOX_PORT", "8090", "the sandbox's listen port"),
    Variable("CRASHSAFE_WORKER_ID", "<hostname>-<pid>", "this replica's name in journals and logs"),
    Variable(
        "CRASHSAFE_LOG_LEVEL",
        "INFO",
        "DEBUG, INFO, WARNING or ERROR: the JSON lines on stderr ([docs/observability.md](docs/observability.md#logs))",
    ),
    Variable("CRASHSAFE_CRASH_AT", "unset", "a crash seam to SIGKILL at (tests and the demo)"),
    Variable("CRASHSAFE_MODEL", "scripted", "the model name asked of the Responses API"),
    Variable(
        "OPENAI_API_KEY", "unset", "talk to a real Responses API provider instead of the scripted model"
    ),
    Variable("OPENAI_BASE_URL", "unset", "that provider's base URL"),
    Variable("OPENAI_ORG_ID", "unset", "sent as `OpenAI-Organization` on every model call"),
    Variable("OPENAI_PROJECT_ID", "unset", "sent as `OpenAI-Project` on every model call"),
    Variable(
        "CRASHSAFE_API_KEY",
        "unset",
        "a gateway client's key (the CLI and scripts; else `<state-dir>/api_key`)",
    ),
    Variable("CRASHSAFE_TLS_CERT_FILE", "unset", "gateway HTTPS: its certificate chain (PEM)"),
    Variable("CRASHSAFE_TLS_KEY_FILE", "unset", "gateway HTTPS: its private key (PEM)"),
    Variable("CRASHSAFE_RATE_PER_CLIENT", "2000", "requests/s per API key, per gateway replica (0: none)"),
    Variable("CRASHSAFE_RATE_PER_GUEST", "20", "guest events/s per guest, per gateway replica (0: none)"),
    Variable(
        "CRASHSAFE_RECONCILE_PER_MINUTE", "6", "reconciles per run and minute, per gateway replica (0: none)"
    ),
    Variable("CRASHSAFE_ACTIVE_RUNS_PER_GUEST", "10", "runs under way at once per guest (0: no cap)"),
    Variable(
        "CRASHSAFE_TURNS_PER_RUN",
        "50",
        "guest messages one run takes as turns; past it `409 turn_limit_reached` (0: no cap)",
    ),
    Variable(
        "CRASHSAFE_RUN_INBOX",
        "10",
        "a run's accepted messages not yet read by its model; past it `429 run_inbox_full` (0: no cap)",
    ),
    Variable(
        "CRASHSAFE_CAPABILITY_SIGNING_KEY",
        "unset",
        "runtime only: its Ed25519 private key (PEM) that signs every action request; required",
    ),
    Variable(
        "CRASHSAFE_CAPABILITY_VERIFY_KEYS",
        "unset",
        "executors: the runtime's public key(s) (PEM), one path or two comma-separated during a rotation",
    ),
    Variable(
        "CRASHSAFE_NATS_CREDS",
        "unset",
        "this process's NATS credential file (0600; `crashsafe up` and `crashsafe infra nats-auth` write one per role)",
    ),
    Variable(
        "CRASHSAFE_NATS_TLS_CA_FILE", "unset", "CA bundle (PEM) to verify the NATS server by; implies TLS"
    ),
    Variable(
        "CRASHSAFE_NATS_TLS_CERT_FILE",
        "unset",
        "client certificate (PEM) if the NATS server verifies clients",
    ),
    Variable("CRASHSAFE_NATS_TLS_KEY_FILE", "unset", "that certificate's private key (PEM)"),
    Variable(
        "CRASHSAFE_PROJECTION_TIME_SCALE",
        "1.0",
        "projector: multiplies every projection retry delay and give-up time (tests shorten the clock: 0.01)",
    ),
    # The synthetic turn and the knowledge library's degraded mode (issue 11, slice synthetic).
    Variable(
        "CRASHSAFE_SYNTHETIC_GATEWAY_URL",
        "unset",
        "reconciler: the gateway its synthetic turn goes through (unset: no synthetic turn)",
    ),
    Variable(
        "CRASHSAFE_SYNTHETIC_KEY_FILE",
        "unset",
        "reconciler: the file holding the `synthetic` tenant's API key (events:write, runs:read)",
    ),
    Variable(
        "CRASHSAFE_SYNTHETIC_EVERY_S",
        "300",
        "reconciler: at most one synthetic turn per this many seconds (0: off)",
    ),
    Variable("CRASHSAFE_SYNTHETIC_BUDGET_S", "30", "one synthetic turn's time budget: past it, `slow`"),
    Variable(
        "CRASHSAFE_KNOWLEDGE_DIR",
        "unset",
        "runtime: a folder of policy documents (*.md) instead of the shipped StayHub ones; none: degraded",
    ),
    Variable(
        "CRASHSAFE_OPS_HOST",
        "127.0.0.1",
        "ops port address: `/healthz`, `/readyz`, `/metrics` (`0.0.0.0` in a pod)",
    ),
    Variable(
        "CRASHSAFE_OPS_PORT",
        "9464",
        "ops port of runtime, executors, projector and reconciler (0: a free port, printed); the gateway serves them on its own",
    ),
    Variable(
        "CRASHSAFE_LOOP_STALL_S",
        "30",
        "a service whose event loop has not turned for this long fails `/healthz` and exits (code 70), to be restarted",
    ),
    Variable(
        "CRASHSAFE_HOOK_LIMIT_S",
        "5",
        "an agent's code that runs longer than this in one decision is stopped and its run handed off (`agent_fault`);"
        " 0: no limit",
    ),
    # Retention (issue 31, months of runs): each a TTL in whole seconds, 0 keeps forever; below its floor refused.
    Variable(
        "CRASHSAFE_RETENTION_SESSIONS_S",
        "691200",
        "a session lane is kept this long after its last write (8 days; at least 7 days + 1 h, a run's longest life)",
    ),
    Variable(
        "CRASHSAFE_RETENTION_ACTIVE_S",
        "86400",
        "a guest's active-runs record is kept this long past the latest run deadline it holds",
    ),
    Variable(
        "CRASHSAFE_RETENTION_APPROVALS_S",
        "604800",
        "an approval record is kept this long past its decision, or past its expiry while pending (at least 1 day)",
    ),
    Variable(
        "CRASHSAFE_RETENTION_DEAD_MARKS_S",
        "2678400",
        "a dead letter's replayed/discarded mark is kept this long (31 days; at least DEAD_LETTERS' 30 days + 1 h)",
    ),
    Variable(
        "CRASHSAFE_RETENTION_RECEIPTS_S",
        "604800",
        "a projection receipt is kept this long after its last write (at least 1 day, the reconciler's look-back)",
    ),
    Variable(
        "CRASHSAFE_RETENTION_STEP_ROWS_S",
        "604800",
        "executors: a settled step key's SQLite row (`run_…:n`) is deleted this long after its receipt (at least 1 day)",
    ),
    Variable(
        "CRASHSAFE_RETENTION_BUSINESS_ROWS_S",
        "15552000",
        "executors: a settled business key's row (`charge:…`) is deleted this long after its receipt (180 days; at least 30)",
    ),
    Variable(
        "CRASHSAFE_PRUNE_EVERY_S", "300", "executors: how often each partition's store deletes expired rows"
    ),
    Variable(
        "CRASHSAFE_PRUNE_BATCH",
        "500",
        "executors: at most this many rows one delete takes (the writer is held briefly)",
    ),
    Variable(
        "CRASHSAFE_RETENTION_JOURNALS_S",
        "259200",
        "an ended run's journal is archived and purged from `RUNS` once it has not moved for this long and no late"
        " message can reach it (3 days; at least 1 day; shorter than the receipts'); 0: kept in the stream forever",
    ),
    Variable(
        "CRASHSAFE_ARCHIVE_DIR",
        "unset",
        "the journals' archive (`<dir>/<ns>/runs/<run_id>.json`), mounted by every service that reads journals and the"
        " CLI; unset: nothing is archived or purged",
    ),
    Variable(
        "CRASHSAFE_STORE_BACKUP_DIR",
        "unset",
        "executors: each partition's store is backed up here (`<dir>/<ns>/<family>/p<n>/`) and restored from here by"
        " the replica that takes the partition over; a directory every executor replica mounts. Unset: no backups",
    ),
    Variable(
        "CRASHSAFE_STORE_BACKUP_EVERY_S",
        "300",
        "executors: how often each held partition's store is backed up (and at every clean release)",
    ),
    Variable(
        "CRASHSAFE_RETENTION_KEY_FACTS_S",
        "0",
        "a key's facts expire this long after two backups of its store hold it settled; 0: kept forever. Only with"
        " CRASHSAFE_STORE_BACKUP_DIR, at least the backup interval + the lease + 120 s, and facts expire only once"
        " `infra contract` recorded 0.3.0 and no older process is alive",
    ),
    Variable(
        "CRASHSAFE_ARCHIVE_EVERY_S",
        "60",
        "reconciler: how often it archives the runs past the journals' hot window",
    ),
)
