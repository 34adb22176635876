"""Micro benchmark of the AMQP 1.0 message format every stream message passes through
(hutch.streamproto.amqp10): nanoseconds per encode, decode and 0-9-1 conversion.

    python bench/amqp10.py [--number N] [--repeat R]

Each case runs N times per round, R rounds, timed in process CPU time (so that other work on a
shared machine disturbs it less); the best round is reported. The first line is a reference (a
bytes concatenation) to compare machines by.

The cases are what the broker does per message: a stream client's message (one data section)
encoded and decoded; a 0-9-1 publish stored (`from_basic`) with no properties, with the usual
few (content type, persistent, two headers), and with a message id and timestamp of its own
(so that nothing converted before can be reused); a stored message read by a 0-9-1 consumer
(`to_basic`) in the same three ways; and a message with every section, for scale.
"""

from __future__ import annotations

import argparse
import datetime
import time
import timeit
import uuid

from pamqp import commands

from hutch.amqp import codec
from hutch.streamproto.amqp10 import (
    NO_PROPERTIES,
    Header,
    Message,
    Properties,
    Symbol,
    Timestamp,
    UByte,
    from_basic,
    to_basic,
)

BODY = b"x" * 100
BIG_BODY = b"x" * 4000
ROUTE = ("orders", "eu.new")


def cases(number: int) -> dict[str, object]:
    usual = codec.encode_properties(commands.Basic.Properties(
        content_type="application/json", delivery_mode=2, headers={"tenant": "acme", "x-trace-id": "abc123"}))
    # one property list per call: a message id and a timestamp of its own, as many publishers send
    own = [codec.encode_properties(commands.Basic.Properties(
        content_type="application/json", delivery_mode=2, message_id=str(uuid.UUID(int=i)),
        timestamp=datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(seconds=i),
        headers={"tenant": "acme", "x-trace-id": "abc123"})) for i in range(number)]
    full = Message(BODY, header=Header(durable=True, priority=UByte(4)),
                   message_annotations={Symbol("x-stream-filter-value"): "eu"},
                   properties=Properties(message_id=uuid.uuid4(), content_type=Symbol("application/json"),
                                         creation_time=Timestamp(1700000000000)),
                   application_properties={"tenant": "acme", "n": 42})
    prebuilt = Message(BODY)
    data_only = prebuilt.encode()
    stored_plain = from_basic(NO_PROPERTIES, BODY, *ROUTE)
    stored_usual = from_basic(usual, BODY, *ROUTE)
    stored_own = [from_basic(p, BODY, *ROUTE) for p in own]
    full_encoded = full.encode()
    own_at = iter(range(10**12))
    stored_at = iter(range(10**12))
    return {
        "reference: 5-byte header + 100 B body concatenated": lambda: b"\x00\x53\x75\xa0" + bytes((100,)) + BODY,
        "Message(body).encode()   data section, 100 B": lambda: Message(BODY).encode(),
        "message.encode()         data section, 100 B": prebuilt.encode,
        "Message(body).encode()   data section, 4000 B": lambda: Message(BIG_BODY).encode(),
        "Message.decode()         data section, 100 B": lambda: Message.decode(data_only),
        "from_basic() no properties": lambda: from_basic(NO_PROPERTIES, BODY, *ROUTE),
        "from_basic() usual properties (seen before)": lambda: from_basic(usual, BODY, *ROUTE),
        "from_basic() own message id and timestamp": lambda: from_basic(own[next(own_at) % number], BODY, *ROUTE),
        "to_basic()   data section only": lambda: to_basic(data_only),
        "to_basic()   0-9-1 publish, no properties": lambda: to_basic(stored_plain),
        "to_basic()   0-9-1 publish, usual properties (seen before)": lambda: to_basic(stored_usual),
        "to_basic()   0-9-1 publish, own message id and timestamp":
            lambda: to_basic(stored_own[next(stored_at) % number]),
        "Message.encode() header, annotations, properties, app properties": full.encode,
        "Message.decode() header, annotations, properties, app properties": lambda: Message.decode(full_encoded),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for name, fn in cases(args.number).items():
        best = min(timeit.Timer(fn, timer=time.process_time).repeat(number=args.number, repeat=args.repeat))
        print(f"{name:<68} {best / args.number * 1e9:8.0f} ns")


if __name__ == "__main__":
    main()
