"""The release is said the same everywhere: contracts/release.py's VERSION, the changelog's newest heading, the
release record (contracts/releases.json) of the releases before it, and `crashsafe --version`."""

from __future__ import annotations

import re

import pytest

from crashsafe.cli_arguments import build_parser
from crashsafe.contracts.headers import Header
from crashsafe.contracts.release import (
    RUNS_BESIDE_SINCE,
    VERSION,
    VERSION_HEADER,
    previous_release,
    releases,
    version_key,
)
from crashsafe.contracts.subjects import Namespace
from crashsafe.upgrade_command import narrow_readers
from tests.support.paths import ROOT

pytestmark = pytest.mark.unit

HEADING = re.compile(r"^## (\S+)\s*$", re.MULTILINE)


def test_the_changelogs_newest_heading_is_this_release_and_every_release_has_one() -> None:
    headings = HEADING.findall((ROOT / "CHANGELOG.md").read_text())
    assert headings and headings[0] == VERSION, "add a `## <VERSION>` entry at the top of CHANGELOG.md"
    assert headings == sorted(headings, key=version_key, reverse=True), "newest first"
    assert {r.version for r in releases()} <= set(headings)


def test_the_release_record_names_older_releases_by_their_commits() -> None:
    recorded = releases()
    assert recorded, "contracts/releases.json names no release"
    versions = [version_key(r.version) for r in recorded]
    assert versions == sorted(versions) and len(set(versions)) == len(versions), "ascending, each once"
    for release in recorded:
        assert re.fullmatch(r"[0-9a-f]{40}", release.commit), release
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", release.date), release
        assert version_key(release.version) < version_key(VERSION), (
            f"{release.version} is not older than {VERSION}"
        )


def test_this_release_rolls_forward_from_and_back_to_0_4_0() -> None:
    previous = previous_release()
    assert previous is not None and previous.version == "0.4.0"
    assert previous.commit.startswith("01477a5")
    assert version_key(RUNS_BESIDE_SINCE) <= version_key(previous.version), (
        "runs beside the release before it"
    )


def test_the_version_header_has_one_home() -> None:
    assert VERSION_HEADER == Header.VERSION.value == "Crashsafe-Version"


def test_crashsafe_version_prints_the_release(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"crashsafe {VERSION}"


def test_upgrade_check_names_each_reader_of_the_journal_that_misses_the_bus() -> None:
    """An analytics durable on `<ns>.run.*.*` reads no intent or receipt once the journal is the bus (0.4.0)."""
    ns = Namespace("prod")
    found = narrow_readers(
        [
            ("analytics", "prod.run.*.*"),
            ("one_run", "prod.run.run_1.*"),
            ("wide", "prod.run.*.>"),
            ("projector_planner", "prod.run.*.milestone"),
            ("executor_payment_p0_journal", "prod.run.*.intent.payment.0"),
            ("other_ns", "dev.run.*.*"),
        ],
        ns,
    )
    assert [f.split(" ")[1] for f in found] == ["analytics", "one_run"]
    assert "filter prod.run.*.> to read each event" in found[0]
    assert "filter prod.run.run_1.> to read each event" in found[1]
