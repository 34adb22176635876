"""An asyncio event loop on the kernel's clock: whole nodes run in simulated time.

The real runtime of a node (hutch.server) is asyncio code: timers (`call_later`, `sleep`,
`asyncio.timeout`), tasks and protocols. `VirtualLoop` runs that code unchanged, in one thread,
with time taken from a `Kernel`: `loop.time()` is `kernel.now` in seconds, and where a real loop
would block in its selector until the next timer is due, this one moves the kernel's clock to
that timer and carries on at once. An hour of simulated heartbeats costs only the callbacks it
runs. Nothing waits on a file descriptor: sockets are the in-memory ones of `hutch.simkernel.net`,
whose deliveries are timers of this loop, and `run_in_executor` runs the function inline. Its
future is done when the caller gets it, unless the simulator says the work took time
(`work_clock`: a slow disk's fsyncs): then the future is done that much simulated time later,
as a worker thread's would be, while the node's loop goes on; so do the calls the function hands
back with `call_soon_threadsafe`.

Order is deterministic: callbacks run in the order they were scheduled, timers in the order of
their due time (ties in the order the loop's heap gives them, itself a function of the order of
scheduling). With every other source of choice drawn from the kernel's `rng`, one seed names one
run of the whole event loop.

Processes die: every callback, timer and task runs in a `contextvars` context, and a context may
carry a `Life` (`life_var`). `kill(life)` cancels every callback and timer scheduled in it and
refuses new ones, so the tasks of a crashed node stop where they are, mid-await, as a killed
process's would; its objects are then merely garbage. Tasks created in a dead life are left
out of `living_tasks()`, which is what a run cancels and awaits at its end.

What it must never do: read a real clock, block, or run anything on another thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import math
import selectors
import weakref
from asyncio.base_events import _MIN_CANCELLED_TIMER_HANDLES_FRACTION as _MIN_CANCELLED_FRACTION
from asyncio.base_events import _MIN_SCHEDULED_TIMER_HANDLES, MAXIMUM_SELECT_TIMEOUT
from asyncio.events import Handle, TimerHandle
from collections.abc import Callable, Mapping
from typing import Any

from hutch.simkernel.kernel import Kernel


class Life:
    """One incarnation of a simulated process: alive until `VirtualLoop.kill`."""

    __slots__ = ("name", "alive")

    def __init__(self, name: str) -> None:
        self.name = name
        self.alive = True

    def __repr__(self) -> str:
        return f"<Life {self.name} {'alive' if self.alive else 'dead'}>"


life_var: contextvars.ContextVar[Life | None] = contextvars.ContextVar("sim_life", default=None)


def _life_of(context: contextvars.Context | None) -> Life | None:
    return life_var.get() if context is None else context.get(life_var)


class SimulationDeadlock(RuntimeError):
    """Nothing is ready and nothing is scheduled: no event can ever happen again."""


class SimulationLivelock(RuntimeError):
    """Callbacks keep scheduling callbacks and the clock never moves (a busy loop in simulated
    time would spin forever in real time)."""


ITERATIONS_AT_ONE_INSTANT_MAX = 1_000_000  # loop iterations without the clock moving: a livelock


class _VirtualSelector(selectors.BaseSelector):
    """A selector with no ready file, whose waits move the kernel's clock instead of sleeping."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self._keys: dict[Any, selectors.SelectorKey] = {}
        self._still = 0  # iterations since the clock last moved

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        self.unregister(fileobj)
        return self.register(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list:
        if timeout is None:
            raise SimulationDeadlock(f"at {self.kernel.now / 1e6:.6f}s of simulated time nothing is scheduled")
        if timeout > 0:
            self.kernel.now += max(1, math.ceil(timeout * 1_000_000))
            self._still = 0
        else:
            self._still += 1
            if self._still > ITERATIONS_AT_ONE_INSTANT_MAX:
                raise SimulationLivelock(f"{self._still} loop iterations at {self.kernel.now / 1e6:.6f}s of "
                                         "simulated time without the clock moving")
        return []

    def close(self) -> None:
        self._keys.clear()

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return dict(self._keys)


class VirtualLoop(asyncio.SelectorEventLoop):
    """`asyncio.SelectorEventLoop` whose clock is `kernel.now` and whose idle waits take no time."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        super().__init__(selector=_VirtualSelector(kernel))
        self._clock_resolution = 1e-6
        self._task_lives: weakref.WeakKeyDictionary[asyncio.Task, Life] = weakref.WeakKeyDictionary()
        # seconds of simulated work done so far (a slow disk's fsyncs), read around each function
        # `run_in_executor` runs: its future is done as much later as the function's work took
        self.work_clock: Callable[[], float] | None = None
        # while `run_in_executor` runs a function: what it hands back with `call_soon_threadsafe`
        self._executor_calls: list[tuple[Callable, tuple, contextvars.Context | None]] | None = None

    def time(self) -> float:
        return self.kernel.now / 1_000_000

    def _run_once(self) -> None:
        """One iteration, as asyncio's `BaseEventLoop._run_once` runs it (the same order: timers
        due, then the callbacks ready when the iteration began), without what a loop in debug mode
        or one with real files needs: the selector only moves the clock."""
        scheduled = self._scheduled
        count = len(scheduled)
        if count > _MIN_SCHEDULED_TIMER_HANDLES and self._timer_cancelled_count / count > _MIN_CANCELLED_FRACTION:
            kept = []
            for handle in scheduled:
                if handle._cancelled:
                    handle._scheduled = False
                else:
                    kept.append(handle)
            heapq.heapify(kept)
            self._scheduled = scheduled = kept
            self._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0]._cancelled:
                self._timer_cancelled_count -= 1
                heapq.heappop(scheduled)._scheduled = False
        ready = self._ready
        kernel = self.kernel
        if ready or self._stopping:
            self._selector.select(0)
        elif scheduled:
            self._selector.select(min(max(0, scheduled[0]._when - kernel.now / 1_000_000), MAXIMUM_SELECT_TIMEOUT))
        else:
            self._selector.select(None)
        end_time = kernel.now / 1_000_000 + self._clock_resolution
        while scheduled and scheduled[0]._when < end_time:
            handle = heapq.heappop(scheduled)
            handle._scheduled = False
            ready.append(handle)
        popleft = ready.popleft
        for _ in range(len(ready)):
            handle = popleft()
            if not handle._cancelled:
                handle._run()

    # asyncio's call_soon and call_at, without what only a loop in debug mode or one shared with
    # other threads needs: a node schedules hundreds of thousands of callbacks in a run.

    def call_soon(self, callback: Callable, *args: Any, context: contextvars.Context | None = None):
        if self._closed:
            raise RuntimeError("Event loop is closed")
        handle = Handle(callback, args, self, context)
        self._ready.append(handle)
        life = life_var.get() if context is None else context.get(life_var)
        if life is not None and not life.alive:
            handle.cancel()
        return handle

    def call_at(self, when: float, callback: Callable, *args: Any, context: contextvars.Context | None = None):
        if self._closed:
            raise RuntimeError("Event loop is closed")
        timer = TimerHandle(when, callback, args, self, context)
        heapq.heappush(self._scheduled, timer)
        timer._scheduled = True
        life = life_var.get() if context is None else context.get(life_var)
        if life is not None and not life.alive:
            timer.cancel()
        return timer

    def call_later(self, delay: float, callback: Callable, *args: Any, context: contextvars.Context | None = None):
        return self.call_at(self.kernel.now / 1_000_000 + delay, callback, *args, context=context)

    def create_task(self, coro: Any, *, name: str | None = None, context: contextvars.Context | None = None):
        task = super().create_task(coro, name=name, context=context)
        life = _life_of(context)
        if life is not None:
            self._task_lives[task] = life
        return task

    def kill(self, life: Life) -> None:
        """The process `life` names dies: nothing scheduled in it runs again."""
        life.alive = False
        for handle in [*self._ready, *self._scheduled]:
            if handle._context.get(life_var) is life:
                handle.cancel()
        for task, task_life in list(self._task_lives.items()):
            if task_life is life:
                task._log_destroy_pending = False  # abandoned on purpose

    def living_tasks(self) -> list[asyncio.Task]:
        """Tasks not yet done whose process is alive."""
        return [t for t in asyncio.all_tasks(self) if self._task_lives.get(t, None) is None
                or self._task_lives[t].alive]

    def run_in_executor(self, executor: Any, func: Callable, *args: Any) -> asyncio.Future:
        """Run `func(*args)` now, on the loop's thread. The returned future is already done, or,
        if `work_clock` says the function's work took time, done that much later."""
        fut = self.create_future()
        clock = self.work_clock
        started = clock() if clock is not None else 0.0
        self._executor_calls = calls = []
        try:
            settle, outcome = fut.set_result, func(*args)
        except BaseException as e:  # noqa: BLE001 - the caller sees it through the future, as with a thread
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            settle, outcome = fut.set_exception, e
        finally:
            self._executor_calls = None
        took_s = clock() - started if clock is not None else 0.0
        if took_s > 0:
            self.call_later(took_s, _settle_unless_cancelled, fut, settle, outcome)
        else:
            settle(outcome)
        for callback, cb_args, context in calls:  # the thread's last acts: after its work, as the future
            self.call_later(took_s, callback, *cb_args, context=context)
        return fut

    def call_soon_threadsafe(self, callback: Callable, *args: Any, context: contextvars.Context | None = None):
        """As `call_soon`; but what a function run by `run_in_executor` hands back to the loop
        this way runs once that function's work is over, as from a worker thread that calls
        the loop back when it is done (the handle returned then is None)."""
        calls = self._executor_calls
        if calls is None:
            return self.call_soon(callback, *args, context=context)
        calls.append((callback, args, context))
        return None

    def run_for(self, seconds: float) -> None:
        """Run the loop until `seconds` of simulated time have passed."""
        self.run_until_complete(asyncio.sleep(seconds))


def _settle_unless_cancelled(fut: asyncio.Future, settle: Callable[[Any], None], outcome: Any) -> None:
    if not fut.done():
        settle(outcome)


__all__ = ["Life", "SimulationDeadlock", "SimulationLivelock", "VirtualLoop", "life_var"]
