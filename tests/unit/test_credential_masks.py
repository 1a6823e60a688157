"""A provider's credential never reaches a journal or an operator's page in any form its provider or SDK echoes it:
its text, base64 (alone, inside `user:secret` Basic auth, either alphabet, padded or not) or percent-encoded, in
an answer's detail, body (keys and nested lists too) or ref (issue 31, item 8). A credential too short to mask
without masking ordinary text is refused at start, naming its variable."""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote, quote_plus, unquote, unquote_plus

import pytest

from crashsafe.contracts.errors import InvalidSetting
from crashsafe.contracts.provider_settings import DEFAULT_PROVIDER, ProviderSettings
from crashsafe.contracts.tool_messages import ActionRequest, Answer
from crashsafe.domain.credential_masks import MASK, CredentialMask
from crashsafe.domain.registry import ProviderAnswer, ProviderCall, PythonOperation, Tool
from crashsafe.services.platform.settings import Settings
from crashsafe.services.providers.provider_calls import Providers
from tests.support.python_providers import ORDER

# Chosen so that every encoding differs: `+` and `/` in its base64, a space, `&`, `?`, `=` and a non-ASCII letter.
SECRET = "sk_live_4eC39Hq+Lyj/ü?w x&=Z"


def b64(raw: bytes, urlsafe: bool = False) -> str:
    return (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(raw).decode()


def echoes(secret: str) -> dict[str, str]:
    """How providers and SDKs echo a credential back: in an error's text, a logged request, a record."""
    raw = secret.encode()
    return {
        "base64": b64(raw),
        "base64 without padding": b64(raw).rstrip("="),
        "urlsafe base64": b64(raw, urlsafe=True),
        "urlsafe base64 without padding": b64(raw, urlsafe=True).rstrip("="),
        "Basic auth user:secret": f"Basic {b64(b'shop_account:' + raw)}",
        "Basic auth user:secret, urlsafe": f"Basic {b64(b'acct_1:' + raw, urlsafe=True)}",
        "Basic auth secret: (Stripe's)": f"Basic {b64(raw + b':')}",
        "Basic auth secret:password": f"Basic {b64(raw + b':x')}",
        "quote": quote(secret, safe=""),
        "quote, / kept": quote(secret),
        "quote_plus": quote_plus(secret),
        "quote, lower-case hex": re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), quote(secret)),
        "its text": secret,
    }


