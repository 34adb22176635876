"""Seeds on every core: worker processes that each run a share of a batch of seeds.

A simulator runs in one thread, and one seed's run never depends on another's, so a batch of
seeds splits over processes without changing any of them: a seed names the same run in a worker
as in the process that asked for it (every source of choice is the seed's, and the simulators
restore what they patch when a run ends). `SeedPool` starts its workers with the `spawn` method
(fresh interpreters: nothing of the caller's state, threads or open files is inherited), hands
them the seeds in chunks, and gives back each seed's `SimResult` in seed order, with the CPU
seconds the runs took.

`run` must be picklable: a module-level function, or a `functools.partial` of one
(`partial(run_seed, queue_type="mirrored")`). Traces stay in the worker unless the run keeps
them; a failing seed is replayed in one process with its trace.

What it must never do: run a seed anywhere but in one worker, start with `fork` (the caller may
hold threads and locks), or leave a worker running after `close`.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field

from hutch.simkernel.kernel import SimResult

CHUNK_SEEDS = 10  # seeds per task: small enough that the workers finish a batch together
JOBS_MAX = 8


def default_jobs() -> int:
    """The cores this process may run on (at most JOBS_MAX)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, JOBS_MAX))


def _run_when_idle() -> None:
    """Give this worker a core only when no other process wants one."""
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _run_chunk(run: Callable[[int], SimResult], seeds: list[int]) -> tuple[list[SimResult], float]:
    started = time.process_time()
    results = [run(s) for s in seeds]
    return results, time.process_time() - started


@dataclass(slots=True)
class SeedBatch:
    """Seeds handed to a pool; `results()` waits for them."""

    seeds: list[int]
    futures: list[Future] = field(default_factory=list)
    cpu_s: float = 0.0  # CPU seconds the workers spent on these seeds, once `results()` returned

    def results(self, timeout_s: float | None = None) -> list[SimResult]:
        """Every seed's result in seed order (a worker's exception is raised here)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        out: list[SimResult] = []
        self.cpu_s = 0.0
        for fut in self.futures:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            results, cpu_s = fut.result(timeout=left)
            out.extend(results)
            self.cpu_s += cpu_s
        return out


class SeedPool:
    """`jobs` worker processes (`default_jobs()` when None) for batches of seeds; `idle` runs them
    under SCHED_IDLE."""

    def __init__(self, jobs: int | None = None, idle: bool = False) -> None:
        self.jobs = jobs or default_jobs()
        self._executor = ProcessPoolExecutor(max_workers=self.jobs, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_run_when_idle if idle else None)

    def submit(self, run: Callable[[int], SimResult], seeds: Iterable[int], chunk: int = CHUNK_SEEDS) -> SeedBatch:
        """Queue `run(seed)` for every seed; batches submitted earlier are served first."""
        batch = SeedBatch(list(seeds))
        for i in range(0, len(batch.seeds), chunk):
            batch.futures.append(self._executor.submit(_run_chunk, run, batch.seeds[i:i + chunk]))
        return batch

    def close(self) -> None:
        """Stop the workers; seeds not yet started are dropped."""
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> SeedPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_seeds_on_pool(run: Callable[[int], SimResult], first: int, count: int, reproduce: Callable[[int], str],
                      echo: Callable[..., None], jobs: int | None = None, window: int = 500,
                      progress_every: int = 1000) -> int:
    """`kernel.run_seeds` on every core: `count` consecutive seeds from `first`, at most `window`
    of them queued at once (a soak of millions keeps its memory flat), results taken in seed order;
    each failure is printed with the command that replays it. Returns how many failed."""
    failures = 0
    done = 0
    started = time.perf_counter()
    with SeedPool(jobs) as pool:
        for start in range(first, first + count, window):
            batch = pool.submit(run, range(start, min(start + window, first + count)))
            for res in batch.results():
                done += 1
                if not res.ok:
                    failures += 1
                    echo(f"seed {res.seed}: FAILED: {res.violation}")
                    echo(f"  reproduce: {reproduce(res.seed)} -v")
                if done % progress_every == 0:
                    echo(f"{done} seeds, {failures} failed, {time.perf_counter() - started:.1f}s", err=True)
    echo(f"{count} seed(s) from {first}: {failures} failed in {time.perf_counter() - started:.1f}s "
         f"on {pool.jobs} worker(s)")
    return failures


__all__ = ["SeedBatch", "SeedPool", "default_jobs", "run_seeds_on_pool"]
