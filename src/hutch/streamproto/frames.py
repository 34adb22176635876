"""RabbitMQ's stream protocol (TCP port 5552) as frames: one class per command, `encode`, and a
streaming `FrameDecoder`.

The wire format is rabbitmq-server's deps/rabbitmq_stream/docs/PROTOCOL.adoc as RabbitMQ 3.13
speaks it (rabbit_stream_core.erl): a frame is a uint32 size, then a uint16 key (the top bit set
on a response), a uint16 version and the command's fields, big-endian; strings carry an int16
length, byte strings and arrays an int32 length. Where RabbitMQ's code and the document differ,
this module does what RabbitMQ does: a string length is unsigned (there is no null string), a
tune answer is sent as a request, a SASL challenge is an int16-length string, a subscription's
properties and an open response's connection properties are left out when there are none.
Version 1 everywhere but Publish and Deliver; ResolveOffsetSpec (key 0x1f, RabbitMQ 4) is not
part of 3.13's protocol and decodes as an unknown key.

Both directions encode and decode: the server decodes requests and encodes responses, a client
(hutch's load generator) the other way round. A key and version name one layout whichever side
sends it, so one table serves both.

Publish and Deliver are the hot path. A Publish decodes to a list of (publishing id, message)
pairs, (publishing id, filter value, message) in version 2, with no other object per message; a
sub-batch entry stays one `SubBatch`. A Deliver carries an osiris chunk (48-byte header, bloom
filter, entries) as it is stored: `deliver_prefix` gives the bytes that go before it, so the
server writes prefix and chunk with `writelines` or `sendfile` and never copies the chunk.

Whatever the bytes, decoding raises `FrameError` and nothing else: a frame over frame_max
(RabbitMQ's FRAME_TOO_LARGE), an unknown key or version, a malformed or short body, or bytes left
over after the fields (UNKNOWN_FRAME, as RabbitMQ answers a frame its parser does not match).
Every `FrameError` ends the connection; its code is what RabbitMQ puts in its close. This module
imports nothing but the standard library and does no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

# ---------------------------------------------------------------- keys (rabbit_stream.hrl)

KEY_DECLARE_PUBLISHER = 0x0001
KEY_PUBLISH = 0x0002
KEY_PUBLISH_CONFIRM = 0x0003
KEY_PUBLISH_ERROR = 0x0004
KEY_QUERY_PUBLISHER_SEQUENCE = 0x0005
KEY_DELETE_PUBLISHER = 0x0006
KEY_SUBSCRIBE = 0x0007
KEY_DELIVER = 0x0008
KEY_CREDIT = 0x0009
KEY_STORE_OFFSET = 0x000A
KEY_QUERY_OFFSET = 0x000B
KEY_UNSUBSCRIBE = 0x000C
KEY_CREATE = 0x000D
KEY_DELETE = 0x000E
KEY_METADATA = 0x000F
KEY_METADATA_UPDATE = 0x0010
KEY_PEER_PROPERTIES = 0x0011
KEY_SASL_HANDSHAKE = 0x0012
KEY_SASL_AUTHENTICATE = 0x0013
KEY_TUNE = 0x0014
KEY_OPEN = 0x0015
KEY_CLOSE = 0x0016
KEY_HEARTBEAT = 0x0017
KEY_ROUTE = 0x0018
KEY_PARTITIONS = 0x0019
KEY_CONSUMER_UPDATE = 0x001A
KEY_EXCHANGE_COMMAND_VERSIONS = 0x001B
KEY_STREAM_STATS = 0x001C
KEY_CREATE_SUPER_STREAM = 0x001D
KEY_DELETE_SUPER_STREAM = 0x001E
RESPONSE = 0x8000  # the bit that makes a key a response's

# ---------------------------------------------------------------- response codes

OK = 0x01
STREAM_DOES_NOT_EXIST = 0x02
SUBSCRIPTION_ID_ALREADY_EXISTS = 0x03
SUBSCRIPTION_ID_DOES_NOT_EXIST = 0x04
STREAM_ALREADY_EXISTS = 0x05
STREAM_NOT_AVAILABLE = 0x06
SASL_MECHANISM_NOT_SUPPORTED = 0x07
AUTHENTICATION_FAILURE = 0x08
SASL_ERROR = 0x09
SASL_CHALLENGE = 0x0A
SASL_AUTHENTICATION_FAILURE_LOOPBACK = 0x0B
VIRTUAL_HOST_ACCESS_FAILURE = 0x0C
UNKNOWN_FRAME = 0x0D
FRAME_TOO_LARGE = 0x0E
INTERNAL_ERROR = 0x0F
ACCESS_REFUSED = 0x10
PRECONDITION_FAILED = 0x11
PUBLISHER_DOES_NOT_EXIST = 0x12
NO_OFFSET = 0x13
SASL_CANNOT_CHANGE_MECHANISM = 0x14
SASL_CANNOT_CHANGE_USERNAME = 0x15

# ---------------------------------------------------------------- offset specifications

OFFSET_TYPE_NONE = 0  # only in a consumer update response
OFFSET_TYPE_FIRST = 1
OFFSET_TYPE_LAST = 2
OFFSET_TYPE_NEXT = 3
OFFSET_TYPE_OFFSET = 4  # followed by a uint64 offset
OFFSET_TYPE_TIMESTAMP = 5  # followed by an int64, milliseconds since the epoch

# a published entry (the layout of an osiris entry, see chunk.py): a simple entry's size has the
# top bit clear; a sub-batch's first byte is 1:1, compression:3, reserved:4
SUB_BATCH = 0x80

_u8 = struct.Struct(">B")
_u16 = struct.Struct(">H")
_u32 = struct.Struct(">I")
_i32 = struct.Struct(">i")
_u64 = struct.Struct(">Q")
_i64 = struct.Struct(">q")
_header = struct.Struct(">IHH")  # size, key, version
_key_version = struct.Struct(">HH")
_pid_size = struct.Struct(">QI")  # a published message: publishing id, size
_pid_len16 = struct.Struct(">QH")  # version 2: publishing id, filter value length
_sub_batch = struct.Struct(">BHII")  # kind|compression, records, uncompressed size, size
_deliver_v1 = struct.Struct(">IHHB")
_deliver_v2 = struct.Struct(">IHHBQ")


class FrameError(ValueError):
    """A frame the protocol does not allow. `code` is the response code RabbitMQ closes the
    connection with (UNKNOWN_FRAME or FRAME_TOO_LARGE); the connection always ends."""

    def __init__(self, code: int, detail: str):
        super().__init__(detail)
        self.code = code
        self.detail = detail


def _malformed(detail: str) -> FrameError:
    return FrameError(UNKNOWN_FRAME, detail)


# ---------------------------------------------------------------- field codecs
#
# A field codec reads with get(buf, pos, end) -> (value, pos) and writes with put(out, value).
# Every read checks its bounds, and an array's count is checked against the bytes left before
# anything is allocated, so no input makes the decoder loop or allocate more than it was given.


class _Int:
    __slots__ = ("s", "size")

    def __init__(self, s: struct.Struct):
        self.s = s
        self.size = s.size

    def get(self, buf, pos: int, end: int) -> tuple[Any, int]:
        n = pos + self.size
        if n > end:
            raise _malformed("short frame")
        return self.s.unpack_from(buf, pos)[0], n

    def put(self, out: bytearray, v: int) -> None:
        out += self.s.pack(v)


class _Bool(_Int):
    __slots__ = ()

    def get(self, buf, pos: int, end: int) -> tuple[Any, int]:
        v, pos = _Int.get(self, buf, pos, end)
        if v > 1:
            raise _malformed(f"boolean {v}")
        return bool(v), pos

    def put(self, out: bytearray, v: bool) -> None:
        out.append(1 if v else 0)


def _get_str(buf, pos: int, end: int) -> tuple[str, int]:
    if pos + 2 > end:
        raise _malformed("short frame")
    n = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if n > end:
        raise _malformed("string runs past the frame")
    # surrogateescape: any bytes RabbitMQ would carry as a binary survive a round trip
    return bytes(buf[pos + 2:n]).decode("utf-8", "surrogateescape"), n


def _put_str(out: bytearray, v: str) -> None:
    b = v.encode("utf-8", "surrogateescape")
    out += _u16.pack(len(b))
    out += b


class _Str:
    size = 2

    @staticmethod
    def get(buf, pos: int, end: int) -> tuple[str, int]:
        return _get_str(buf, pos, end)

    @staticmethod
    def put(out: bytearray, v: str) -> None:
        _put_str(out, v)


class _Bytes:
    """int32 length, -1 for null (None)."""

    size = 4

    @staticmethod
    def get(buf, pos: int, end: int) -> tuple[bytes | None, int]:
        if pos + 4 > end:
            raise _malformed("short frame")
        n = _i32.unpack_from(buf, pos)[0]
        pos += 4
        if n == -1:
            return None, pos
        if n < 0 or pos + n > end:
            raise _malformed("byte string runs past the frame")
        return bytes(buf[pos:pos + n]), pos + n

    @staticmethod
    def put(out: bytearray, v: bytes | None) -> None:
        if v is None:
            out += _i32.pack(-1)
        else:
            out += _u32.pack(len(v))
            out += v


def _count(buf, pos: int, end: int, item_min: int) -> tuple[int, int]:
    if pos + 4 > end:
        raise _malformed("short frame")
    n = _u32.unpack_from(buf, pos)[0]
    pos += 4
    if n * item_min > end - pos:
        raise _malformed(f"array of {n} runs past the frame")
    return n, pos


class _Array:
    """int32 count, then the items; a tuple of codecs makes each item a tuple."""

    __slots__ = ("item", "item_min", "ints")
    size = 4

    def __init__(self, item):
        self.item = item
        self.item_min = sum(c.size for c in item) if isinstance(item, tuple) else item.size
        # integers of one width (a confirm's publishing ids): packed with one call, not one each
        self.ints = (item.s.format[0], item.s.format[1:]) if type(item) is _Int else None

    def get(self, buf, pos: int, end: int) -> tuple[list, int]:
        n, pos = _count(buf, pos, end, self.item_min)
        item = self.item
        out = []
        if isinstance(item, tuple):
            for _ in range(n):
                row = []
                for c in item:
                    v, pos = c.get(buf, pos, end)
                    row.append(v)
                out.append(tuple(row))
        else:
            get = item.get
            for _ in range(n):
                v, pos = get(buf, pos, end)
                out.append(v)
        return out, pos

    def put(self, out: bytearray, v: list) -> None:
        out += _u32.pack(len(v))
        item = self.item
        if self.ints is not None:
            order, code = self.ints
            out += struct.pack(f"{order}{len(v)}{code}", *v)
        elif isinstance(item, tuple):
            for row in v:
                for c, x in zip(item, row, strict=True):
                    c.put(out, x)
        else:
            for x in v:
                item.put(out, x)


class _Map:
    """int32 count, then key/value pairs, as a dict (properties, arguments, statistics)."""

    __slots__ = ("value", "optional")
    size = 4

    def __init__(self, value, optional: bool = False):
        self.value = value
        self.optional = optional  # left out entirely when empty, as RabbitMQ does

    def get(self, buf, pos: int, end: int) -> tuple[dict, int]:
        if self.optional and pos == end:
            return {}, pos
        n, pos = _count(buf, pos, end, 2 + self.value.size)
        d = {}
        vget = self.value.get
        for _ in range(n):
            k, pos = _get_str(buf, pos, end)
            d[k], pos = vget(buf, pos, end)
        return d, pos

    def put(self, out: bytearray, v: dict) -> None:
        if self.optional and not v:
            return
        out += _u32.pack(len(v))
        vput = self.value.put
        for k, x in v.items():
            _put_str(out, k)
            vput(out, x)


class _OffsetSpec:
    """uint16 type, then a uint64 offset or an int64 timestamp for types 4 and 5."""

    size = 2

    def __init__(self, allow_none: bool, trailing_offset: bool = False):
        self.low = OFFSET_TYPE_NONE if allow_none else OFFSET_TYPE_FIRST
        # the last field of its frame: a uint64 after a type that has none is skipped, as
        # RabbitMQ skips it (rstream sends one with every ConsumerUpdateResponse)
        self.trailing_offset = trailing_offset

    def get(self, buf, pos: int, end: int) -> tuple[tuple[int, int | None], int]:
        t, pos = U16.get(buf, pos, end)
        if t == OFFSET_TYPE_OFFSET:
            v, pos = U64.get(buf, pos, end)
        elif t == OFFSET_TYPE_TIMESTAMP:
            v, pos = I64.get(buf, pos, end)
        elif self.low <= t <= OFFSET_TYPE_NEXT:
            v = None
            if self.trailing_offset and end - pos == 8:
                pos = end
        else:
            raise _malformed(f"offset type {t}")
        return (t, v), pos

    def put(self, out: bytearray, v: tuple[int, int | None]) -> None:
        t, value = v
        out += _u16.pack(t)
        if t == OFFSET_TYPE_OFFSET:
            out += _u64.pack(value)
        elif t == OFFSET_TYPE_TIMESTAMP:
            out += _i64.pack(value)


U8 = _Int(_u8)
U16 = _Int(_u16)
U32 = _Int(_u32)
U64 = _Int(_u64)
I64 = _Int(_i64)
BOOL = _Bool(_u8)
STR = _Str()
BYTES = _Bytes()
STRS = _Array(STR)
STR_MAP = _Map(STR)
OPT_STR_MAP = _Map(STR, optional=True)
INT_MAP = _Map(I64)
OFFSET = _OffsetSpec(allow_none=False)
OFFSET_OR_NONE_LAST = _OffsetSpec(allow_none=True, trailing_offset=True)
COMMAND_VERSIONS = _Array((U16, U16, U16))  # (key, min version, max version)


# ---------------------------------------------------------------- commands


class Command:
    """A frame's content. Subclasses set KEY and VERSION and list their FIELDS as (attribute,
    codec); an attribute given as a tuple of names takes its codec's tuple apart."""

    __slots__ = ()
    KEY: ClassVar[int]
    VERSION: ClassVar[int] = 1
    FIELDS: ClassVar[tuple] = ()
    NAMES: ClassVar[tuple[str, ...]] = ()  # every field, the base class's first

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.NAMES = tuple(n for c in reversed(cls.__mro__) for n in c.__dict__.get("__slots__", ()))

    def __init__(self, *args: Any, **kwargs: Any):
        names = self.NAMES
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes {len(names)} fields")
        for name, v in zip(names, args, strict=False):
            setattr(self, name, v)
        for name, v in kwargs.items():
            setattr(self, name, v)
        for name in names[len(args):]:
            if name not in kwargs:
                setattr(self, name, self._default(name))

    def _default(self, name: str) -> Any:
        raise TypeError(f"{type(self).__name__} needs {name}")

    def put_body(self, out: bytearray) -> None:
        for name, codec in self.FIELDS:
            if isinstance(name, tuple):
                codec.put(out, tuple(getattr(self, n) for n in name))
            else:
                codec.put(out, getattr(self, name))

    @classmethod
    def parse_body(cls, buf, pos: int, end: int) -> Command:
        obj = cls.__new__(cls)
        for name, codec in cls.FIELDS:
            v, pos = codec.get(buf, pos, end)
            if isinstance(name, tuple):
                for n, x in zip(name, v, strict=True):
                    setattr(obj, n, x)
            else:
                setattr(obj, name, v)
        if pos != end:
            raise _malformed(f"{end - pos} bytes left over in {cls.__name__}")
        return obj

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(
            getattr(self, n) == getattr(other, n) for n in self.NAMES)

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n, None)!r}" for n in self.NAMES)
        return f"{type(self).__name__}({fields})"


