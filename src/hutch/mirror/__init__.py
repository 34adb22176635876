"""hutch.mirror: mirrored classic queues (seed 000; seed 004 §4). `gm` is the guaranteed
multicast ring that carries a queue's operations from its leader to its mirrors; `gmsim` is
its deterministic simulator."""
