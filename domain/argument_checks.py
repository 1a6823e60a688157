"""The check every tool call's arguments pass before anything acts on them: size, depth, JSON object. Pure.

Whatever the model sends, this returns a value and never raises: the size is measured before decoding, the
nesting is counted by one scan (no recursion), and only then does the JSON decoder see the text."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from crashsafe.contracts.errors import ErrorCode, ErrorInfo
from crashsafe.contracts.run_events import ArgumentLimits


def nesting_depth(text: str, stop_at: int) -> int:
    """How deeply `[`/`{` nest outside JSON strings, counting no further than `stop_at + 1`. Iterative."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > stop_at:
                    return deepest
        elif ch in "]}":
            depth -= 1
    return deepest


def check_arguments(tool: str, arguments: str, limits: ArgumentLimits) -> dict[str, Any] | ErrorInfo:
    """The decoded arguments of one call, or why they are refused (a typed `invalid_tool_arguments` family)."""

    def refuse(code: ErrorCode, message: str, **facts: Any) -> ErrorInfo:
        return ErrorInfo(code=code, message=message, details={"tool": tool[:200], **facts})

    # A character is at least one UTF-8 byte: a text longer in characters is over without encoding it.
    size = len(arguments)
    if size <= limits.max_bytes:
        size = len(arguments.encode("utf-8", "surrogatepass"))
    if size > limits.max_bytes:
        return refuse(
            ErrorCode.TOOL_ARGUMENTS_TOO_LARGE,
            f"arguments for {tool[:200]} are {size} bytes, over the limit of {limits.max_bytes}; send less",
            bytes=size,
            limit=limits.max_bytes,
        )
    if not arguments:
        return {}
    depth = nesting_depth(arguments, limits.max_depth)
    if depth > limits.max_depth:
        return refuse(
            ErrorCode.TOOL_ARGUMENTS_TOO_DEEP,
            f"arguments for {tool[:200]} nest deeper than {limits.max_depth} levels",
            limit=limits.max_depth,
        )
    try:
        args = msgspec.json.decode(arguments)
    except (msgspec.DecodeError, UnicodeError, ValueError, RecursionError):
        return refuse(ErrorCode.INVALID_TOOL_ARGUMENTS, f"arguments for {tool[:200]} are not JSON")
    if not isinstance(args, dict):
        return refuse(ErrorCode.INVALID_TOOL_ARGUMENTS, f"arguments for {tool[:200]} must be a JSON object")
    return args


# A tool's arguments as a typed struct: its JSON schema is what the model is shown, and every model call is
# checked against the same struct before the agent prepares it. One definition, two uses.

_AT = re.compile(r"at `\$\.(?P<path>[^`]+)`")
_FIELD = re.compile(r"field `(?P<field>[^`]+)`")


def parameters_of(arguments: type[msgspec.Struct]) -> dict[str, Any]:
    """The JSON schema of an argument struct, inlined (a tool's `parameters`)."""
    schema = msgspec.json.schema(arguments)
    defs = schema.get("$defs", {})
    ref = str(schema.get("$ref", "")).rsplit("/", 1)[-1]
    body = dict(defs.get(ref, schema))
    body.pop("title", None)
    return body


def check_schema(tool: str, args: dict[str, Any], arguments: type[msgspec.Struct]) -> ErrorInfo | None:
    """Why decoded arguments do not fit the tool's struct (unknown field, wrong type, broken constraint), naming
    the field; None when they fit."""
    try:
        msgspec.convert(args, arguments, strict=True)
    except msgspec.ValidationError as exc:
        text = str(exc)
        found = _AT.search(text) or _FIELD.search(text)
        field = found.group(1) if found else ""
        return ErrorInfo(
            code=ErrorCode.INVALID_TOOL_ARGUMENTS,
            message=f"arguments for {tool[:200]} do not fit its schema: {text[:300]}",
            details={"tool": tool[:200], "field": field[:200]},
        )
    return None