class Response(Command):
    """The answer to a request: its correlation id and a response code, nothing more."""

    __slots__ = ("correlation_id", "code")
    FIELDS = (("correlation_id", U32), ("code", U16))


# -- publishing


class DeclarePublisher(Command):
    __slots__ = ("correlation_id", "publisher_id", "reference", "stream")
    KEY = KEY_DECLARE_PUBLISHER
    FIELDS = (("correlation_id", U32), ("publisher_id", U8), ("reference", STR), ("stream", STR))


class DeclarePublisherResponse(Response):
    __slots__ = ()
    KEY = KEY_DECLARE_PUBLISHER | RESPONSE


class SubBatch:
    """One published entry holding several messages, as the client compressed them:
    compression 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd. Stored in the stream as it came."""

    __slots__ = ("compression", "record_count", "uncompressed_size", "data")

    def __init__(self, compression: int, record_count: int, uncompressed_size: int, data: bytes):
        self.compression = compression
        self.record_count = record_count
        self.uncompressed_size = uncompressed_size
        self.data = data

    def __eq__(self, other: object) -> bool:
        return type(other) is SubBatch and (
            self.compression, self.record_count, self.uncompressed_size, bytes(self.data)) == (
            other.compression, other.record_count, other.uncompressed_size, bytes(other.data))

    def __repr__(self) -> str:
        return (f"SubBatch(compression={self.compression}, record_count={self.record_count}, "
                f"{len(self.data)} bytes)")


