"""The runtime's task owner (hutch.server.tasks.TaskSet): every task it starts is kept until it
ends, a task that fails is logged with its traceback, and close lets running tasks finish
within the grace period before it cancels and awaits the rest."""

from __future__ import annotations

import asyncio
import logging

from hutch.server.tasks import TaskSet

log = logging.getLogger("test.tasks")


def test_a_finished_task_is_let_go():
    async def main():
        ts = TaskSet("t", log)
        task = ts.spawn(asyncio.sleep(0), "quick")
        assert ts.tasks == {task}
        await task
        await asyncio.sleep(0)  # the done callback runs on the next loop turn
        return ts.tasks

    assert asyncio.run(main()) == set()


def test_a_failed_task_is_logged_with_its_traceback(caplog):
    async def boom():
        raise ValueError("broken on purpose")

    async def main():
        ts = TaskSet("t", log)
        ts.spawn(boom(), "boom")
        await ts.close()

    with caplog.at_level(logging.ERROR, logger="test.tasks"):
        asyncio.run(main())
    [rec] = [r for r in caplog.records if r.name == "test.tasks"]
    assert rec.getMessage() == "t: task t:boom failed"
    assert rec.exc_info is not None and isinstance(rec.exc_info[1], ValueError)


def test_close_waits_for_a_task_that_ends_within_the_grace():
    async def main():
        ts = TaskSet("t", log)
        done = []

        async def short():
            await asyncio.sleep(0.01)
            done.append(True)

        ts.spawn(short(), "short")
        await ts.close(grace_s=5.0)
        return done

    assert asyncio.run(main()) == [True]


def test_close_cancels_a_task_that_outlives_the_grace():
    async def main():
        ts = TaskSet("t", log)
        task = ts.spawn(asyncio.sleep(3600), "forever")
        await ts.close(grace_s=0)
        return task

    assert asyncio.run(main()).cancelled()
