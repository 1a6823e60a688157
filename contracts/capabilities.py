"""Run-scoped tool capabilities: what the runtime signs for each action request, and how an executor checks it."""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING

import msgspec
import nacl.exceptions
import nacl.signing
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from crashsafe.contracts import checkpoints
from crashsafe.contracts.checkpoints import Checkpoint, RunHead
from crashsafe.contracts.keys import tool_input_hash

if TYPE_CHECKING:
    from crashsafe.contracts.tool_messages import ActionRequest

# Domain separation: these bytes never mean anything else, and a v2 layout gets a new prefix.
SIGNED_PREFIX = b"crashsafe.capability.v1\x00"
# A capability bound to the run's agent (`Capability.agent` set): the v1 fields, then the agent.
SIGNED_PREFIX_V2 = b"crashsafe.capability.v2\x00"
# How long after an action's deadline its capability still holds: covers clock skew between runtime and
# executor hosts and a request that waited in the queue while its executor restarted.
GRACE_S = 60.0
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class CapabilityOrigin(StrEnum):
    """Why the runtime signed (`Capability.origin`; `str` on the wire: an executor refuses one it does not know)."""

    PLAN = "plan"  # a tool call the run planned (the model's or an agent's script)
    COMPENSATION = "compensation"  # the runtime undoing an effect: the only way to a compensation-only tool
    # Signed by no version since re-sends keep their request's origin; still read (as a plan) if one arrives.
    RESOLVE = "resolve"


class Refusal(StrEnum):
    """Why an executor refused a request before doing anything with it (the dead letter's `reason`)."""

    MISSING = "missing"  # no capability at all
    UNKNOWN_KEY = "unknown_key"  # signed with a key this executor does not hold (`kid`)
    BAD_SIGNATURE = "bad_signature"  # the signature does not verify over the capability's fields
    ALTERED = "altered"  # a signed field (run, key, tool, family, input hash) differs from the request's
    INPUT_MISMATCH = "input_mismatch"  # the request's args do not hash to the signed input hash
    EXPIRED = "expired"
    WRONG_ORIGIN = "wrong_origin"  # a compensation-only tool without a compensation capability, or vice versa


class OutcomeRefusal(StrEnum):
    """Why the runtime refused to journal an outcome (the dead letter's `reason`)."""

    UNREQUESTED = "unrequested"  # the run's journal holds no request with this key
    WRONG_TOOL = "wrong_tool"  # the journaled request with this key is for another tool
    WRONG_STEP = "wrong_step"  # ... or another step
    WRONG_FAMILY = "wrong_family"  # it arrived on another family's subject than the request's
    WRONG_SUBJECT = "wrong_subject"  # its subject names another run, or a wake-up came on a family's subject


class Capability(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="action.capability"):
    """The runtime's signed permission for one action: this run, this key, this tool with this input, until then.

    `sig` is Ed25519 over `signed_bytes` (base64url, no padding); `kid` names the runtime key that made it."""

    run_id: str
    key: str
    tool: str
    family: str
    input_hash: str
    origin: str  # a CapabilityOrigin
    expires_at: datetime
    kid: str
    sig: str
    # The agent whose run asked (signed, v2 layout): lets an executor serve a tool that is compensation-only for
    # most agents to the one agent whose model may ask for it (support's refund_payment). Empty: unbound (v1).
    agent: str = ""


def _micros(at: datetime) -> int:
    """A time as whole microseconds since the Unix epoch: the same integer in any language, any time zone."""
    if at.tzinfo is None:
        raise ValueError("a capability's expiry must carry a time zone")
    return (at - _EPOCH) // timedelta(microseconds=1)


_signed_encoder = msgspec.json.Encoder()


def signed_bytes(cap: Capability) -> bytes:
    """What the signature covers: the prefix, then a JSON array of every field but `sig`, in this fixed order
    (v2, when the capability names its agent: the same array with the agent last)."""
    fields: tuple[str | int, ...] = (
        cap.run_id,
        cap.key,
        cap.tool,
        cap.family,
        cap.input_hash,
        cap.origin,
        _micros(cap.expires_at),
        cap.kid,
    )
    if cap.agent:
        return SIGNED_PREFIX_V2 + _signed_encoder.encode((*fields, cap.agent))
    return SIGNED_PREFIX + _signed_encoder.encode(fields)


