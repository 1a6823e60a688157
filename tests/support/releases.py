"""A previous release installed from the repository's own history into a venv of its own, as its image would be.

The release record (contracts/releases.json) names each release's commit; `git archive` takes its tree out of
this checkout's history (nothing is downloaded) and pip installs it, without its dependencies, into a fresh venv
that reads them from this one's site-packages (a `.pth` line): a release's dependencies are a range this venv
already satisfies, and installing them again from the index would cost a CI run a minute. The install is kept
per commit and venv under the temporary directory and made once, under a file lock, however many workers ask.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from crashsafe.contracts.release import Release

REPOSITORY = Path(__file__).resolve().parents[2]
_DONE = "installed"


@dataclass(frozen=True, slots=True)
class ReleaseInstall:
    release: Release
    python: str  # the release venv's interpreter: `python -m crashsafe.cli …` runs that release


class ReleaseUnavailable(RuntimeError):
    """The release's commit is not in this checkout's history (a shallow clone) or would not install."""


def install(release: Release, root: Path | None = None) -> ReleaseInstall:
    """The release installed in its own venv (made once per commit; later calls return it at once)."""
    # Per commit and per venv it draws its dependencies from: a clone with a venv of its own builds its own.
    deps = hashlib.sha256(sysconfig.get_paths()["purelib"].encode()).hexdigest()[:12]
    home = (root or Path(tempfile.gettempdir()) / "crashsafe-releases") / f"{release.commit}-{deps}"
    home.mkdir(parents=True, exist_ok=True)
    python = home / "venv" / "bin" / "python"
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / _DONE).exists():
            _build(release, home)
            (home / _DONE).write_text(release.version + "\n")
    return ReleaseInstall(release=release, python=str(python))


def _run(args: list[str], what: str, **kwargs: object) -> None:
    done = subprocess.run(args, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise ReleaseUnavailable(f"{what} failed ({done.returncode}): {(done.stderr or done.stdout)[-2000:]}")


def venv_on_our_dependencies(where: Path) -> tuple[Path, str]:
    """A venv with no packages of its own that imports its dependencies from this one's site-packages (a `.pth`
    line, read after its own): its interpreter, and its own site-packages, where what is installed into it goes."""
    done = subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(where)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise ReleaseUnavailable(f"making a venv at {where} failed: {done.stderr[-2000:]}")
    python = where / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "_crashsafe_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python, purelib


def _build(release: Release, home: Path) -> None:
    for part in ("src", "venv"):
        shutil.rmtree(home / part, ignore_errors=True)
    probe = subprocess.run(
        ["git", "-C", str(REPOSITORY), "cat-file", "-e", f"{release.commit}^{{commit}}"], capture_output=True
    )
    if probe.returncode != 0:
        raise ReleaseUnavailable(
            f"release {release.version}'s commit {release.commit} is not in {REPOSITORY}'s history: a shallow"
            " clone? `git fetch --unshallow` brings it"
        )
    (home / "src").mkdir()
    archive = subprocess.Popen(
        ["git", "-C", str(REPOSITORY), "archive", release.commit], stdout=subprocess.PIPE
    )
    _run(["tar", "-x", "-C", str(home / "src")], "unpacking the release", stdin=archive.stdout)
    assert archive.stdout is not None
    archive.stdout.close()
    if archive.wait() != 0:
        raise ReleaseUnavailable(f"git archive {release.commit} failed")
    # No pip of its own: this venv's pip installs into it (`--python`), and the build backend then finds this
    # venv's setuptools through the `.pth` line rather than the older one a venv's own pip would bring.
    python, _ = venv_on_our_dependencies(home / "venv")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-build-isolation",
            str(home / "src"),
        ],
        f"installing release {release.version}",
        env={**os.environ, "PIP_NO_INPUT": "1"},
    )