class FramedMessages(Sequence):
    """A version 1 Publish frame's messages as parsed when none is a sub-batch: `pids`, and
    `parts`, each message with its size in front of it (its bytes in the frame after the
    publishing id: views into the frame, not copies), which is how a chunk frames its records
    (`chunk.frame`), so a broker puts them into a chunk without looking at each message again;
    `size` the messages' bytes. Reads as the list of (publishing id, message bytes) pairs."""

    __slots__ = ("pids", "parts", "size")

    def __init__(self, pids: list[int], parts: list[memoryview], size: int):
        self.pids = pids
        self.parts = parts
        self.size = size

    def __len__(self) -> int:
        return len(self.pids)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return list(self)[i]
        return self.pids[i], bytes(self.parts[i][4:])

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        return zip(self.pids, (bytes(p[4:]) for p in self.parts), strict=True)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"FramedMessages({list(self)!r})"


class Publish(Command):
    """Version 1: `messages` is a list of (publishing id, message bytes or SubBatch); as parsed,
    a `FramedMessages` when no message is a sub-batch."""

    __slots__ = ("publisher_id", "messages")
    KEY = KEY_PUBLISH

    def put_body(self, out: bytearray) -> None:
        out += _u8.pack(self.publisher_id)
        out += _u32.pack(len(self.messages))
        pack = _pid_size.pack
        for pid, m in self.messages:
            if type(m) is SubBatch:
                out += _u64.pack(pid)
                out += _sub_batch.pack(SUB_BATCH | (m.compression & 7) << 4, m.record_count,
                                       m.uncompressed_size, len(m.data))
                out += m.data
            else:
                out += pack(pid, len(m))
                out += m

    @classmethod
    def parse_body(cls, buf, pos: int, end: int) -> Publish:
        if pos + 5 > end:
            raise _malformed("short frame")
        publisher_id = buf[pos]
        n = _u32.unpack_from(buf, pos + 1)[0]
        pos += 5
        if n * 12 > end - pos:
            raise _malformed(f"{n} messages run past the frame")
        obj = cls.__new__(cls)
        obj.publisher_id = publisher_id
        framed = _framed_messages(buf, pos, end, n)
        if framed is not None:
            obj.messages = framed
            return obj
        messages = []
        append = messages.append
        unpack = _pid_size.unpack_from
        for _ in range(n):
            if pos + 12 > end:
                raise _malformed("short frame")
            pid, size = unpack(buf, pos)
            if size & 0x80000000:
                if pos + 19 > end:
                    raise _malformed("short frame")
                kind, records, usize, size = _sub_batch.unpack_from(buf, pos + 8)
                pos += 19
                e = pos + size
                if e > end:
                    raise _malformed("sub-batch runs past the frame")
                append((pid, SubBatch((kind >> 4) & 7, records, usize, buf[pos:e])))
            else:
                pos += 12
                e = pos + size
                if e > end:
                    raise _malformed("message runs past the frame")
                append((pid, buf[pos:e]))
            pos = e
        if pos != end:
            raise _malformed(f"{end - pos} bytes left over in Publish")
        obj.messages = messages
        return obj


