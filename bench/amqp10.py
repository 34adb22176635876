"""Micro benchmark of the AMQP 1.0 message format every stream message passes through
(hutch.streamproto.amqp10): nanoseconds per encode, decode and 0-9-1 conversion.

    python bench/amqp10.py [--number N] [--repeat R]

Each case runs N times per round, R rounds; the best round is reported (the least disturbed).
The first line is a reference (a bytes concatenation) to compare machines and loads by.
The cases are what the broker does per message: a stream client's message (one data section)
encoded and decoded; a 0-9-1 publish stored (`from_basic`) with no properties, and with the
usual few (content type, persistent, two headers); a stored message read by a 0-9-1 consumer
(`to_basic`); and a message with every section, for scale. The conversions remember the
properties they have converted, so the repeated cases show the broker's steady state, and the
"every section" cases the full codec.
"""

from __future__ import annotations

import argparse
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


def cases() -> dict[str, tuple[object, ...]]:
    usual = codec.encode_properties(commands.Basic.Properties(
        content_type="application/json", delivery_mode=2, headers={"tenant": "acme", "x-trace-id": "abc123"}))
    full = Message(BODY, header=Header(durable=True, priority=UByte(4)),
                   message_annotations={Symbol("x-stream-filter-value"): "eu"},
                   properties=Properties(message_id=uuid.uuid4(), content_type=Symbol("application/json"),
                                         creation_time=Timestamp(1700000000000)),
                   application_properties={"tenant": "acme", "n": 42})
    data_only = Message(BODY).encode()
    stored_plain = from_basic(NO_PROPERTIES, BODY, "orders", "eu.new")
    stored_usual = from_basic(usual, BODY, "orders", "eu.new")
    full_encoded = full.encode()
    prebuilt = Message(BODY)
    return {
        "reference: 5-byte header + 100 B body concatenated": (lambda: b"\x00\x53\x75\xa0" + bytes((100,)) + BODY,),
        "Message(body).encode()        data section, 100 B": (lambda: Message(BODY).encode(),),
        "message.encode()              data section, 100 B": (lambda: prebuilt.encode(),),
        "Message(body).encode()        data section, 4000 B": (lambda: Message(BIG_BODY).encode(),),
        "Message.decode()              data section, 100 B": (lambda: Message.decode(data_only),),
        "from_basic() no properties": (lambda: from_basic(NO_PROPERTIES, BODY, "orders", "eu.new"),),
        "from_basic() content-type, persistent, 2 headers": (lambda: from_basic(usual, BODY, "orders", "eu.new"),),
        "to_basic()   data section only": (lambda: to_basic(data_only),),
        "to_basic()   stored 0-9-1 publish, no properties": (lambda: to_basic(stored_plain),),
        "to_basic()   stored 0-9-1 publish, usual properties": (lambda: to_basic(stored_usual),),
        "Message.encode() every common section": (lambda: full.encode(),),
        "Message.decode() every common section": (lambda: Message.decode(full_encoded),),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for name, (fn,) in cases().items():
        best = min(timeit.repeat(fn, number=args.number, repeat=args.repeat))
        print(f"{name:<56} {best / args.number * 1e9:8.0f} ns")


if __name__ == "__main__":
    main()
