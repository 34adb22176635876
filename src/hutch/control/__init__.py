"""The control plane of a node: RabbitMQ's management HTTP API, served by every node.

`app.HttpListener` runs the aiohttp application on the node's event loop, next to the AMQP
listeners, and reads and changes the broker directly (one loop, so a handler sees and makes
consistent changes between two broker iterations). Mutations go through the broker's own
methods, so durable definitions are persisted as they would be after an AMQP declare.
The CLIs (`hutch.cli`) are clients of this API only.
"""
