"""`crashsafe.sdk` gives an adopter everything its agent, tools and providers need, and nothing of the runtime's
own vocabulary it must not use (issue 32): the refusal codes, the five provider answers."""

from __future__ import annotations

import re

import pytest

from crashsafe import sdk
from crashsafe.contracts.errors import ErrorCode
from crashsafe.contracts.tool_messages import Answer
from tests.support.paths import ROOT

pytestmark = pytest.mark.unit

# The adopter's code as crashsafe ships it: the example package and what `crashsafe new agent` writes. Not their
# stub providers: a provider's error codes are its own wire (`idempotency_conflict` at the provider is its word).
ADOPTERS_CODE = sorted(
    path
    for path in [
        *(ROOT / "examples" / "cowork").glob("*.py"),
        *(ROOT / "crashsafe" / "templates" / "agent").rglob("*.tmpl"),
    ]
    if "provider" not in path.name
)


def test_the_refusal_codes_are_the_sdks() -> None:
    assert "ErrorCode" in sdk.__all__ and sdk.ErrorCode is ErrorCode
    assert sdk.ErrorCode.INVALID_TOOL_ARGUMENTS == "invalid_tool_arguments"


def test_the_example_and_the_template_spell_no_error_code_as_a_bare_string() -> None:
    """What an adopter copies names `ErrorCode.INVALID_TOOL_ARGUMENTS`, not `"invalid_tool_arguments"`: a typo in a
    bare string is a code nothing reads."""
    codes = "|".join(re.escape(code.value) for code in ErrorCode)
    bare = re.compile(rf"""["']({codes})["']""")
    assert ADOPTERS_CODE
    spelled = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in ADOPTERS_CODE
        for match in bare.finditer(path.read_text())
    ]
    assert not spelled, spelled


def test_a_provider_client_is_offered_the_five_answers_and_none_of_the_executors_own() -> None:
    """`Answer` in the sdk is what a ProviderClient may answer (docs/providers.md); the executor's `replayed`,
    `conflict` and `republished` stay in the evidence's vocabulary, with the same words on the wire."""
    assert [a.value for a in sdk.Answer] == ["ok", "rejected", "unknown", "found", "absent"]
    assert all(Answer(a.value) == a for a in sdk.Answer)
    assert {"ProviderCall", "ProviderEffect"} <= set(sdk.__all__)
