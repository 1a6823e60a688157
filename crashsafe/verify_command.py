"""`crashsafe verify BUNDLE [--trust PEM]... [--json]`: the shell around `evidence_verify`: reads the bundle and the
pinned keys from files, prints what is not a pass and the verdict, and exits by the verdict."""

from __future__ import annotations

import json
import sys
import unicodedata
from pathlib import Path

import msgspec
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from crashsafe.contracts.capabilities import key_id
from crashsafe.contracts.evidence import (
    BUNDLE_FORMAT,
    BUNDLE_TYPE,
    EXPORT_TYPE,
    EvidenceBundle,
    bundle_decoder,
)
from crashsafe.domain import registry as registries
from crashsafe.evidence_findings import VERDICT_SAYS, Finding, Verdict, Verification
from crashsafe.evidence_verify import verify
from crashsafe.services.platform.settings import Settings

# Exit codes: 0 verified, 1 tampered, 2 the files could not be read as a bundle or a key, 3 incomplete (verify again
# once the run is checkpointed), 4 unchained (an older release's journal, said plainly: no evidence either way, which
# a script must never take for a pass).
EXIT = {Verdict.VERIFIED: 0, Verdict.UNCHAINED: 4, Verdict.TAMPERED: 1, Verdict.INCOMPLETE: 3}
UNREADABLE = 2


class NotABundle(ValueError):
    """A file that is not an evidence bundle this verifier reads: the message says what it is instead."""


class BadTrustedKey(ValueError):
    """A `--trust` file that is not an Ed25519 public key in PEM: the message names the file."""


def verify_command(path: Path, trust: list[Path], as_json: bool, registry_spec: str | None = None) -> int:
    """`registry_spec`: the agents whose code replays the run (`--registry`, else CRASHSAFE_REGISTRY, else the
    built-in one). Never the module the bundle names: a bundle is hostile input, and importing is running code."""
    try:
        bundle = read_bundle(path)
        trusted = trusted_raw(trusted_keys(trust)) if trust else None
    except (NotABundle, BadTrustedKey) as exc:
        print(printable(f"crashsafe verify: {exc}"), file=sys.stderr)
        return UNREADABLE
    spec = registry_spec or Settings.from_env().registry
    try:
        registry = registries.load(spec)
    except (ImportError, ValueError) as exc:
        print(printable(f"crashsafe verify: registry {spec!r}: {exc}"), file=sys.stderr)
        return UNREADABLE
    verification = verify(bundle, trusted, registry)
    sys.stdout.write(render_json(verification) if as_json else render(verification, path))
    return EXIT[verification.verdict]


class _Kind(msgspec.Struct):
    type: str = ""
    format: int = 0


def read_bundle(path: Path) -> EvidenceBundle:
    """The bundle in `path`; `NotABundle` saying what the file is instead (missing, an export, another format)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise NotABundle(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    first = raw.split(b"\n", 1)[0]
    try:
        kind = msgspec.json.decode(raw, type=_Kind)
    except (msgspec.DecodeError, msgspec.ValidationError):
        kind = None
    if (kind is None and _is_export(first)) or (kind is not None and kind.type == EXPORT_TYPE):
        raise NotABundle(
            f"{path} is a run export (`crashsafe export`), not an evidence bundle: make one with "
            "`crashsafe runs export --evidence RUN`"
        )
    if kind is None:
        raise NotABundle(f"{path} is not an evidence bundle: it is not one JSON object")
    if kind.type != BUNDLE_TYPE:
        raise NotABundle(f"{path} is not an evidence bundle: its type is {kind.type!r}, not {BUNDLE_TYPE!r}")
    if kind.format != BUNDLE_FORMAT:
        raise NotABundle(
            f"{path} is an evidence bundle of format {kind.format}; this crashsafe reads format {BUNDLE_FORMAT}: "
            "verify it with the release that made it, or a newer one"
        )
    try:
        return bundle_decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise NotABundle(f"{path} is not a readable evidence bundle: {exc}") from exc


def _is_export(line: bytes) -> bool:
    try:
        return msgspec.json.decode(line, type=_Kind).type == EXPORT_TYPE
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False


def trusted_keys(paths: list[Path]) -> list[Ed25519PublicKey]:
    """The Ed25519 public keys in these PEM files (`--trust`); `BadTrustedKey` naming the file that is not one."""
    keys: list[Ed25519PublicKey] = []
    for path in paths:
        try:
            key = load_pem_public_key(path.read_bytes())
        except OSError as exc:
            raise BadTrustedKey(f"--trust {path}: cannot be read ({exc.strerror or exc})") from exc
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise BadTrustedKey(f"--trust {path}: not a public key in PEM ({exc})") from exc
        if not isinstance(key, Ed25519PublicKey):
            raise BadTrustedKey(
                f"--trust {path}: a {type(key).__name__}, not an Ed25519 public key (the runtime's "
                "capability.pub)"
            )
        keys.append(key)
    return keys


def trusted_raw(keys: list[Ed25519PublicKey]) -> dict[str, bytes]:
    """What `verify` takes: key id -> raw public key."""
    return {key_id(k): k.public_bytes_raw() for k in keys}


def printable(text: str) -> str:
    """`text` with control and format characters escaped: a bundle's strings can neither forge a line of the
    report nor drive the terminal (as `replay.printable`, without importing the broker the replay shell needs)."""
    return "".join(
        ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch)[0] == "C" else ch
        for ch in text
    )


def _where(finding: Finding) -> str:
    if finding.position is None:
        return ""
    if finding.seq is None:
        return f"position {finding.position}: "
    return f"position {finding.position} (seq {finding.seq}, {finding.event or 'undecodable'}): "


def render(verification: Verification, path: Path) -> str:
    """One line per finding that is not a pass, the passes counted per check, then the verdict."""
    lines = [f"run {verification.run_id} ({path})"]
    lines += [f"{f.status:<9} {f.check:<10} {_where(f)}{f.message}" for f in verification.problems()]
    passed = ", ".join(f"{check} {n}" for check, n in verification.passes().items()) or "none"
    lines.append(f"passed: {passed}")
    verdict = verification.verdict
    lines.append(f"verdict: {verdict}: {VERDICT_SAYS[verdict]}")
    return "\n".join(printable(line) for line in lines) + "\n"


def render_json(verification: Verification) -> str:
    body = {
        "run_id": verification.run_id,
        "verdict": str(verification.verdict),
        "exit": EXIT[verification.verdict],
        "passed": verification.passes(),
        "findings": msgspec.to_builtins(verification.findings),
    }
    return json.dumps(body, indent=2, sort_keys=True) + "\n"
