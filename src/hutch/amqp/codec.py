"""Frame encoding and decoding for AMQP 0-9-1, with a fast path for the hot methods.

pamqp (the generated method table) encodes and decodes every method; this module wraps it
and adds hand-written code for the few frames a broker handles per message —
basic.publish, content header and body in; basic.deliver, basic.ack (confirms) out; and
basic.ack / basic.nack / basic.reject from consumers — because pamqp's generic codec parses
about 50k publishes/s, which would cap the broker.

Content properties are kept as the raw bytes the publisher sent (property flags and
property list). The broker re-sends them unchanged on delivery, and reads only the few
properties it acts on (`PropertySummary`): nothing is decoded that nobody looks at.
Nothing here does I/O.
"""

from __future__ import annotations

import struct
from decimal import Decimal
from typing import Any

from pamqp import commands, decode, encode
from pamqp.base import Frame as PamqpMethod

from hutch.amqp import spec

_frame_header = struct.Struct(">BHI")
_method_ids = struct.Struct(">HH")
_method_header = struct.Struct(">BHIHH")
_content_header = struct.Struct(">BHIHHQ")
_deliver_tail = struct.Struct(">QB")
_end_content_header = struct.Struct(">BBHIHHQ")  # the previous frame's end octet, then a content header
_end_frame_header = struct.Struct(">BBHI")  # the previous frame's end octet, then a frame header
_ack_frame = struct.Struct(">BHIHHQBB")  # frame hdr, class, method, tag, bits, frame-end
_q = struct.Struct(">Q")
_qb = struct.Struct(">QB")
_hhq = struct.Struct(">HHQ")
_h = struct.Struct(">H")
_i = struct.Struct(">I")

HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"

# Method index -> pamqp class (class_id << 16 | method_id).
METHODS: dict[int, type[PamqpMethod]] = commands.INDEX_MAPPING


def shortstr(value: str | bytes) -> bytes:
    b = value.encode() if isinstance(value, str) else value
    if len(b) > spec.SHORTSTR_MAX:
        raise ValueError("short string too long")
    return bytes((len(b),)) + b


# ---------------------------------------------------------------- encoding

def method_frame(channel: int, method: PamqpMethod) -> bytes:
    payload = _i.pack(method.index) + method.marshal()
    return _frame_header.pack(spec.FRAME_METHOD, channel, len(payload)) + payload + spec.FRAME_END_BYTE


def content_frames(channel: int, props: bytes, body: bytes, frame_max: int) -> list[bytes]:
    """A content header frame and the body frames, the body split to fit frame_max."""
    blen = len(body)
    out = [_content_header.pack(spec.FRAME_HEADER, channel, 12 + len(props), 60, 0, blen), props,
           spec.FRAME_END_BYTE]
    chunk = frame_max - 8
    if blen <= chunk:
        if blen:
            out += (_frame_header.pack(spec.FRAME_BODY, channel, blen), body, spec.FRAME_END_BYTE)
        return out
    view = memoryview(body)
    for off in range(0, blen, chunk):
        part = view[off:off + chunk]
        out += (_frame_header.pack(spec.FRAME_BODY, channel, len(part)), part, spec.FRAME_END_BYTE)
    return out


def deliver_frames(channel: int, ctag_enc: bytes, delivery_tag: int, redelivered: bool, route_enc: bytes,
                   props: bytes, body: bytes, frame_max: int) -> list[bytes]:
    """basic.deliver + header + body frames. `ctag_enc` is the shortstr-encoded consumer tag and
    `route_enc` the shortstr-encoded exchange followed by the routing key, both prepared once."""
    mlen = 4 + len(ctag_enc) + 9 + len(route_enc)
    blen = len(body)
    if blen <= frame_max - 8 and blen:
        return [_method_header.pack(1, channel, mlen, 60, 60), ctag_enc,
                _deliver_tail.pack(delivery_tag, redelivered), route_enc,
                _end_content_header.pack(spec.FRAME_END, 2, channel, 12 + len(props), 60, 0, blen),
                props, _end_frame_header.pack(spec.FRAME_END, 3, channel, blen), body, spec.FRAME_END_BYTE]
    out = [_method_header.pack(1, channel, mlen, 60, 60), ctag_enc,
           _deliver_tail.pack(delivery_tag, redelivered), route_enc, spec.FRAME_END_BYTE]
    out += content_frames(channel, props, body, frame_max)
    return out


