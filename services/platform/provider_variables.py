"""Reads the named providers' settings (CRASHSAFE_PROVIDER_<NAME>_URL, _CREDENTIAL_FILE) out of the environment
Settings was given, each credential read once from its file: a name the product cannot use stops the process."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from crashsafe.contracts.errors import InvalidSetting
from crashsafe.contracts.provider_settings import (
    CREDENTIAL_FILE_SUFFIX,
    DEFAULT_PROVIDER,
    DEFAULT_URL_VARIABLE,
    PROVIDER_NAME,
    PROVIDER_PREFIX,
    URL_SUFFIX,
    ProviderSettings,
    credential_variable,
    unmaskable,
    url_variable,
)

_EITHER = f"{PROVIDER_PREFIX}<NAME>{URL_SUFFIX} or {PROVIDER_PREFIX}<NAME>{CREDENTIAL_FILE_SUFFIX}"


def provider_settings(env: Mapping[str, str]) -> tuple[ProviderSettings, ...]:
    """Every provider the environment names, by name; the default provider's URL is CRASHSAFE_SANDBOX_URL (only
    its credential file is read here). The credentials are read now, once: a rotation is a restart."""
    urls: dict[str, str] = {}
    files: dict[str, str] = {}
    for variable, value in sorted(env.items()):
        if not variable.startswith(PROVIDER_PREFIX) or value == "":
            continue
        rest = variable.removeprefix(PROVIDER_PREFIX)
        if rest.endswith(CREDENTIAL_FILE_SUFFIX):
            files[_name(variable, rest.removesuffix(CREDENTIAL_FILE_SUFFIX))] = value
        elif rest.endswith(URL_SUFFIX):
            urls[_name(variable, rest.removesuffix(URL_SUFFIX))] = value
        else:
            raise InvalidSetting(variable=variable, value=value, expected=f"unset, or one of {_EITHER}")
    if DEFAULT_PROVIDER in urls:
        raise InvalidSetting(
            variable=f"{PROVIDER_PREFIX}{DEFAULT_PROVIDER.upper()}{URL_SUFFIX}",
            value=urls[DEFAULT_PROVIDER],
            expected=f"unset: the default provider's base URL is {DEFAULT_URL_VARIABLE}",
        )
    for name, url in urls.items():
        if not url.startswith(("http://", "https://")):
            raise InvalidSetting(
                variable=url_variable(name), value=url, expected="an http:// or https:// URL"
            )
    return tuple(
        ProviderSettings(name, urls.get(name, ""), _credential(name, files[name]) if name in files else None)
        for name in sorted(urls.keys() | files.keys())
    )


def _name(variable: str, upper: str) -> str:
    name = upper.lower()
    if not PROVIDER_NAME.match(name):
        raise InvalidSetting(
            variable=variable,
            value=upper,
            expected="a provider name in the variable: a letter, then letters, digits or _",
        )
    return name


def _credential(name: str, path: str) -> str:
    """The file's content, stripped; the error names the file, never what it holds."""
    variable = credential_variable(name)
    try:
        secret = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError):
        raise InvalidSetting(
            variable=variable, value=path, expected="a file this process can read, holding the credential"
        ) from None
    if not secret:
        raise InvalidSetting(
            variable=variable, value=path, expected="a file holding the credential (it is empty)"
        )
    if why := unmaskable(secret):
        raise InvalidSetting(variable=variable, value=path, expected=f"a file holding {why}")
    return secret
