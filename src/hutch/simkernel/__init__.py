"""The simulation kernel every deterministic simulator of hutch runs on (see `kernel`); `aioloop`
and `net` run asyncio code (whole nodes) on its clock, over in-memory TCP; `pool` runs batches of
seeds on every core."""

from hutch.simkernel.kernel import Kernel, Link, Network, SimResult, Violation, draw_partition, run_seeds
from hutch.simkernel.pool import SeedBatch, SeedPool, run_seeds_on_pool

__all__ = ["Kernel", "Link", "Network", "SeedBatch", "SeedPool", "SimResult", "Violation", "draw_partition",
           "run_seeds", "run_seeds_on_pool"]