def _framed_messages(buf, pos: int, end: int, n: int) -> FramedMessages | None:
    """Publish's `n` messages from `pos` as `FramedMessages`, or None when one is a sub-batch
    or the frame is malformed (the general parse says how)."""
    pids: list[int] = []
    parts: list[memoryview] = []
    add_pid, add_part = pids.append, parts.append
    unpack = _pid_size.unpack_from
    view = memoryview(buf)
    for _ in range(n):
        if pos + 12 > end:
            return None
        pid, size = unpack(buf, pos)
        e = pos + 12 + size
        if size & 0x80000000 or e > end:
            return None
        add_pid(pid)
        add_part(view[pos + 8:e])
        pos = e
    if pos != end:
        return None
    return FramedMessages(pids, parts, sum(map(len, parts)) - 4 * n)


class PublishV2(Command):
    """Version 2: `messages` is a list of (publishing id, filter value, message bytes)."""

    __slots__ = ("publisher_id", "messages")
    KEY = KEY_PUBLISH
    VERSION = 2

    def put_body(self, out: bytearray) -> None:
        out += _u8.pack(self.publisher_id)
        out += _u32.pack(len(self.messages))
        for pid, fv, m in self.messages:
            b = fv.encode("utf-8", "surrogateescape")
            out += _pid_len16.pack(pid, len(b))
            out += b
            out += _u32.pack(len(m))
            out += m

    @classmethod
    def parse_body(cls, buf, pos: int, end: int) -> PublishV2:
        if pos + 5 > end:
            raise _malformed("short frame")
        publisher_id = buf[pos]
        n = _u32.unpack_from(buf, pos + 1)[0]
        pos += 5
        if n * 14 > end - pos:
            raise _malformed(f"{n} messages run past the frame")
        messages = []
        append = messages.append
        for _ in range(n):
            if pos + 10 > end:
                raise _malformed("short frame")
            pid, flen = _pid_len16.unpack_from(buf, pos)
            pos += 10
            f_end = pos + flen
            if f_end + 4 > end:
                raise _malformed("filter value runs past the frame")
            fv = bytes(buf[pos:f_end]).decode("utf-8", "surrogateescape")
            size = _u32.unpack_from(buf, f_end)[0]
            if size & 0x80000000:  # RabbitMQ takes no sub-batch with a filter value
                raise _malformed("sub-batch in a version 2 publish")
            pos = f_end + 4
            e = pos + size
            if e > end:
                raise _malformed("message runs past the frame")
            append((pid, fv, buf[pos:e]))
            pos = e
        if pos != end:
            raise _malformed(f"{end - pos} bytes left over in Publish")
        obj = cls.__new__(cls)
        obj.publisher_id = publisher_id
        obj.messages = messages
        return obj


