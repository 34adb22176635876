"""hutch: a clustered AMQP 0-9-1 message broker in Python."""

__version__ = "0.1.0"
