"""pytest plugin for amqpstorm's functional suites: a broker on any port, cleanup over AMQP.

amqpstorm's tests build `Connection(host, user, password)` without a port, so they only
reach a broker on 5672; here the default port becomes HUTCH_CONFORMANCE_AMQP_PORT. Their
cleanup deletes the queues and exchanges a test made through the management HTTP API;
with HUTCH_CONFORMANCE_AMQP_CLEANUP=1 it does the same with AMQP queue.delete and
exchange.delete instead, so the AMQP suite needs no management API. The management suite
keeps upstream's cleanup, since the API is what it tests.
"""

from __future__ import annotations

import os


def _amqp_clean(names, queue=False, exchange=False):
    from amqpstorm import AMQPError, Connection
    from amqpstorm.tests import HOST, PASSWORD, USERNAME

    if not queue and not exchange:
        return
    with Connection(HOST, USERNAME, PASSWORD, timeout=10) as connection:
        for name in names:
            for kind, wanted in (("queue", queue), ("exchange", exchange)):
                if not wanted:
                    continue
                # A failed delete closes the channel; one channel per delete keeps the rest going.
                try:
                    with connection.channel() as channel:
                        getattr(channel, kind).delete(name)
                except AMQPError:
                    pass


def pytest_configure(config):
    import amqpstorm.connection

    port = os.environ.get("HUTCH_CONFORMANCE_AMQP_PORT")
    if port:
        init = amqpstorm.connection.Connection.__init__
        defaults = list(init.__defaults__ or ())
        # __init__(self, hostname, username, password, port=5672, **kwargs): port is the only default.
        if len(defaults) != 1 or defaults[0] != 5672:
            raise RuntimeError(f"amqpstorm Connection.__init__ defaults changed: {defaults}")
        init.__defaults__ = (int(port),)
    if os.environ.get("HUTCH_CONFORMANCE_AMQP_CLEANUP") == "1":
        import amqpstorm.tests.functional.utility as utility

        utility.clean = _amqp_clean
