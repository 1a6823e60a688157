"""A warm interpreter the stack forks its services from: a service starts in tens of milliseconds, not a second
of imports, so a supervised restart is quick and a stack of nine services costs a tenth of the CPU to start.

The fork server imports what every service imports, then, asked for a service, forks twice: the middle process
exits at once, so the service is re-parented to the stack's process (a child subreaper, Linux's
PR_SET_CHILD_SUBREAPER) and the stack waits on it, signals it and reads its exit status as it would a child it
started itself. Each service is its own session, its log on stdout and stderr, its environment its own: nothing the
server imported reads the environment at import time (settings are read by the service, at start).

Where Linux's subreaper is not available the stack starts each service as a fresh interpreter, as before.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib
import io
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

# What the services import: loaded once here, shared copy-on-write by every service forked afterwards.
PRELOAD = (
    "crashsafe.cli",
    "crashsafe.domain.registry",
    "crashsafe.services.platform.settings",
    "crashsafe.services.runtime.bootstrap",
    "crashsafe.services.executor.bootstrap",
    "crashsafe.services.projector.bootstrap",
    "crashsafe.services.reconciler.bootstrap",
    "crashsafe.services.gateway.bootstrap",
    "crashsafe.services.console.console_router",
    "crashsafe.sandbox.app",
)
_PR_SET_CHILD_SUBREAPER = 36
_subreaper = 0  # the pid that made itself a subreaper
_subreaper_lock = threading.Lock()
_shared: dict[str, ForkServer] = {}
_shared_lock = threading.Lock()


class ForkServerError(RuntimeError):
    """The fork server could not start a service; the stack falls back to a fresh interpreter."""


def become_subreaper() -> bool:
    """Make this process the parent of orphaned descendants (Linux only); True if it is one now. Remembered per
    pid: the kernel's flag is not inherited by a fork of this process."""
    global _subreaper
    with _subreaper_lock:
        if _subreaper != os.getpid() and sys.platform == "linux":
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                _subreaper = os.getpid() if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0 else 0
            except (OSError, AttributeError):
                _subreaper = 0
        return _subreaper == os.getpid()