class PublishConfirm(Command):
    __slots__ = ("publisher_id", "publishing_ids")
    KEY = KEY_PUBLISH_CONFIRM
    FIELDS = (("publisher_id", U8), ("publishing_ids", _Array(U64)))


class PublishError(Command):
    """`errors` is a list of (publishing id, response code)."""

    __slots__ = ("publisher_id", "errors")
    KEY = KEY_PUBLISH_ERROR
    FIELDS = (("publisher_id", U8), ("errors", _Array((U64, U16))))


class QueryPublisherSequence(Command):
    __slots__ = ("correlation_id", "reference", "stream")
    KEY = KEY_QUERY_PUBLISHER_SEQUENCE
    FIELDS = (("correlation_id", U32), ("reference", STR), ("stream", STR))


class QueryPublisherSequenceResponse(Command):
    __slots__ = ("correlation_id", "code", "sequence")
    KEY = KEY_QUERY_PUBLISHER_SEQUENCE | RESPONSE
    FIELDS = (("correlation_id", U32), ("code", U16), ("sequence", U64))


class DeletePublisher(Command):
    __slots__ = ("correlation_id", "publisher_id")
    KEY = KEY_DELETE_PUBLISHER
    FIELDS = (("correlation_id", U32), ("publisher_id", U8))


class DeletePublisherResponse(Response):
    __slots__ = ()
    KEY = KEY_DELETE_PUBLISHER | RESPONSE


# -- consuming


class Subscribe(Command):
    """`offset` is None for offset types first, last and next."""

    __slots__ = ("correlation_id", "subscription_id", "stream", "offset_type", "offset", "credit",
                 "properties")
    KEY = KEY_SUBSCRIBE
    FIELDS = (("correlation_id", U32), ("subscription_id", U8), ("stream", STR),
              (("offset_type", "offset"), OFFSET), ("credit", U16), ("properties", OPT_STR_MAP))

    def _default(self, name: str) -> Any:
        if name == "properties":
            return {}
        if name == "offset":
            return None
        return super()._default(name)


class SubscribeResponse(Response):
    __slots__ = ()
    KEY = KEY_SUBSCRIBE | RESPONSE


def deliver_prefix(subscription_id: int, chunk_size: int, committed_chunk_id: int | None = None) -> bytes:
    """The bytes of a Deliver frame before its chunk (version 2 when a committed chunk id is
    given): write them, then the chunk, with no copy of the chunk."""
    if committed_chunk_id is None:
        return _deliver_v1.pack(chunk_size + 5, KEY_DELIVER, 1, subscription_id)
    return _deliver_v2.pack(chunk_size + 13, KEY_DELIVER, 2, subscription_id, committed_chunk_id)


class Deliver(Command):
    """Version 1: one osiris chunk for a subscription. `chunk` is bytes or a memoryview."""

    __slots__ = ("subscription_id", "chunk")
    KEY = KEY_DELIVER

    def put_body(self, out: bytearray) -> None:
        out.append(self.subscription_id)
        out += self.chunk

    @classmethod
    def parse_body(cls, buf, pos: int, end: int) -> Deliver:
        if pos + 1 > end:
            raise _malformed("short frame")
        obj = cls.__new__(cls)
        obj.subscription_id = buf[pos]
        obj.chunk = memoryview(buf)[pos + 1:end]
        return obj


class DeliverV2(Command):
    """Version 2, for clients that announced it: the chunk and the id of the last committed chunk."""

    __slots__ = ("subscription_id", "committed_chunk_id", "chunk")
    KEY = KEY_DELIVER
    VERSION = 2

    def put_body(self, out: bytearray) -> None:
        out.append(self.subscription_id)
        out += _u64.pack(self.committed_chunk_id)
        out += self.chunk

    @classmethod
    def parse_body(cls, buf, pos: int, end: int) -> DeliverV2:
        if pos + 9 > end:
            raise _malformed("short frame")
        obj = cls.__new__(cls)
        obj.subscription_id = buf[pos]
        obj.committed_chunk_id = _u64.unpack_from(buf, pos + 1)[0]
        obj.chunk = memoryview(buf)[pos + 9:end]
        return obj


