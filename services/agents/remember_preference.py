"""The `remember_preference` tool, defined once: its contract, its key-value effect on the guest's profile, and
the rule that prepares its arguments (the guest comes from the run, never from the model)."""

from __future__ import annotations

import re
from typing import Annotated, Any

import msgspec

from crashsafe.contracts.errors import ErrorCode, ErrorInfo
from crashsafe.contracts.memory import (
    APPLIED_KEYS_KEPT,
    MEMORY_FAMILY,
    PREFERENCE_NAMES,
    PREFERENCE_VALUE_MAX,
    GuestProfile,
    PreferenceName,
    profile_decoder,
    profile_encoder,
)
from crashsafe.contracts.streams import guests_spec
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.contracts.tools import Effect, KeyRule, RetryRule, ToolContract
from crashsafe.domain.argument_checks import parameters_of
from crashsafe.domain.registry import KvOperation, Tool
from crashsafe.domain.run_state import RunState

_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9 :\-]*")  # whole value (fullmatch): `$` allows a last "\n"


def _record_key(ns: Namespace, args: dict[str, Any]) -> str:
    return ns.guest_key(str(args["tenant"]), str(args["guest_id"]))


def _profile(value: bytes | None, args: dict[str, Any]) -> GuestProfile:
    return profile_decoder.decode(value) if value else GuestProfile(guest_id=str(args["guest_id"]))


def _result(args: dict[str, Any]) -> dict[str, Any]:
    return {"name": args["name"], "value": args["value"], "remembered": True}


def apply_preference(
    value: bytes | None, args: dict[str, Any], key: str
) -> tuple[bytes | None, dict[str, Any]]:
    """The profile with the preference set and the key recorded, or None where there is nothing to write: the
    key already took effect, or the guest's profile already says exactly this."""
    profile = _profile(value, args)
    name, wanted = str(args["name"]), str(args["value"])
    if key in profile.applied or profile.preferences.get(name) == wanted:
        return None, _result(args)
    updated = msgspec.structs.replace(
        profile,
        preferences={**profile.preferences, name: wanted},
        applied=[*profile.applied, key][-APPLIED_KEYS_KEPT:],
        version=profile.version + 1,
    )
    return profile_encoder.encode(updated), _result(args)


def preference_applied(value: bytes | None, args: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The lookup by key: the write that carried `key` is in the record (it landed), or it is not (absent)."""
    if value is None:
        return None
    return _result(args) if key in _profile(value, args).applied else None


class RememberPreferenceArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One preference the guest stated, from the closed list of names."""

    name: PreferenceName
    value: Annotated[str, msgspec.Meta(min_length=1, max_length=PREFERENCE_VALUE_MAX)]


REMEMBER_PREFERENCE = Tool(
    ToolContract(
        name="remember_preference",
        family=MEMORY_FAMILY,
        effect=Effect.WRITE,
        timeout_s=3.0,
        retry=RetryRule.KEYED,
        max_attempts=3,
        # Its business identity: this guest setting this preference to this value, from the profile as this
        # point of the run knows it (`basis`). Re-planned or asked again before it lands, it is the same action,
        # answered from the executor's store; set again after the profile changed (yes, no, yes) it is a new one.
        key_rule=KeyRule.BUSINESS,
        identity_kind="preference",
        identity=("guest_id", "name", "value", "basis"),
        # A write whose answer was lost can land late only against the revision it read; any later write
        # re-reads the record, so calling again at once never applies a preference twice.
        in_flight_s=0.0,
        description=(
            "Remember one of the guest's preferences for their next stays (e.g. quiet_room: yes). "
            "Only when the guest states it."
        ),
        parameters=parameters_of(RememberPreferenceArgs),
    ),
    KvOperation(
        bucket=guests_spec,
        record_key=_record_key,
        apply=apply_preference,
        applied=preference_applied,
        requires=("tenant", "guest_id", "name", "value"),
    ),
    # Its "provider" is our own KV record, which the lookup by key reads; the money audit has nothing to add.
    audited=False,
)


def _invalid(message: str, **details: Any) -> ErrorInfo:
    return ErrorInfo(code=ErrorCode.INVALID_TOOL_ARGUMENTS.value, message=message, details=details)


def prepare_preference(state: RunState, args: dict[str, Any]) -> dict[str, Any] | ErrorInfo:
    """A preference from the closed vocabulary, a short plain value, for the run's own guest and tenant."""
    name, value = args.get("name"), args.get("value")
    if not isinstance(name, str) or name not in PREFERENCE_NAMES:
        return _invalid(f"name must be one of {', '.join(PREFERENCE_NAMES)}", name=str(name)[:60])
    if not isinstance(value, str) or not value.strip():
        return _invalid("value is required and must be a short text")
    value = re.sub(" +", " ", value.strip(" "))  # spaces only: a line break is not a plain value
    if len(value) > PREFERENCE_VALUE_MAX or not _VALUE.fullmatch(value):
        return _invalid(
            f"value must be at most {PREFERENCE_VALUE_MAX} characters of letters, digits, spaces, ':' and '-'",
            value=value[:60],
        )
    if not state.started.tenant or not state.guest_id:
        return _invalid("this run has no tenant and guest to remember anything for")
    return {
        "tenant": state.started.tenant,
        "guest_id": state.guest_id,
        "name": name,
        "value": value,
        "basis": preference_basis(state),
    }


def preference_basis(state: RunState) -> str:
    """The profile as this point of the run knows it: the version the run started from and how many preference
    writes the run has made since (`v<version>.<writes>`). Read from the journal alone, so a replay prepares
    the same arguments and the same key."""
    profile = state.started.profile
    version = profile.version if profile is not None else 0
    writes = sum(
        1
        for request, done in state.completed
        if request.tool == "remember_preference" and done.status == OutcomeStatus.SUCCEEDED
    )
    return f"v{version}.{writes}"