def key_id(public_key: Ed25519PublicKey) -> str:
    """First 16 hex digits of SHA-256 over the raw 32-byte public key."""
    raw = public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class CapabilityIssuer:
    """The runtime's half: holds the signing key, signs a capability for a request it is about to publish."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        # Keys are read and kept with `cryptography`; each signature is made by libsodium (PyNaCl), the same
        # Ed25519 at a fraction of the CPU (docs/decisions.md, issue 19).
        self._key = nacl.signing.SigningKey(private_key.private_bytes_raw())
        self.kid = key_id(private_key.public_key())

    def __repr__(self) -> str:  # never the key itself, in a log line or a traceback
        return f"CapabilityIssuer(kid={self.kid})"

    def issue(
        self, request: ActionRequest, origin: CapabilityOrigin, expires_at: datetime, agent: str = ""
    ) -> Capability:
        unsigned = Capability(
            run_id=request.run_id,
            key=request.key,
            tool=request.tool,
            family=request.family,
            input_hash=request.input_hash,
            origin=origin.value,
            expires_at=expires_at,
            kid=self.kid,
            sig="",
            agent=agent,
        )
        return msgspec.structs.replace(unsigned, sig=_b64(self._key.sign(signed_bytes(unsigned)).signature))

    def checkpoint(self, heads: Sequence[RunHead], prev: str, now: datetime) -> Checkpoint:
        """A checkpoint of run heads signed with the same key (its own prefix: a checkpoint's signed bytes can
        never pass as a capability's, docs/decisions.md)."""
        return checkpoints.sign(self._key, self.kid, heads, prev, now)

    def grant(
        self, request: ActionRequest, origin: CapabilityOrigin, expires_at: datetime, agent: str = ""
    ) -> ActionRequest:
        """The request with its capability attached (bound to `agent`, the run's agent, when given)."""
        return msgspec.structs.replace(request, capability=self.issue(request, origin, expires_at, agent))


class CapabilityVerifier:
    """An executor's half: the verification keys it accepts (two during a rotation), and the check itself."""

    def __init__(
        self,
        public_keys: Iterable[Ed25519PublicKey],
        compensation_tools: Iterable[str],
        model_tools: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        """`model_tools`: per agent, the tools its model may ask for. A compensation-only tool named there is
        served to a plan capability bound (signed) to that agent, and to no other plan capability."""
        # Checked by libsodium (PyNaCl): half the CPU of `cryptography`'s check, on every delivery.
        self.keys = {key_id(k): nacl.signing.VerifyKey(k.public_bytes_raw()) for k in public_keys}
        if not self.keys:
            raise ValueError("a verifier needs at least one public key")
        self.compensation_tools = frozenset(compensation_tools)
        self.model_tools = {agent: frozenset(tools) for agent, tools in (model_tools or {}).items()}

    def check(self, request: ActionRequest, now: datetime) -> Refusal | None:
        """None if the request carries a valid capability for exactly itself; else why not. Checks run cheapest
        first, except that nothing about the request is trusted before the signature verifies."""
        cap = request.capability
        if cap is None:
            return Refusal.MISSING
        public = self.keys.get(cap.kid)
        if public is None:
            return Refusal.UNKNOWN_KEY
        try:
            public.verify(signed_bytes(cap), _unb64(cap.sig))
        except (nacl.exceptions.CryptoError, ValueError, TypeError, binascii.Error):
            return Refusal.BAD_SIGNATURE
        signed = (cap.run_id, cap.key, cap.tool, cap.family, cap.input_hash)
        if signed != (request.run_id, request.key, request.tool, request.family, request.input_hash):
            return Refusal.ALTERED
        # Recomputed, never trusted: a valid capability with swapped args must not pass.
        if tool_input_hash(request.tool, request.args) != cap.input_hash:
            return Refusal.INPUT_MISMATCH
        if now >= cap.expires_at:
            return Refusal.EXPIRED
        compensation_only = request.tool in self.compensation_tools
        agent_may = bool(cap.agent) and request.tool in self.model_tools.get(cap.agent, frozenset())
        if not _origin_fits(cap.origin, compensation_only, agent_may):
            return Refusal.WRONG_ORIGIN
        return None


def _origin_fits(origin: str, compensation_only: bool, agent_may: bool = False) -> bool:
    """A compensation-only tool needs a compensation capability, unless a plan capability is bound to an agent
    whose model may ask for it (`agent_may`); a compensation capability is good for nothing else. `resolve` (no
    longer signed: a re-send keeps its request's own origin) is never a pass to a compensation-only tool."""
    if origin == CapabilityOrigin.COMPENSATION:
        return compensation_only
    if origin == CapabilityOrigin.PLAN:
        return not compensation_only or agent_may
    if origin == CapabilityOrigin.RESOLVE:
        return not compensation_only
    return False  # an origin this version does not know
