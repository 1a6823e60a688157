"""What `pip install` puts into site-packages: the wheel built from this tree holds `crashsafe` alone at the top."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.support.paths import ROOT


def test_the_wheel_installs_only_the_crashsafe_namespace(tmp_path: Path) -> None:
    """An application's own `services` or `contracts` package must never collide with ours (issue 18)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            ".",
        ],
        cwd=ROOT,
        check=True,
        timeout=120,
    )
    (wheel,) = tmp_path.glob("crashsafe-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"crashsafe", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}, tops
    # The linked folders travel inside the namespace, with the data files the services read at run time.
    for path in (
        "crashsafe/domain/fold.py",
        "crashsafe/contracts/lock.json",
        "crashsafe/services/runtime/bootstrap.py",
        "crashsafe/services/console/templates/base.html",
        "crashsafe/sandbox/app.py",
        # `crashsafe new agent`'s templates, and the marker that lets an adopter's mypy read crashsafe.sdk's types.
        "crashsafe/templates/agent/agent.py.tmpl",
        "crashsafe/templates/agent/tests/test_agent.py.tmpl",
        "crashsafe/py.typed",
    ):
        assert path in names, path


def _copy_sources(tree: Path) -> None:
    """The files git knows or would add, links kept as links (the crashsafe/<folder> links are the point)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source, target = ROOT / name, tree / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the work tree, not yet in git's index
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            os.symlink(os.readlink(source), target)
        else:
            shutil.copy2(source, target)
