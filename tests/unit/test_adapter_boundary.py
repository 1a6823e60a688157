"""Nothing goes around the JetStream adapter: only it (and the contracts, which name permissions) spells a
JetStream API subject."""

from __future__ import annotations

from pathlib import Path

from tests.support.paths import ROOT

# The adapter's own modules, and the public contract that states subjects and permissions.
ALLOWED = {ROOT / "services" / "platform" / "jetstream_reads.py"}
ALLOWED_FOLDERS = {ROOT / "contracts"}
# Product and tooling folders (tests/ spells API subjects on purpose: the permission attacks send them).
SEARCHED = ("crashsafe", "services", "domain", "sandbox", "evals", "examples", "bench")
LINKED = {"contracts", "domain", "services", "sandbox", "evals", "examples"}


def _sources() -> list[Path]:
    found: list[Path] = []
    for top in SEARCHED:
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).parts
            if parts[0] == "crashsafe" and len(parts) > 1 and parts[1] in LINKED:
                continue  # a link into a folder searched under its own name
            if path in ALLOWED or any(folder in path.parents for folder in ALLOWED_FOLDERS):
                continue
            found.append(path)
    return found


def test_only_the_jetstream_adapter_spells_a_jetstream_api_subject() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in _sources()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "$JS." in line
    ]
    assert not offenders, (
        "JetStream API subjects outside the adapter (services/platform/jetstream*.py); give the Broker the call"
        " instead:\n" + "\n".join(offenders)
    )


def test_the_search_sees_the_adapter_and_the_services() -> None:
    sources = set(_sources())
    assert ROOT / "services" / "console" / "live.py" in sources
    assert ROOT / "services" / "providers" / "provider_views.py" in sources
    assert ROOT / "services" / "platform" / "jetstream_reads.py" not in sources
    assert "$JS.API.DIRECT.GET" in (ROOT / "services" / "platform" / "jetstream_reads.py").read_text()