class ForkedService:
    """A service forked by the server and adopted by this process: the part of `subprocess.Popen` the stack uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:
                    # Reaped elsewhere: it is gone, with a status this process can no longer learn.
                    self.returncode = -1
                else:
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(["crashsafe", "serve"], timeout or 0.0)
            time.sleep(0.005)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The stack's side: starts the server once, then asks it for services."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process
        self._lock = threading.Lock()

    @classmethod
    def shared(cls, env: Mapping[str, str]) -> ForkServer:
        """This process's one server, started on first use (or again, if it died) and stopped at exit. The
        environment it starts with is no service's: each service brings its own."""
        with _shared_lock:
            server = _shared.get("server")
            if server is None or server._process.poll() is not None:
                server = _shared["server"] = cls.start(env)
                atexit.register(server.stop)
            return server

    @classmethod
    def start(cls, env: Mapping[str, str], timeout_s: float = 60.0) -> ForkServer:
        if not become_subreaper():
            raise ForkServerError("this platform has no child subreaper (Linux only)")
        process = subprocess.Popen(
            [sys.executable, "-m", "crashsafe.forkserver"],
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C at `crashsafe up` reaches the supervisor, not the server
        )
        server = cls(process)
        if server._answer(timeout_s) != {"ready": True}:  # once everything is imported
            process.kill()
            raise ForkServerError("the fork server did not say it was ready")
        return server

    def fork(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> ForkedService:
        """A new service process running `crashsafe <argv>`, its output appended to `log_path`."""
        request = json.dumps({"argv": list(argv), "env": dict(env), "log": str(log_path)}).encode() + b"\n"
        with self._lock:
            if self._process.poll() is not None or self._process.stdin is None:
                raise ForkServerError(f"the fork server exited with {self._process.returncode}")
            try:
                self._process.stdin.write(request)
                self._process.stdin.flush()
            except OSError as exc:
                raise ForkServerError(f"the fork server is gone: {exc}") from exc
            answer = self._answer(10.0)
        if "pid" not in answer:
            raise ForkServerError(f"the fork server could not start {' '.join(argv)}: {answer.get('error')}")
        return ForkedService(int(answer["pid"]))

    def _answer(self, timeout_s: float) -> dict[str, Any]:
        assert self._process.stdout is not None
        # A dead server ends the read with EOF; the timeout guards one that hangs (wedged in its imports, say).
        readable, _, _ = select.select([self._process.stdout], [], [], timeout_s)
        if not readable:
            self._process.kill()
            raise ForkServerError(f"the fork server did not answer in {timeout_s:.0f} s")
        line = self._process.stdout.readline()
        if not line:
            raise ForkServerError(f"the fork server exited with {self._process.wait()}")
        try:
            answer = json.loads(line)
        except ValueError as exc:
            self._process.kill()  # its answers can no longer be matched to requests
            raise ForkServerError(f"the fork server answered {line[:200]!r}") from exc
        if not isinstance(answer, dict):
            self._process.kill()
            raise ForkServerError(f"the fork server answered {line[:200]!r}")
        return answer

    def stop(self) -> None:
        """Close its request pipe (it exits on EOF); the services it forked are not its children and live on."""
        if self._process.poll() is not None:
            return
        if self._process.stdin is not None:
            try:
                self._process.stdin.close()
            except OSError:
                pass
        try:
            self._process.wait(5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()


# The server's side ---------------------------------------------------------------------------------------------


def _serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    # Frozen before the first fork: a service's collections then never write to the pages it shares with us.
    importlib.import_module("crashsafe.services.platform.collector").settle()
    _say(answers, {"ready": True})
    for line in requests:
        request = json.loads(line)
        try:
            _say(answers, {"pid": _fork_service(request, requests, answers)})
        except OSError as exc:
            _say(answers, {"error": str(exc)})


def _say(answers: IO[bytes], answer: Mapping[str, Any]) -> None:
    answers.write(json.dumps(answer).encode() + b"\n")
    answers.flush()


def _fork_service(request: Mapping[str, Any], requests: IO[bytes], answers: IO[bytes]) -> int:
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:  # the middle process: fork the service, say its pid, exit (the service is orphaned)
        code = 1
        try:
            os.close(read_end)
            service = os.fork()
            if service == 0:
                os.close(write_end)
                _become_service(request, (requests.fileno(), answers.fileno()))
            os.write(write_end, str(service).encode())
            code = 0
        finally:
            os._exit(code)  # never back into the server's loop
    os.close(write_end)
    with os.fdopen(read_end, "rb") as said:
        pid = said.read()
    os.waitpid(middle, 0)  # once the middle is reaped, the service belongs to the stack's process
    if not pid:
        raise OSError("the service could not be forked")
    return int(pid)


def _become_service(request: Mapping[str, Any], server_fds: tuple[int, ...]) -> None:
    """In the forked service: its own session, log, environment and arguments; then `crashsafe serve …`."""
    code: int = 1
    try:
        os.setsid()
        # Opened while 0, 1 and 2 are taken, so neither lands on a descriptor the dup2s below replace.
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # replaces the server's request pipe, as 1 replaces its answer pipe
        os.dup2(log, 1)
        os.dup2(log, 2)
        for fd in {log, null, *server_fds} - {0, 1, 2}:
            os.close(fd)
        env: dict[str, str] = request["env"]
        os.environ.clear()
        os.environ.update(env)
        # A fresh interpreter would put the service's PYTHONPATH first (an adopter's registry lives there).
        for entry in reversed([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]):
            if entry in sys.path:
                sys.path.remove(entry)
            sys.path.insert(0, entry)
        unbuffered = bool(env.get("PYTHONUNBUFFERED"))
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 (the process's own stdin)
        sys.stdout = io.TextIOWrapper(
            open(1, "wb", buffering=0 if unbuffered else -1, closefd=False),  # noqa: SIM115
            encoding="utf-8",
            write_through=unbuffered,
        )
        sys.stderr = io.TextIOWrapper(
            open(2, "wb", buffering=0, closefd=False),  # noqa: SIM115
            encoding="utf-8",
            errors="backslashreplace",
            line_buffering=True,
        )
        sys.argv = ["crashsafe", *request["argv"]]
        from crashsafe import cli

        try:
            cli.main(list(request["argv"]))
            code = 0
        except SystemExit as stop:
            code = _exit_code(stop.code)
        except KeyboardInterrupt:
            code = 128 + signal.SIGINT
        except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback, status 1, then atexit
            traceback.print_exc()
            code = 1
        threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads joined, as at interpreter exit
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - the process ends in os._exit below: say why on its log first
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _exit_code(code: object) -> int:
    """What the interpreter makes of `sys.exit(code)`: None is 0, a message is printed and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    # The answers get a descriptor of their own; fd 1 becomes stderr, so nothing an import prints is read as one.
    answer_pipe = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _serve(sys.stdin.buffer, answer_pipe)