def get_ok_frames(channel: int, delivery_tag: int, redelivered: bool, route_enc: bytes, message_count: int,
                  props: bytes, body: bytes, frame_max: int) -> list[bytes]:
    mlen = 4 + 9 + len(route_enc) + 4
    out = [_method_header.pack(1, channel, mlen, 60, 71), _deliver_tail.pack(delivery_tag, redelivered),
           route_enc, _i.pack(message_count), spec.FRAME_END_BYTE]
    out += content_frames(channel, props, body, frame_max)
    return out


def return_frames(channel: int, reply_code: int, reply_text: str, route_enc: bytes, props: bytes, body: bytes,
                  frame_max: int) -> list[bytes]:
    args = _h.pack(reply_code) + shortstr(reply_text) + route_enc
    out = [_method_header.pack(1, channel, 4 + len(args), 60, 50), args, spec.FRAME_END_BYTE]
    out += content_frames(channel, props, body, frame_max)
    return out


def confirm_frame(channel: int, delivery_tag: int, multiple: bool, nack: bool = False) -> bytes:
    """basic.ack (or basic.nack with requeue=0) sent to a publisher in confirm mode."""
    return _ack_frame.pack(1, channel, 13, 60, 120 if nack else 80, delivery_tag, 1 if multiple else 0,
                           spec.FRAME_END)


def route_encoding(exchange: str, routing_key: str) -> bytes:
    return shortstr(exchange) + shortstr(routing_key)


# ---------------------------------------------------------------- field values as RabbitMQ names them

def field_type_name(v: Any) -> str:
    """A field-table value's AMQP type as RabbitMQ names it in its error texts."""
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "long" if not -2**31 <= v < 2**31 else "signedint"
    if isinstance(v, (str, bytes)):
        return "longstr"
    if isinstance(v, float):
        return "double"
    if isinstance(v, Decimal):
        return "decimal"
    if isinstance(v, dict):
        return "table"
    if isinstance(v, (list, tuple)):
        return "array"
    return type(v).__name__


def field_text(v: Any) -> str:
    """A field-table value as RabbitMQ prints it in error texts (booleans as true/false)."""
    if isinstance(v, bytes):
        v = v.decode(errors="replace")
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


# ---------------------------------------------------------------- decoding

def decode_method(payload: bytes) -> PamqpMethod:
    """Decode a method frame payload (class id, method id, arguments) with pamqp.

    Raises AMQPError(FRAME_ERROR / COMMAND_INVALID) for unknown or malformed methods."""
    if len(payload) < 4:
        raise spec.AMQPError(spec.FRAME_ERROR, "method frame too short")
    index = _i.unpack_from(payload)[0]
    cls = METHODS.get(index)
    if cls is None:
        raise spec.AMQPError(spec.COMMAND_INVALID, f"unknown method {index >> 16}/{index & 0xFFFF}")
    method = cls()
    try:
        method.unmarshal(payload[4:])
    except (struct.error, ValueError, UnicodeDecodeError, KeyError, IndexError, TypeError, RecursionError) as e:
        # RecursionError: tables nested deeper than pamqp's recursive decoder can follow
        raise spec.AMQPError(spec.FRAME_ERROR, f"cannot decode the arguments of {cls.name}: {e}",
                             index >> 16, index & 0xFFFF) from None
    return method


def decode_publish(payload: bytes) -> tuple[str, str, bytes, bool, bool]:
    """basic.publish arguments: (exchange, routing_key, route_enc, mandatory, immediate).

    `route_enc` is the exchange and routing key exactly as encoded on the wire, reused
    verbatim in basic.deliver."""
    # payload: class(2) method(2) reserved(2) exchange(shortstr) routing-key(shortstr) bits(1)
    n = len(payload)
    if n < 9:  # the shortest publish: ids, reserved short, two empty short strings, the bits
        raise spec.AMQPError(spec.FRAME_ERROR, "cannot decode the arguments of Basic.Publish", 60, 40)
    elen = payload[6]
    rk_at = 7 + elen
    if rk_at >= n:
        raise spec.AMQPError(spec.FRAME_ERROR, "cannot decode the arguments of Basic.Publish", 60, 40)
    rlen = payload[rk_at]
    end = rk_at + 1 + rlen
    if end >= n:
        raise spec.AMQPError(spec.FRAME_ERROR, "cannot decode the arguments of Basic.Publish", 60, 40)
    bits = payload[end]
    try:
        exchange = payload[7:rk_at].decode() if elen else ""
        routing_key = payload[rk_at + 1:end].decode()
    except UnicodeDecodeError:
        raise spec.AMQPError(spec.FRAME_ERROR, "cannot decode the arguments of Basic.Publish: invalid UTF-8",
                             60, 40) from None
    return exchange, routing_key, payload[6:end], bool(bits & 1), bool(bits & 2)