class Credit(Command):
    __slots__ = ("subscription_id", "credit")
    KEY = KEY_CREDIT
    FIELDS = (("subscription_id", U8), ("credit", U16))


class CreditResponse(Command):
    """Sent only when a credit went wrong (an unknown subscription); no correlation id."""

    __slots__ = ("code", "subscription_id")
    KEY = KEY_CREDIT | RESPONSE
    FIELDS = (("code", U16), ("subscription_id", U8))


class StoreOffset(Command):
    __slots__ = ("reference", "stream", "offset")
    KEY = KEY_STORE_OFFSET
    FIELDS = (("reference", STR), ("stream", STR), ("offset", U64))


class QueryOffset(Command):
    __slots__ = ("correlation_id", "reference", "stream")
    KEY = KEY_QUERY_OFFSET
    FIELDS = (("correlation_id", U32), ("reference", STR), ("stream", STR))


class QueryOffsetResponse(Command):
    __slots__ = ("correlation_id", "code", "offset")
    KEY = KEY_QUERY_OFFSET | RESPONSE
    FIELDS = (("correlation_id", U32), ("code", U16), ("offset", U64))


class Unsubscribe(Command):
    __slots__ = ("correlation_id", "subscription_id")
    KEY = KEY_UNSUBSCRIBE
    FIELDS = (("correlation_id", U32), ("subscription_id", U8))


class UnsubscribeResponse(Response):
    __slots__ = ()
    KEY = KEY_UNSUBSCRIBE | RESPONSE


# -- streams


class Create(Command):
    __slots__ = ("correlation_id", "stream", "arguments")
    KEY = KEY_CREATE
    FIELDS = (("correlation_id", U32), ("stream", STR), ("arguments", STR_MAP))


class CreateResponse(Response):
    __slots__ = ()
    KEY = KEY_CREATE | RESPONSE


class Delete(Command):
    __slots__ = ("correlation_id", "stream")
    KEY = KEY_DELETE
    FIELDS = (("correlation_id", U32), ("stream", STR))


class DeleteResponse(Response):
    __slots__ = ()
    KEY = KEY_DELETE | RESPONSE


class Metadata(Command):
    __slots__ = ("correlation_id", "streams")
    KEY = KEY_METADATA
    FIELDS = (("correlation_id", U32), ("streams", STRS))


class MetadataResponse(Command):
    """`brokers`: (reference, host, port); `streams`: (name, code, leader reference, replica
    references). A stream that does not exist has leader 0xFFFF and no replicas, as RabbitMQ
    sends it. The frame has no response code of its own."""

    __slots__ = ("correlation_id", "brokers", "streams")
    KEY = KEY_METADATA | RESPONSE
    FIELDS = (("correlation_id", U32), ("brokers", _Array((U16, STR, U32))),
              ("streams", _Array((STR, U16, U16, _Array(U16)))))


class MetadataUpdate(Command):
    __slots__ = ("code", "stream")
    KEY = KEY_METADATA_UPDATE
    FIELDS = (("code", U16), ("stream", STR))


class StreamStats(Command):
    __slots__ = ("correlation_id", "stream")
    KEY = KEY_STREAM_STATS
    FIELDS = (("correlation_id", U32), ("stream", STR))


class StreamStatsResponse(Command):
    __slots__ = ("correlation_id", "code", "stats")
    KEY = KEY_STREAM_STATS | RESPONSE
    FIELDS = (("correlation_id", U32), ("code", U16), ("stats", INT_MAP))


# -- connection


class PeerProperties(Command):
    __slots__ = ("correlation_id", "properties")
    KEY = KEY_PEER_PROPERTIES
    FIELDS = (("correlation_id", U32), ("properties", STR_MAP))


class PeerPropertiesResponse(Command):
    __slots__ = ("correlation_id", "code", "properties")
    KEY = KEY_PEER_PROPERTIES | RESPONSE
    FIELDS = (("correlation_id", U32), ("code", U16), ("properties", STR_MAP))


class SaslHandshake(Command):
    __slots__ = ("correlation_id",)
    KEY = KEY_SASL_HANDSHAKE
    FIELDS = (("correlation_id", U32),)


class SaslHandshakeResponse(Command):
    __slots__ = ("correlation_id", "code", "mechanisms")
    KEY = KEY_SASL_HANDSHAKE | RESPONSE
    FIELDS = (("correlation_id", U32), ("code", U16), ("mechanisms", STRS))


class SaslAuthenticate(Command):
    """`data` is None when the client sent a null byte string (length -1)."""

    __slots__ = ("correlation_id", "mechanism", "data")
    KEY = KEY_SASL_AUTHENTICATE
    FIELDS = (("correlation_id", U32), ("mechanism", STR), ("data", BYTES))


