"""What an adopter's provider client may answer, kept apart from `Answer`, whose other members are the executor's own."""

from __future__ import annotations

from enum import StrEnum

from crashsafe.contracts.tool_messages import Answer


class ClientAnswer(StrEnum):
    """The five answers of docs/providers.md, exported by `crashsafe.sdk` as `Answer`. Each is the value of the
    `Answer` of its name, so the evidence and the wire read the same; `Answer`'s other members (`replayed`,
    `conflict`, `republished`) say what the executor's own store answered, and no client may give them."""

    OK = Answer.OK.value  # call: the effect exists now (made now, or earlier with this key)
    REJECTED = Answer.REJECTED.value  # call: a definitive no; lookup: the key's record is held as refused
    UNKNOWN = Answer.UNKNOWN.value  # call or lookup: anything you cannot vouch for
    FOUND = Answer.FOUND.value  # lookup: the provider holds an effect for the key
    ABSENT = Answer.ABSENT.value  # lookup: only the provider's own "never saw this key"