def decode_tag_bits(payload: bytes) -> tuple[int, int]:
    """(delivery_tag, bits) of basic.ack / basic.nack / basic.reject."""
    return _qb.unpack_from(payload, 4)


def decode_content_header(payload: bytes) -> tuple[int, int, bytes]:
    """(class_id, body_size, props) where props is the raw flags + property list."""
    if len(payload) < 14:
        raise spec.AMQPError(spec.FRAME_ERROR, "content header frame too short")
    class_id, _weight, body_size = _hhq.unpack_from(payload)
    return class_id, body_size, payload[12:]


# ---------------------------------------------------------------- properties

PROPERTY_NAMES = ("content_type", "content_encoding", "headers", "delivery_mode", "priority",
                  "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
                  "message_type", "user_id", "app_id", "cluster_id")
_SHORTSTR, _TABLE, _OCTET, _TS = 0, 1, 2, 3
_PROPERTY_KINDS = (_SHORTSTR, _SHORTSTR, _TABLE, _OCTET, _OCTET, _SHORTSTR, _SHORTSTR, _SHORTSTR, _SHORTSTR,
                   _TS, _SHORTSTR, _SHORTSTR, _SHORTSTR, _SHORTSTR)


class PropertySummary:
    """The content properties the broker acts on, read from raw property bytes without
    decoding the rest (a headers table is only located, not parsed)."""

    __slots__ = ("delivery_mode", "priority", "expiration", "headers_span", "user_id", "reply_to")

    def __init__(self) -> None:
        self.delivery_mode = 0
        self.priority = 0
        self.expiration: str | None = None
        self.headers_span: tuple[int, int] | None = None
        self.user_id: str | None = None
        self.reply_to: str | None = None


def summarize_properties(props: bytes) -> PropertySummary:
    """Read delivery_mode, priority, expiration and user_id, and locate the headers table.

    Raises AMQPError(SYNTAX_ERROR) for a property list that does not parse."""
    s = PropertySummary()
    try:
        flags = _h.unpack_from(props)[0]
        off = 2
        if not flags & 0xFFFC:
            return s
        for i in range(14):
            if not flags & (1 << (15 - i)):
                continue
            kind = _PROPERTY_KINDS[i]
            if kind == _SHORTSTR:
                n = props[off]
                if i == 7:
                    s.expiration = props[off + 1:off + 1 + n].decode()
                elif i == 11:
                    s.user_id = props[off + 1:off + 1 + n].decode()
                elif i == 6:
                    s.reply_to = props[off + 1:off + 1 + n].decode()
                off += 1 + n
            elif kind == _TABLE:
                n = _i.unpack_from(props, off)[0]
                s.headers_span = (off, off + 4 + n)
                off += 4 + n
            elif kind == _OCTET:
                if i == 3:
                    s.delivery_mode = props[off]
                else:
                    s.priority = props[off]
                off += 1
            else:
                off += 8
        if off > len(props):
            raise IndexError
    except (IndexError, struct.error, UnicodeDecodeError):
        raise spec.AMQPError(spec.SYNTAX_ERROR, "malformed content header properties", 60, 40) from None
    return s


def decode_headers(props: bytes, span: tuple[int, int] | None) -> dict[str, Any]:
    if span is None:
        return {}
    try:
        _n, table = decode.field_table(props[span[0]:span[1]])
    except Exception:
        raise spec.AMQPError(spec.SYNTAX_ERROR, "malformed headers table", 60, 40) from None
    return table


def decode_properties(props: bytes) -> commands.Basic.Properties:
    """All content properties, decoded by pamqp (for the few paths that rewrite them)."""
    p = commands.Basic.Properties()
    flags = _h.unpack_from(props)[0]
    p.unmarshal(flags, props[2:])
    return p


def encode_properties(p: commands.Basic.Properties) -> bytes:
    return p.marshal()


