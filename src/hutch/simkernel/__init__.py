"""The simulation kernel every deterministic simulator of hutch runs on (see `kernel`)."""

from hutch.simkernel.kernel import Kernel, Link, Network, SimResult, Violation, draw_partition, run_seeds

__all__ = ["Kernel", "Link", "Network", "SimResult", "Violation", "draw_partition", "run_seeds"]
