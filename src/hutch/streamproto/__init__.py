"""hutch.streamproto: what a stream stores and what RabbitMQ's stream protocol carries, as
sans-I/O code.

`amqp10` is the AMQP 1.0 message format that every message in a stream is kept in (the type
system, the bare message sections, and the mapping to and from AMQP 0-9-1 content as RabbitMQ
does it). The package does no I/O and imports no other hutch layer: only the standard library.
"""
