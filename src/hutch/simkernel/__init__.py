"""The simulation kernel every deterministic simulator of hutch runs on (see `kernel`); `aioloop`
and `net` run asyncio code (whole nodes) on its clock, over in-memory TCP."""

from hutch.simkernel.kernel import Kernel, Link, Network, SimResult, Violation, draw_partition, run_seeds

__all__ = ["Kernel", "Link", "Network", "SimResult", "Violation", "draw_partition", "run_seeds"]