class SaslAuthenticateResponse(Command):
    """A challenge, when there is one, is an int16-length string after the code (RabbitMQ)."""

    __slots__ = ("correlation_id", "code", "challenge")
    KEY = KEY_SASL_AUTHENTICATE | RESPONSE

    def _default(self, name: str) -> Any:
        return b"" if name == "challenge" else super()._default(name)

    def put_body(self, out: bytearray) -> None:
        out += _u32.pack(self.correlation_id)
        out += _u16.pack(self.code)
        if self.challenge:
            out += _u16.pack(len(self.challenge))
            out += self.challenge

    @classmethod
    def parse_body(cls, buf, pos: int, end: int) -> SaslAuthenticateResponse:
        obj = cls.__new__(cls)
        obj.correlation_id, pos = U32.get(buf, pos, end)
        obj.code, pos = U16.get(buf, pos, end)
        obj.challenge = b""
        if pos != end:
            n, pos = U16.get(buf, pos, end)
            if pos + n != end:
                raise _malformed("challenge does not fill the frame")
            obj.challenge = bytes(buf[pos:end])
        return obj


class Tune(Command):
    """The server proposes (frame_max in bytes, heartbeat in seconds; 0 is no limit, no
    heartbeat) and the client answers with the same command."""

    __slots__ = ("frame_max", "heartbeat")
    KEY = KEY_TUNE
    FIELDS = (("frame_max", U32), ("heartbeat", U32))


class TuneResponse(Tune):
    """A client's tune answer sent with the response bit, which RabbitMQ also accepts."""

    __slots__ = ()
    KEY = KEY_TUNE | RESPONSE


class Open(Command):
    __slots__ = ("correlation_id", "vhost")
    KEY = KEY_OPEN
    FIELDS = (("correlation_id", U32), ("vhost", STR))


class OpenResponse(Command):
    __slots__ = ("correlation_id", "code", "properties")
    KEY = KEY_OPEN | RESPONSE
    FIELDS = (("correlation_id", U32), ("code", U16), ("properties", OPT_STR_MAP))

    def _default(self, name: str) -> Any:
        return {} if name == "properties" else super()._default(name)


class Close(Command):
    __slots__ = ("correlation_id", "code", "reason")
    KEY = KEY_CLOSE
    FIELDS = (("correlation_id", U32), ("code", U16), ("reason", STR))


class CloseResponse(Response):
    __slots__ = ()
    KEY = KEY_CLOSE | RESPONSE


class Heartbeat(Command):
    __slots__ = ()
    KEY = KEY_HEARTBEAT


class ExchangeCommandVersions(Command):
    """`versions` is a list of (key, min version, max version)."""

    __slots__ = ("correlation_id", "versions")
    KEY = KEY_EXCHANGE_COMMAND_VERSIONS
    FIELDS = (("correlation_id", U32), ("versions", COMMAND_VERSIONS))


class ExchangeCommandVersionsResponse(Command):
    __slots__ = ("correlation_id", "code", "versions")
    KEY = KEY_EXCHANGE_COMMAND_VERSIONS | RESPONSE
    FIELDS = (("correlation_id", U32), ("code", U16), ("versions", COMMAND_VERSIONS))


# -- super streams and single active consumer


class Route(Command):
    __slots__ = ("correlation_id", "routing_key", "super_stream")
    KEY = KEY_ROUTE
    FIELDS = (("correlation_id", U32), ("routing_key", STR), ("super_stream", STR))


class RouteResponse(Command):
    __slots__ = ("correlation_id", "code", "streams")
    KEY = KEY_ROUTE | RESPONSE
    FIELDS = (("correlation_id", U32), ("code", U16), ("streams", STRS))


class Partitions(Command):
    __slots__ = ("correlation_id", "super_stream")
    KEY = KEY_PARTITIONS
    FIELDS = (("correlation_id", U32), ("super_stream", STR))


class PartitionsResponse(Command):
    __slots__ = ("correlation_id", "code", "streams")
    KEY = KEY_PARTITIONS | RESPONSE
    FIELDS = (("correlation_id", U32), ("code", U16), ("streams", STRS))


class ConsumerUpdate(Command):
    """Server to client: a single-active-consumer subscription became active or inactive."""

    __slots__ = ("correlation_id", "subscription_id", "active")
    KEY = KEY_CONSUMER_UPDATE
    FIELDS = (("correlation_id", U32), ("subscription_id", U8), ("active", BOOL))


class ConsumerUpdateResponse(Command):
    """Client to server: where the now active consumer wants to start (offset type 0: none)."""

    __slots__ = ("correlation_id", "code", "offset_type", "offset")
    KEY = KEY_CONSUMER_UPDATE | RESPONSE
    FIELDS = (("correlation_id", U32), ("code", U16), (("offset_type", "offset"), OFFSET_OR_NONE_LAST))

    def _default(self, name: str) -> Any:
        return None if name == "offset" else super()._default(name)


class CreateSuperStream(Command):
    __slots__ = ("correlation_id", "name", "partitions", "binding_keys", "arguments")
    KEY = KEY_CREATE_SUPER_STREAM
    FIELDS = (("correlation_id", U32), ("name", STR), ("partitions", STRS), ("binding_keys", STRS),
              ("arguments", STR_MAP))


class CreateSuperStreamResponse(Response):
    __slots__ = ()
    KEY = KEY_CREATE_SUPER_STREAM | RESPONSE


class DeleteSuperStream(Command):
    __slots__ = ("correlation_id", "name")
    KEY = KEY_DELETE_SUPER_STREAM
    FIELDS = (("correlation_id", U32), ("name", STR))


class DeleteSuperStreamResponse(Response):
    __slots__ = ()
    KEY = KEY_DELETE_SUPER_STREAM | RESPONSE


