"""Header names, NATS and HTTP, that carry meaning across services: one spelling of each."""

from __future__ import annotations

from enum import StrEnum


class Header(StrEnum):
    """NATS and HTTP header names that carry meaning across services."""

    MSG_ID = "Nats-Msg-Id"
    EXPECTED_LAST_SUBJECT_SEQUENCE = "Nats-Expected-Last-Subject-Sequence"
    # The filter the expected last sequence is checked across (nats-server 2.11+): a run's journal spans a
    # subject per event class, and its version is the last sequence on any of them.
    EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
    TRACEPARENT = "traceparent"
    TRACESTATE = "tracestate"
    IDEMPOTENCY_KEY = "Idempotency-Key"
    # The provider account a call acts in: the run's tenant (`RunState.account`); a call never sees another's.
    PROVIDER_ACCOUNT = "Provider-Account"
    AUTHORIZATION = "Authorization"
    RETRY_AFTER = "Retry-After"
    # A provider's "this answer is the one an earlier request with the key got" (Stripe's header).
    IDEMPOTENT_REPLAYED = "Idempotent-Replayed"
    CONTENT_LENGTH = "Content-Length"
    # Per-message TTL (nats-server 2.11+): a lease or membership key the server removes unless it is renewed.
    MSG_TTL = "Nats-TTL"
    KV_OPERATION = "KV-Operation"
    # What a direct get answers with, beside the stored message.
    SEQUENCE = "Nats-Sequence"
    SUBJECT = "Nats-Subject"
    NUM_PENDING = "Nats-Num-Pending"
    UP_TO_SEQUENCE = "Nats-UpTo-Sequence"  # the sequence a paged multi-subject get answers up to
    TIME_STAMP = "Nats-Time-Stamp"  # when the server stored it (RFC 3339, nanoseconds)
    # JetStream message scheduling (nats-server 2.12+): when a schedule fires, and where its body goes.
    SCHEDULE = "Nats-Schedule"
    SCHEDULE_TARGET = "Nats-Schedule-Target"
    # With `Nats-Schedule-Next: purge`, the schedule subject the server purges (a cancelled timer).
    SCHEDULER = "Nats-Scheduler"
    SCHEDULE_NEXT = "Nats-Schedule-Next"
    # On a journal event appended after its run ended (a late receipt after a hand-off): the projector re-plans the
    # run from this alone, without reading every outcome's journal to find out whether the run ended.
    RUN_ENDED = "Crashsafe-Run-Ended"
    # On a receipt an executor appended to its run's journal (the journal as the bus): the stream sequence of the
    # intent it answers, sent only with an append checked to come right after it. A runtime holding the run at
    # that sequence folds the receipt as it is; any other runtime reads the journal.
    FOLLOWS = "Crashsafe-Follows"
    # The release of the process that published a message (`contracts.release.VERSION`), on every JetStream
    # publish: which version wrote what while two run side by side in a rolling upgrade. No reader needs it.
    VERSION = "Crashsafe-Version"
    # On a journal event (0.5.0+): `<position>:<hash of the event before it>`, the run's hash chain
    # (contracts/journal_chain.py). Readers that do not check the chain ignore it.
    CHAIN = "Crashsafe-Chain"
