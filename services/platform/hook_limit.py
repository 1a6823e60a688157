"""A time limit on an adopter's own code: an agent's hook, or a Python operation's client between two awaits, that
blocks or loops is stopped where it stands, never a service whose event loop stops turning for every tenant (issue
31, items 2 and 10). The runtime turns a stopped hook into its run's `agent_fault`; the executor turns a stopped
provider call into an unknown outcome, asked about by key like any call that did not answer.

An agent's hooks run synchronously inside `next_move` (pure, sub-millisecond when well behaved), on the event
loop's thread. A thread of their own could not stop them (Python cannot kill a thread), and a process per decision
would cost more than the decision. A real-time interval timer (`ITIMER_REAL`, SIGALRM) can: its handler runs on the
loop's thread between two bytecodes of the hook, or interrupts the system call it sleeps in, and raises
`HookOverran` there. It is a BaseException, so a hook's `except Exception` does not swallow it, and it fires
again every `_AGAIN_S` while armed, so one that swallows even that is interrupted again. Code that holds the
thread inside C without returning to the interpreter is out of a signal's reach: the loop's watchdog ends that
process, and the run it was deciding is remembered (`stall_marks`), so no process drives it again.

The limit is armed only where this process owns SIGALRM: on the main thread, with the default handler found at
install time and no timer of someone else's running (pytest-timeout's, in a test that runs a runtime in process).
Elsewhere hooks run unbounded, as before, and the watchdog is the only guard.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Awaitable, Callable, Generator
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")
_AGAIN_S = 0.1
# Frames of these modules are ours, not the agent's: the place named is the innermost frame outside them (an
# agent that ships in the package, `crashsafe.services.agents.*`, is an agent's code).
_OURS = (
    "crashsafe.domain",
    "crashsafe.contracts",
    "crashsafe.services.runtime",
    "crashsafe.services.platform",
)


class HookOverran(BaseException):  # noqa: N818 -- it is what happened, as AgentFault's problem says
    """Raised into an agent's code that ran past the limit; `where` is the agent's line it was stopped at."""

    def __init__(self, limit_s: float, frame: FrameType | None) -> None:
        self.limit_s = limit_s
        self.where = where_stopped(frame)
        # The methods of which objects were running, outermost last: the agent's outermost one is the hook.
        self._calls = _calls(frame)
        super().__init__(f"ran past {limit_s:g} s without returning (stopped at {self.where})")

    def hook_of(self, agent: object) -> str:
        """The name of `agent`'s method that was called and had not returned (its hook); "code" if none was."""
        names = [name for owner, name in self._calls if owner is agent]
        return names[-1] if names else "code"


def where_stopped(frame: FrameType | None) -> str:
    """The innermost frame that is not ours: where the agent's code was when it was stopped."""
    found = "an unknown place"
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if not module.startswith(_OURS):
            return f"{module}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return found


def _calls(frame: FrameType | None) -> list[tuple[object, str]]:
    calls: list[tuple[object, str]] = []
    while frame is not None:
        calls.append((frame.f_locals.get("self"), frame.f_code.co_name))
        frame = frame.f_back
    return calls


class HookLimit:
    """Runs a synchronous call under the limit (`run`); `limit_s <= 0` or a process that does not own SIGALRM
    runs it unbounded."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self._armed = False
        self._handler = self._on_alarm  # one bound method, so `getsignal` can tell it is still ours
        self.installed = False

    def install(self) -> bool:
        """Take SIGALRM for the limit if this process may (main thread, default handler): whether it did."""
        if self.limit_s <= 0 or threading.current_thread() is not threading.main_thread():
            return False
        if signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, None, self._handler):
            return False
        signal.signal(signal.SIGALRM, self._handler)
        self.installed = True
        return True

    def uninstall(self) -> None:
        if self.installed and signal.getsignal(signal.SIGALRM) is self._handler:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
        self.installed = False

    def _owned(self) -> bool:
        # Someone may have taken the signal since (a test's timeout): then their timer, not ours, is running.
        return (
            self.installed
            and signal.getsignal(signal.SIGALRM) is self._handler
            and signal.getitimer(signal.ITIMER_REAL)[0] == 0
        )

    def run(self, call: Callable[..., T], *args: object) -> T:
        """`call(*args)`, stopped with `HookOverran` if it runs past the limit."""
        if not self._owned():
            return call(*args)
        self._armed = True
        signal.setitimer(signal.ITIMER_REAL, self.limit_s, _AGAIN_S)
        try:
            return call(*args)
        finally:
            # Disarmed before the timer stops: a signal already on its way finds the limit off and is ignored.
            self._armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        if self._armed:
            raise HookOverran(self.limit_s, frame)

    async def sliced(self, awaitable: Awaitable[T]) -> T:
        """`await awaitable`, each stretch of its code between two awaits under the limit: the awaits themselves
        (a provider's slow answer) are never limited, only code that holds the loop. Not a coroutine: awaited as
        it is."""
        if not self._owned() or not hasattr(awaitable, "send"):
            return await awaitable
        return await _Slices(self, awaitable)  # type: ignore[arg-type]


class _Slices:
    """Drives a coroutine one `send` at a time, each under the limit, passing what it awaits to the event loop."""

    def __init__(self, limit: HookLimit, coroutine: Any) -> None:
        self.limit = limit
        self.coroutine = coroutine

    def __await__(self) -> Generator[Any, Any, Any]:
        coroutine = self.coroutine
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            try:
                if thrown is None:
                    awaited = self.limit.run(coroutine.send, sent)
                else:
                    awaited = self.limit.run(coroutine.throw, thrown)
            except StopIteration as done:
                return done.value
            except HookOverran:
                coroutine.close()
                raise
            try:
                sent, thrown = (yield awaited), None
            except GeneratorExit:
                coroutine.close()
                raise
            except BaseException as exc:  # noqa: BLE001 -- a cancellation, passed into the coroutine it was for
                sent, thrown = None, exc
