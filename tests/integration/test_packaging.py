"""What `pip install` puts into site-packages: the wheel built from this tree holds `crashsafe` alone at the top."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.releases import venv_on_our_dependencies

EVIDENCE = ROOT / "tests" / "fixtures" / "evidence"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel `pip wheel` builds from this tree (once for the module)."""
    tmp_path = tmp_path_factory.mktemp("wheel")
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
    (built,) = tmp_path.glob("crashsafe-*.whl")
    return built


def test_the_wheel_installs_only_the_crashsafe_namespace(wheel: Path) -> None:
    """An application's own `services` or `contracts` package must never collide with ours (issue 18)."""
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


def test_an_evidence_bundle_verifies_offline_with_only_the_wheel(wheel: Path, tmp_path: Path) -> None:
    """Issue 34's promise: a run's bundle checks on a machine with the wheel alone (its dependencies from this
    venv, no source tree, no broker, no credentials); one byte changed in it fails, naming the event."""
    python, purelib = venv_on_our_dependencies(tmp_path / "venv")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", str(wheel)],
        check=True,
        timeout=120,
    )
    bundle, key = tmp_path / "run.evidence.json", tmp_path / "runtime.pub"
    shutil.copy(EVIDENCE / "demo_run.json", bundle)
    shutil.copy(EVIDENCE / "runtime.pub", key)

    def verify(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(python), "-m", "crashsafe.cli", "verify", str(path), "--trust", str(key)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)},
        )

    where = subprocess.run(
        [str(python), "-c", "import crashsafe; print(crashsafe.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    ).stdout
    assert where.startswith(purelib), where  # the wheel's, not this tree's
    passed = verify(bundle)
    assert passed.returncode == 0 and "verdict: verified" in passed.stdout, passed.stdout + passed.stderr
    document = json.loads(bundle.read_text())
    entry = document["journal"][4]
    data = bytearray(base64.b64decode(entry["data"]))
    data[data.index(b'"step_no":') + len(b'"step_no":')] ^= 1  # one digit of one event, one bit
    entry["data"] = base64.b64encode(bytes(data)).decode()
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(document))
    failed = verify(tampered)
    assert failed.returncode == 1 and "tampered" in failed.stdout, failed.stdout + failed.stderr
    assert "position 5" in failed.stdout, failed.stdout


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