COMMANDS: tuple[type[Command], ...] = (
    DeclarePublisher, DeclarePublisherResponse, Publish, PublishV2, PublishConfirm, PublishError,
    QueryPublisherSequence, QueryPublisherSequenceResponse, DeletePublisher, DeletePublisherResponse,
    Subscribe, SubscribeResponse, Deliver, DeliverV2, Credit, CreditResponse, StoreOffset,
    QueryOffset, QueryOffsetResponse, Unsubscribe, UnsubscribeResponse, Create, CreateResponse,
    Delete, DeleteResponse, Metadata, MetadataResponse, MetadataUpdate, PeerProperties,
    PeerPropertiesResponse, SaslHandshake, SaslHandshakeResponse, SaslAuthenticate,
    SaslAuthenticateResponse, Tune, TuneResponse, Open, OpenResponse, Close, CloseResponse, Heartbeat,
    Route, RouteResponse, Partitions, PartitionsResponse, ConsumerUpdate, ConsumerUpdateResponse,
    ExchangeCommandVersions, ExchangeCommandVersionsResponse, StreamStats, StreamStatsResponse,
    CreateSuperStream, CreateSuperStreamResponse, DeleteSuperStream, DeleteSuperStreamResponse,
)

# (key, version) -> class: the one table both directions decode with
_BY_KEY_VERSION: dict[int, type[Command]] = {c.KEY << 16 | c.VERSION: c for c in COMMANDS}

# What RabbitMQ 3.13 answers an exchange of command versions with, in its order (rstream
# looks a command up by its position in this list).
SERVER_COMMAND_VERSIONS: list[tuple[int, int, int]] = [
    (KEY_DECLARE_PUBLISHER, 1, 1), (KEY_PUBLISH, 1, 2), (KEY_QUERY_PUBLISHER_SEQUENCE, 1, 1),
    (KEY_DELETE_PUBLISHER, 1, 1), (KEY_SUBSCRIBE, 1, 1), (KEY_CREDIT, 1, 1), (KEY_STORE_OFFSET, 1, 1),
    (KEY_QUERY_OFFSET, 1, 1), (KEY_UNSUBSCRIBE, 1, 1), (KEY_CREATE, 1, 1), (KEY_DELETE, 1, 1),
    (KEY_METADATA, 1, 1), (KEY_CLOSE, 1, 1), (KEY_HEARTBEAT, 1, 1), (KEY_ROUTE, 1, 1),
    (KEY_PARTITIONS, 1, 1), (KEY_STREAM_STATS, 1, 1), (KEY_CREATE_SUPER_STREAM, 1, 1),
    (KEY_DELETE_SUPER_STREAM, 1, 1),
]


# ---------------------------------------------------------------- encode / decode


def encode(cmd: Command) -> bytes:
    """The whole frame, size prefix included. A Deliver's chunk is copied once, into the frame
    (`deliver_prefix` avoids even that)."""
    t = type(cmd)
    if t is Deliver:
        return deliver_prefix(cmd.subscription_id, len(cmd.chunk)) + cmd.chunk
    if t is DeliverV2:
        return deliver_prefix(cmd.subscription_id, len(cmd.chunk), cmd.committed_chunk_id) + cmd.chunk
    out = bytearray(8)
    cmd.put_body(out)
    _header.pack_into(out, 0, len(out) - 4, cmd.KEY, cmd.VERSION)
    return bytes(out)


def decode_body(body: bytes | memoryview) -> Command:
    """One frame's content (what follows its size)."""
    end = len(body)
    if end < 4:
        raise _malformed(f"frame of {end} bytes")
    key, version = _key_version.unpack_from(body, 0)
    cls = _BY_KEY_VERSION.get(key << 16 | version)
    if cls is None:
        raise _malformed(f"unknown command key 0x{key:04x} version {version}")
    try:
        return cls.parse_body(body, 4, end)
    except struct.error as e:  # a bound check missed: still the peer's malformed frame
        raise _malformed(f"{cls.__name__}: {e}") from None


class FrameDecoder:
    """Bytes in (`feed`), commands out (iterate). Holds at most one partial frame, whose size
    has already been checked against `frame_max` (0: no limit). A malformed frame raises
    `FrameError` and decoding goes on with the next frame; a frame over frame_max raises
    `FrameError(FRAME_TOO_LARGE)` and the decoder takes nothing more, as RabbitMQ stops reading."""

    __slots__ = ("frame_max", "_buf", "_pos", "_broken")

    def __init__(self, frame_max: int = 0):
        self.frame_max = frame_max
        self._buf = bytearray()
        self._pos = 0
        self._broken = False

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf) - self._pos

    def feed(self, data: bytes) -> None:
        if self._broken:
            return
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        self._buf += data

    def __iter__(self) -> Iterator[Command]:
        return self

    def __next__(self) -> Command:
        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        if avail < 4 or self._broken:
            raise StopIteration
        size = _u32.unpack_from(buf, pos)[0]
        if self.frame_max and size > self.frame_max:
            self._broken = True
            buf.clear()
            self._pos = 0
            raise FrameError(FRAME_TOO_LARGE, f"frame of {size} bytes exceeds frame_max {self.frame_max}")
        if avail < 4 + size:
            if pos > 65536 and pos * 2 > len(buf):  # keep the buffer from growing at the front
                del buf[:pos]
                self._pos = 0
            raise StopIteration
        end = pos + 4 + size
        with memoryview(buf) as view:  # one copy of the frame, released before the buffer changes
            body = bytes(view[pos + 4:end])
        if end == len(buf):
            buf.clear()
            self._pos = 0
        else:
            self._pos = end
        return decode_body(body)
