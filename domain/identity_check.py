"""Which business-keyed tools a model can ask again under the same key with other arguments. Pure.

A business key is made of the tool's identity fields (`ToolContract.identity`); its input hash, of every
argument. A model argument outside the identity (a slot picked for a pet, vet and day) therefore brings the
same key with other input when it changes: the executor answers `idempotency_conflict` (never a second effect;
the conflict carries the one that exists). Safe, but a surprise unless chosen: each such argument must be in the
identity (another value is another action) or named in `outside_identity` (another value is the same action).
`crashsafe.testing.identity_gaps` is the public face."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from crashsafe.contracts.keys import ACCOUNT_ARG
from crashsafe.contracts.tools import KeyRule, ToolContract
from crashsafe.domain.registry import Registry


@dataclass(frozen=True, slots=True)
class IdentityGap:
    """One business-keyed tool whose model arguments reach outside its identity, undeclared."""

    agent: str
    tool: str
    identity: tuple[str, ...]
    outside: tuple[str, ...]

    def __str__(self) -> str:
        fields, identity = ", ".join(self.outside), ", ".join(self.identity)
        return (
            f"{self.agent}: {self.tool} is keyed by ({identity}) but the model also gives {fields}. Asked again "
            f"for the same ({identity}) with another {self.outside[0]}, the key arrives with other input and is "
            f"answered idempotency_conflict with the effect it already made. If another {self.outside[0]} is "
            f"another action, add it to `identity`; if it is the same action, name it in `outside_identity`."
        )


def model_arguments(contract: ToolContract, arguments: type[msgspec.Struct] | None) -> frozenset[str]:
    """The arguments the model gives a tool: its parameters' properties, and its argument struct's fields."""
    properties = contract.parameters.get("properties")
    names = set(properties) if isinstance(properties, Mapping) else set()
    if arguments is not None:
        names |= {f.encode_name for f in msgspec.structs.fields(arguments)}
    return frozenset(names)


def gap_of(agent: str, contract: ToolContract, arguments: type[msgspec.Struct] | None) -> IdentityGap | None:
    if contract.key_rule is not KeyRule.BUSINESS or not contract.identity:
        return None
    # The account is the tenant's, never the model's; the tenant is in every business key already.
    known = {*contract.identity, *contract.identity_fixed, *contract.outside_identity, ACCOUNT_ARG}
    outside = sorted(model_arguments(contract, arguments) - known)
    if not outside:
        return None
    return IdentityGap(agent, contract.name, contract.identity, tuple(outside))


def identity_gaps(registry: Registry) -> list[IdentityGap]:
    """Every agent's business-keyed model tool whose arguments reach outside its identity, undeclared."""
    gaps = []
    for name, agent in sorted(registry.agents.items()):
        types = agent.argument_types
        for tool, contract in sorted(agent.tools.items()):
            gap = gap_of(name, contract, types.get(tool))
            if gap is not None:
                gaps.append(gap)
    return gaps
