"""A provider's credential masked out of what it answers, in every form a provider or an SDK echoes it: built once
per credential (at start), applied to each answer before it is journaled or shown. Pure."""

from __future__ import annotations

import base64
import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, quote_plus

from crashsafe.contracts.provider_settings import unmaskable
from crashsafe.domain.registry import ProviderAnswer

MASK = "[credential]"
# The base64 alphabets, standard and URL-safe: the characters around an encoded piece that carry its edge bits.
_B64 = "A-Za-z0-9+/_-"


def _percent_forms(credential: str) -> set[str]:
    """The credential as a query string or a form body carries it: `quote` and `quote_plus`, with `/` kept or
    not, and with the lower-case hex some encoders write (`%2f`)."""
    forms = {quote(credential, safe=safe) for safe in ("", "/")}
    forms |= {quote_plus(credential, safe=safe) for safe in ("", "/")}
    return forms | {re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), f) for f in forms}


def _base64_pieces(credential: str) -> set[str]:
    """What base64 shows of the credential wherever it sits in what was encoded (alone, `user:secret` for Basic
    auth, `secret:` as Stripe's SDK sends it): the credential's bytes from each of the three alignments, whole
    3-byte groups only, in both alphabets. The groups it shares with its neighbours are caught around a piece."""
    raw = credential.encode()
    pieces: set[str] = set()
    for shift in range(3):
        whole = (len(raw) - shift) // 3 * 3
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            pieces.add(encode(raw[shift : shift + whole]).decode())
    return pieces


def _longest_first(forms: set[str]) -> str:
    return "|".join(re.escape(f) for f in sorted(forms, key=lambda f: (-len(f), f)))


@dataclass(frozen=True, slots=True)
class CredentialMask:
    """One credential's every echoed form as one pattern: its text, percent-encoded, and base64 (a piece, with the
    up to 3 characters either side that hold some of its bits, and any padding)."""

    _pattern: re.Pattern[str] = field(repr=False)

    @classmethod
    def of(cls, credential: str) -> CredentialMask:
        """The mask of `credential`; a ValueError if it is `unmaskable` (the shells refuse such a setting first)."""
        why = unmaskable(credential)
        if why is not None:
            raise ValueError(why)
        pieces = _longest_first(_base64_pieces(credential))
        texts = _longest_first({credential} | _percent_forms(credential))
        return cls(re.compile(f"{texts}|[{_B64}]{{0,3}}(?:{pieces})[{_B64}]{{0,3}}={{0,2}}"))

    def text(self, text: str) -> str:
        return self._pattern.sub(MASK, text)

    def value(self, value: Any) -> Any:
        """A JSON value with the credential masked in every string, dict keys and nested lists included."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.value(k): self.value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v) for v in value]
        return value

    def answer(self, answer: ProviderAnswer) -> ProviderAnswer:
        """The answer as it may be journaled and shown: masked in its detail, its body and its ref."""
        return dataclasses.replace(
            answer,
            detail=self.text(answer.detail),
            body=self.value(answer.body),
            ref=self.text(answer.ref) if answer.ref is not None else None,
        )
