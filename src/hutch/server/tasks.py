"""An owner for the runtime's background tasks: kept, watched, and cancelled on stop.

asyncio keeps only a weak reference to a task, and a task nobody awaits dies silently with
its exception. A `TaskSet` holds a strong reference to each task it starts until the task
ends, logs the exception of one that failed the moment it ends (with the traceback), and on
`close` lets the tasks still running finish within a grace period, then cancels and awaits
them. This is trio's nursery in the small, for owners whose tasks start from callbacks
where an `async with asyncio.TaskGroup()` has no scope to live in.

It never swallows an exception silently and never outlives its owner's stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

CLOSE_GRACE_S = 2.0  # on close: how long running tasks may take to finish before they are cancelled


class TaskSet:
    def __init__(self, owner: str, log: logging.Logger):
        self.owner = owner
        self.log = log
        self.tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.owner}:{name}")
        self.tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self.log.error("%s: task %s failed", self.owner, task.get_name(), exc_info=exc)

    async def close(self, grace_s: float = CLOSE_GRACE_S) -> None:
        """Wait up to `grace_s` for the running tasks, then cancel what is left and await it."""
        if not self.tasks:
            return
        pending = set(self.tasks)
        if grace_s > 0:
            _done, pending = await asyncio.wait(pending, timeout=grace_s)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):  # _ended has logged a failure
                await task
        assert not any(not t.done() for t in pending), "a task outlived its owner's close"
