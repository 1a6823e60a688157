"""Per-provider settings: each named provider's base URL and credential file, read once at start; a provider the
registry names that nothing configures stops the process in one line naming the variable to set."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from crashsafe.contracts.provider_settings import DEFAULT_PROVIDER, ProviderSettings
from crashsafe.services.platform.settings import InvalidSetting, Settings


def secret(tmp_path: Path, text: str = "sk_live_abc\n", name: str = "provider.key") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_each_provider_gets_its_url_and_the_credential_its_file_holds(tmp_path: Path) -> None:
    s = Settings.from_env(
        {
            "CRASHSAFE_SANDBOX_URL": "http://sandbox:8090",
            "CRASHSAFE_PROVIDER_STRIPE_URL": "https://api.stripe.example",
            "CRASHSAFE_PROVIDER_STRIPE_CREDENTIAL_FILE": secret(tmp_path),
            "CRASHSAFE_PROVIDER_PMS_2_URL": "http://pms:9000",
            "CRASHSAFE_PROVIDER_DEFAULT_CREDENTIAL_FILE": secret(tmp_path, "sandbox-token", "default.key"),
        }
    )
    assert s.provider("stripe") == ProviderSettings("stripe", "https://api.stripe.example", "sk_live_abc")
    assert s.provider("pms_2") == ProviderSettings("pms_2", "http://pms:9000", None)
    assert s.provider(DEFAULT_PROVIDER) == ProviderSettings(
        DEFAULT_PROVIDER, "http://sandbox:8090", "sandbox-token"
    )
    assert s.provider("crm") is None
    assert "sk_live_abc" not in repr(s), "a credential is never in a repr (nor a log line)"


def test_the_default_provider_is_at_the_sandbox_url_with_no_credential_by_default() -> None:
    assert Settings.from_env({}).provider(DEFAULT_PROVIDER) == ProviderSettings(
        DEFAULT_PROVIDER, "http://127.0.0.1:8090", None
    )
    assert Settings.from_env({}).providers == ()


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("CRASHSAFE_PROVIDER_STRIPE_CREDENTIAL_FILE", "/no/such/key", "a file this process can read"),
        ("CRASHSAFE_PROVIDER_STRIPE_URL", "api.stripe.example", "an http:// or https:// URL"),
        ("CRASHSAFE_PROVIDER_STRIPE_TOKEN", "sk", "unset, or one of CRASHSAFE_PROVIDER_<NAME>_URL"),
        ("CRASHSAFE_PROVIDER_9X_URL", "http://x", "a provider name in the variable"),
        (
            "CRASHSAFE_PROVIDER_DEFAULT_URL",
            "http://x",
            "the default provider's base URL is CRASHSAFE_SANDBOX_URL",
        ),
    ],
)
def test_an_unusable_provider_setting_names_the_variable(variable: str, value: str, expected: str) -> None:
    with pytest.raises(InvalidSetting) as raised:
        Settings.from_env({variable: value})
    assert raised.value.variable == variable
    assert expected in raised.value.message


def test_an_unreadable_or_empty_credential_file_is_refused_without_echoing_it(tmp_path: Path) -> None:
    variable = "CRASHSAFE_PROVIDER_STRIPE_CREDENTIAL_FILE"
    with pytest.raises(InvalidSetting) as a_folder:
        Settings.from_env({variable: str(tmp_path)})  # unreadable as a file, even for root
    assert a_folder.value.variable == variable and "a file this process can read" in a_folder.value.message
    with pytest.raises(InvalidSetting) as empty:
        Settings.from_env({variable: secret(tmp_path, " \n")})
    assert empty.value.variable == variable and "it is empty" in empty.value.message
    if os.geteuid() != 0:  # root reads any file
        locked = secret(tmp_path, "sk_locked")
        Path(locked).chmod(0)
        with pytest.raises(InvalidSetting) as unreadable:
            Settings.from_env({variable: locked})
        assert "sk_locked" not in unreadable.value.message


def test_an_executor_whose_registry_names_an_unconfigured_provider_stops_in_one_line() -> None:
    env = {**os.environ, "CRASHSAFE_REGISTRY": "tests.support.python_providers:registry"}
    env["CRASHSAFE_PROVIDER_SHOP_URL"] = "http://127.0.0.1:9"
    done = subprocess.run(
        [sys.executable, "-m", "crashsafe.cli", "serve", "executor", "--tool", "orders"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        "crashsafe: CRASHSAFE_PROVIDER_CRM_URL='' is not usable: the base URL of provider 'crm': "
        "tool 'send_note' names it"
    )
