"""Whole-cluster simulation: real hutch nodes in one process under simulated time and network
(`cluster`), with simulated AMQP clients (`client`); `cli` is the `hutch sim` command group."""
