"""The journals' archive: the port every reader of an archived run and the archiver use (put, get, exists by run id;
the audit lists them), and its one adapter, a directory (a mounted volume, or an object store mounted as one;
docs/decisions.md says why a directory and what an S3 adapter implements).

A put is atomic and durable before it returns: the bytes go to a temporary file beside the target, are fsynced,
renamed over the name and the directory fsynced, so a reader sees no object or a whole one, and a crash leaves at
worst a temporary file (swept by the next put of that run). Blocking file calls run in a thread: an fsync on a
network volume must not stall a service's event loop."""

from __future__ import annotations

import asyncio
import os
import re
import uuid
from pathlib import Path
from typing import Protocol

from crashsafe.contracts.archive import archive_name
from crashsafe.contracts.errors import ArchiveUnavailable

# A run id is one subject token: a file name within the namespace's folder, never a path out of it.
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,128}")


class Archive(Protocol):
    """Where ended runs' journals are kept once purged from the stream, one object per run id."""

    def name(self, run_id: str) -> str:
        """The object's name, for errors and dead letters (`<ns>/runs/<run_id>.json`)."""
        ...

    async def put(self, run_id: str, data: bytes) -> None:
        """Store `data` under the run's name, whole and durable before returning (ArchiveUnavailable if not)."""
        ...

    async def get(self, run_id: str) -> bytes | None:
        """The object's bytes; None if there is none."""
        ...

    async def exists(self, run_id: str) -> bool:
        """Whether the run has an object (the gateway's one question per new run)."""
        ...

    async def runs(self) -> list[str]:
        """Every run id with an object (the audit's: a provider's listed effect may have its intent in one)."""
        ...


class FileArchive:
    """The archive as a directory: `<root>/<ns>/runs/<run_id>.json`."""

    def __init__(self, root: Path, namespace: str) -> None:
        self.root = root
        self.namespace = namespace

    def name(self, run_id: str) -> str:
        return archive_name(self.namespace, run_id)

    def _path(self, run_id: str) -> Path | None:
        return self.root / self.name(run_id) if _TOKEN.fullmatch(run_id) else None

    async def put(self, run_id: str, data: bytes) -> None:
        path = self._path(run_id)
        if path is None:
            raise ArchiveUnavailable(f"{run_id!r} is not a run id to archive under", archive=str(self.root))
        try:
            await asyncio.to_thread(_write_atomically, path, data)
        except OSError as exc:
            raise ArchiveUnavailable(
                f"could not write {self.name(run_id)} under {self.root}: {exc}; check the volume"
                " (CRASHSAFE_ARCHIVE_DIR) is mounted and writable",
                archive=self.name(run_id),
            ) from exc

    async def get(self, run_id: str) -> bytes | None:
        path = self._path(run_id)
        if path is None:
            return None
        try:
            return await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ArchiveUnavailable(
                f"could not read {self.name(run_id)} under {self.root}: {exc}; check the volume"
                " (CRASHSAFE_ARCHIVE_DIR) is mounted and readable",
                archive=self.name(run_id),
            ) from exc

    async def exists(self, run_id: str) -> bool:
        path = self._path(run_id)
        if path is None:
            return False
        # A stat, not a read: the gateway asks this for every new run.
        return await asyncio.to_thread(path.is_file)

    async def runs(self) -> list[str]:
        folder = (self.root / self.name("x")).parent

        def listed() -> list[str]:
            names = (p.name.removesuffix(".json") for p in folder.glob("*.json"))
            return sorted(n for n in names if _TOKEN.fullmatch(n))

        try:
            return await asyncio.to_thread(listed)
        except OSError as exc:
            raise ArchiveUnavailable(
                f"could not list {folder}: {exc}; check the volume (CRASHSAFE_ARCHIVE_DIR)",
                archive=str(folder),
            ) from exc


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        stale.unlink(missing_ok=True)  # a put that crashed before its rename
    temporary = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself survives a power cut
    finally:
        os.close(directory)


def open_archive(root: Path | None, namespace: str) -> FileArchive | None:
    """The deployment's archive (CRASHSAFE_ARCHIVE_DIR), or None where none is configured."""
    return FileArchive(root, namespace) if root is not None else None
