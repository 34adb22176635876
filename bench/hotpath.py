"""In-process hot-path benchmark: N publishes through one broker to one autoack consumer.

No sockets: bytes go straight into a Session and the frames it writes are counted. Shows the
broker's CPU per message (parse publish, route, enqueue, dispatch, encode deliver) without the
load tool or the kernel in the picture. `python bench/hotpath.py [N] [--profile]`.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

from pamqp import body, commands, frame, header

from hutch.broker.broker import Broker, Config
from hutch.broker.session import Session


class Sink:
    def __init__(self):
        self.bytes = 0

    def write(self, chunks):
        self.bytes += len(b"".join(chunks))

    def close_after_flush(self): ...
    def pause_reading(self): ...
    def resume_reading(self): ...
    def abort(self): ...


def handshake(s: Session) -> None:
    s.receive(b"AMQP\x00\x00\x09\x01")
    s.receive(frame.marshal(commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                        response="\x00guest\x00guest"), 0))
    s.receive(frame.marshal(commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0), 0))
    s.receive(frame.marshal(commands.Connection.Open(virtual_host="/"), 0))
    s.receive(frame.marshal(commands.Channel.Open(), 1))


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 200_000
    size = 16
    b = Broker(Config())
    pub = Session(b, "127.0.0.1:1", "127.0.0.1:5672")
    con = Session(b, "127.0.0.1:2", "127.0.0.1:5672")
    for s in (pub, con):
        s.transport_hooks = Sink()
        handshake(s)
    con.receive(frame.marshal(commands.Queue.Declare(queue="q"), 1))
    con.receive(frame.marshal(commands.Basic.Consume(queue="q", no_ack=True), 1))
    b.run()
    one = (frame.marshal(commands.Basic.Publish(exchange="", routing_key="q"), 1)
           + frame.marshal(header.ContentHeader(0, size, commands.Basic.Properties()), 1)
           + frame.marshal(body.ContentBody(b"x" * size), 1))
    batch = one * 1000
    def run():
        for _ in range(n // 1000):
            pub.receive(batch)
            b.run()
    if "--profile" in sys.argv:
        cProfile.runctx("run()", globals(), locals(), "/tmp/hot.prof")
        pstats.Stats("/tmp/hot.prof").sort_stats("tottime").print_stats(18)
        return
    t0 = time.perf_counter()
    c0 = time.process_time()
    run()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    print(f"{n} messages: {n / wall:,.0f} msg/s, {cpu / n * 1e6:.2f} µs CPU per message, "
          f"{con.transport_hooks.bytes / n:.0f} bytes delivered per message")


if __name__ == "__main__":
    main()