def encode_table(table: dict[str, Any]) -> bytes:
    return encode.field_table(table)


# ---------------------------------------------------------------- editing properties in place
#
# The broker rewrites a message's properties in two places only: dead-lettering (x-death and
# friends added to the headers, `expiration` removed) and direct reply-to (`reply_to`
# replaced). Decoding and re-encoding the whole property list would change the wire types of the
# publisher's own headers (pamqp picks the smallest integer type on encoding), so these edits
# splice bytes: every property and header entry not being changed is copied exactly as sent.

_SKIP_FIXED = {"t": 1, "b": 1, "B": 1, "s": 2, "u": 2, "I": 4, "i": 4, "l": 8, "L": 8, "f": 4, "d": 8,
               "D": 5, "T": 8, "V": 0}


def _skip_field(buf: bytes, off: int) -> int:
    """Offset after the typed field value starting at off (its type octet first)."""
    t = chr(buf[off])
    off += 1
    n = _SKIP_FIXED.get(t)
    if n is not None:
        return off + n
    if t in "SxAF":
        return off + 4 + _i.unpack_from(buf, off)[0]
    raise ValueError(f"unknown field type {t!r}")


def table_entries(table: bytes) -> list[tuple[str, bytes]]:
    """A field table (without its length prefix) as (key, raw typed value) pairs, in order."""
    out = []
    off = 0
    while off < len(table):
        n = table[off]
        key = table[off + 1:off + 1 + n].decode()
        vstart = off + 1 + n
        off = _skip_field(table, vstart)
        out.append((key, table[vstart:off]))
    if off != len(table):
        raise ValueError("truncated field table")
    return out


def typed_value(v: Any) -> bytes:
    """A header value with the types RabbitMQ uses for the headers it writes itself: integers
    as signed 64-bit ('l'), strings as long strings, datetimes as timestamps."""
    if isinstance(v, bool):
        return b"t" + (b"\x01" if v else b"\x00")
    if isinstance(v, int):
        return b"l" + struct.pack(">q", v)
    if isinstance(v, str):
        b = v.encode()
        return b"S" + _i.pack(len(b)) + b
    if isinstance(v, bytes):
        return b"S" + _i.pack(len(v)) + v
    if isinstance(v, list):
        body = b"".join(typed_value(x) for x in v)
        return b"A" + _i.pack(len(body)) + body
    if isinstance(v, dict):
        body = b"".join(shortstr(k) + typed_value(x) for k, x in v.items())
        return b"F" + _i.pack(len(body)) + body
    return encode.encode_table_value(v)  # datetimes, decimals, floats, None


def edit_properties(props: bytes, *, set_headers: dict[str, bytes] | None = None,
                    drop: tuple[str, ...] = (), set_shortstr: dict[str, str] | None = None) -> bytes:
    """Rewrite raw content properties: add or replace header entries (`set_headers`: key -> raw
    typed value), remove properties named in `drop` ("expiration", "reply_to", ...), set short
    string properties (`set_shortstr`). Everything else is copied byte for byte."""
    flags = _h.unpack_from(props)[0]
    off = 2
    values: dict[str, bytes] = {}
    for i in range(14):
        if not flags & (1 << (15 - i)):
            continue
        kind = _PROPERTY_KINDS[i]
        if kind == _SHORTSTR:
            end = off + 1 + props[off]
        elif kind == _TABLE:
            end = off + 4 + _i.unpack_from(props, off)[0]
        elif kind == _OCTET:
            end = off + 1
        else:
            end = off + 8
        values[PROPERTY_NAMES[i]] = props[off:end]
        off = end
    if set_headers:
        raw = values.get("headers")
        entries = table_entries(raw[4:]) if raw is not None else []
        keys = {k for k, _ in entries}
        merged = [(k, set_headers[k] if k in set_headers else v) for k, v in entries]
        merged += [(k, v) for k, v in set_headers.items() if k not in keys]
        body = b"".join(shortstr(k) + v for k, v in merged)
        values["headers"] = _i.pack(len(body)) + body
    for name in drop:
        values.pop(name, None)
    for name, text in (set_shortstr or {}).items():
        values[name] = shortstr(text)
    flags = 0
    parts = []
    for i, name in enumerate(PROPERTY_NAMES):
        v = values.get(name)
        if v is not None:
            flags |= 1 << (15 - i)
            parts.append(v)
    return _h.pack(flags) + b"".join(parts)
