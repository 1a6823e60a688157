"""The check every tool call's arguments pass before anything acts on them: size, depth, JSON object. Pure.

Whatever the model sends, this returns a value and never raises: the size is measured before decoding, the
nesting is counted by one scan (no recursion), and only then does the JSON decoder see the text."""

from __future__ import annotations

from typing import Any

import msgspec

from contracts.errors import ErrorCode, ErrorInfo
from contracts.run_events import ArgumentLimits


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