def readable(text: str, secret: str) -> bool:
    """Whether any 4 bytes of `secret` in a row can be read back from `text` (as it is, percent-decoded), or any
    3 from base64 in it (a run of base64 characters, decoded from each of 4 offsets, in either alphabet)."""
    raw = secret.encode()
    texts = {text.encode(), unquote(text).encode(), unquote_plus(text).encode()}
    if any(raw[i : i + 4] in t for t in texts for i in range(len(raw) - 3)):
        return True
    for run in re.findall(r"[A-Za-z0-9+/_-]{4,}", text):
        for offset in range(4):
            chunk = run[offset:]
            chunk = chunk[: len(chunk) // 4 * 4].replace("-", "+").replace("_", "/")
            decoded = base64.b64decode(chunk) if chunk else b""
            if any(raw[i : i + 3] in decoded for i in range(len(raw) - 2)):
                return True
    return False


class Answers:
    """A provider client that answers (or raises) what the test says."""

    def __init__(self, answer: ProviderAnswer | Exception) -> None:
        self.answer = answer

    async def call(self, call: ProviderCall) -> ProviderAnswer:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    async def lookup(self, call: ProviderCall) -> ProviderAnswer:
        return await self.call(call)


def request() -> ActionRequest:
    now = datetime.now(UTC)
    return ActionRequest(
        run_id="run_1",
        step_no=1,
        tool=ORDER.name,
        family=ORDER.family,
        args={"item": "desk"},
        key="run_1:1",
        input_hash="h",
        timeout_s=2.0,
        deadline_at=now + timedelta(seconds=30),
        requested_at=now,
    )


async def answered(answer: ProviderAnswer | Exception, credential: str | None = SECRET) -> ProviderAnswer:
    """What the executor journals of a Python operation's answer, its provider holding `credential`."""
    client = Answers(answer)
    tool = Tool(ORDER, PythonOperation(lambda settings: client))
    endpoints = {DEFAULT_PROVIDER: ProviderSettings(DEFAULT_PROVIDER, credential=credential)}
    return await Providers(endpoints).call(tool, request(), 1.0)


def test_every_echo_here_is_its_own_encoding_and_reads_back_as_the_secret() -> None:
    """The test's own premise: the echoes differ, and the check below finds the secret in each of them."""
    forms = echoes(SECRET)
    assert len(set(forms.values())) == len(forms)
    assert all(readable(echo, SECRET) for echo in forms.values())


@pytest.mark.parametrize("how", list(echoes(SECRET)))
async def test_a_credential_echoed_in_an_exceptions_text_is_masked_in_every_encoding(how: str) -> None:
    echo = echoes(SECRET)[how]
    answer = await answered(PermissionError(f"401 for request with Authorization: {echo} (check the key)"))
    assert answer.kind == Answer.UNKNOWN and MASK in answer.detail
    assert not readable(answer.detail, SECRET), answer.detail
    assert answer.detail.endswith(" (check the key)") and "PermissionError: 401 for request" in answer.detail


@pytest.mark.parametrize("how", list(echoes(SECRET)))
async def test_a_credential_echoed_in_a_body_its_keys_its_nested_lists_and_the_ref_is_masked(
    how: str,
) -> None:
    """A refusal's body is the receipt's result and its ref the receipt's `provider_ref`: both journaled."""
    echo = echoes(SECRET)[how]
    body = {
        "error": {
            "code": "auth",
            "sent": [[{"authorization": echo}], f"x-api-key={echo}"],
            echo: "a header name the SDK logged",
        },
    }
    answer = await answered(ProviderAnswer(Answer.REJECTED, body, ref=f"req_{echo}", detail=f"sent {echo}"))
    assert answer.kind == Answer.REJECTED and answer.ref is not None
    shown = [answer.detail, answer.ref, str(answer.body)]
    assert all(MASK in text and not readable(text, SECRET) for text in shown), shown
    # The provider's error is the refusal's body (its code the receipt's), as an HTTP provider's is.
    assert answer.body["code"] == "auth" and len(answer.body) == 3


def test_base64_is_masked_with_the_characters_that_hold_bits_of_the_secret_and_its_neighbours() -> None:
    """Where the secret starts or ends inside a 3-byte group, the group's characters hold bits of both: they are
    masked too (up to 3 either side), so not even one byte of the secret can be read back around the mask."""
    mask = CredentialMask.of(SECRET)
    raw = SECRET.encode()
    # 13 bytes of user name: the secret's first 2 bytes share a group with the ":" ("O" holds only its bits).
    assert mask.text(f"Basic {b64(b'shop_account:' + raw)}") == f"Basic c2hvcF9hY2NvdW50O{MASK}"
    assert base64.b64decode("c2hvcF9hY2NvdW50") == b"shop_account"
    # 29 bytes of secret: its last 2 share a group with the ":" of the password ("6" holds only its bits).
    assert mask.text(f"Basic {b64(raw + b':x')}") == f"Basic {MASK}6eA=="


async def test_an_answer_that_does_not_echo_the_credential_is_kept_as_it_is() -> None:
    """No noise: a credential of the shortest length allowed masks nothing of an ordinary answer (ids, words,
    another credential's base64, a URL-encoded query)."""
    short = "Tr0ub4d&"
    body = {
        "payment_id": "pay_3MtwBwLkdIwHu7ix28a3tqPa",
        "note": "Troubadour paid; refund requested by the guest",
        "echo": f"Basic {b64(b'other:sk_test_another_key')}",
        "query": quote_plus("guest=alice&amount=24000 EUR"),
        "list": [["bk_1", 24000, None, True]],
    }
    ok = ProviderAnswer(Answer.OK, body, ref="pay_3MtwBwLkdIwHu7ix28a3tqPa", detail="captured")
    assert await answered(ok, credential=short) == ok


@pytest.mark.parametrize("credential", ["", None])
async def test_a_provider_with_no_credential_masks_nothing(credential: str | None) -> None:
    ok = ProviderAnswer(Answer.OK, {"sk": "[]", "": ""}, ref="r", detail="d")
    assert await answered(ok, credential=credential) == ok


def test_a_credential_too_short_to_mask_is_refused_at_start_naming_its_variable(tmp_path: Path) -> None:
    """Shorter than 8 characters, its base64 pieces are 4 characters that ordinary ids contain: masking them
    would turn answers into noise, and masking only its text would journal its encodings. So it is refused, at
    start, in one line that names the variable and never the credential."""
    variable = "CRASHSAFE_PROVIDER_DEFAULT_CREDENTIAL_FILE"
    with pytest.raises(InvalidSetting) as built:
        Providers({DEFAULT_PROVIDER: ProviderSettings(DEFAULT_PROVIDER, credential="k3y_7ab")})
    assert built.value.variable == variable and "at least 8 characters" in built.value.message
    assert "k3y_7ab" not in built.value.message
    path = tmp_path / "default.key"
    path.write_text("k3y_7ab\n")
    with pytest.raises(InvalidSetting) as read:
        Settings.from_env({variable: str(path)})
    assert read.value.variable == variable and read.value.value == str(path)
    assert "at least 8 characters (this one has 7)" in read.value.message
    assert "k3y_7ab" not in read.value.message
    path.write_text("k3y_7abc\n")
    assert Settings.from_env({variable: str(path)}).provider(DEFAULT_PROVIDER) == ProviderSettings(
        DEFAULT_PROVIDER, "http://127.0.0.1:8090", "k3y_7abc"
    )


def test_a_mask_never_shows_its_credential_in_a_repr() -> None:
    assert SECRET not in repr(CredentialMask.of(SECRET)) and quote(SECRET) not in repr(
        CredentialMask.of(SECRET)
    )
