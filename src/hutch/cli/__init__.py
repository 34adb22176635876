"""Command-line clients of hutch nodes: `hutchctl`, `hutch-diagnostics`, `hutch-queues` and
`hutch definitions`. They talk to a node only through its management HTTP API, as a user
would, and never import the broker.
"""
