"""AMQP 1.0 messages: the type system, the bare message sections, and RabbitMQ's mapping to and
from AMQP 0-9-1 content.

Every message in a stream is stored as an AMQP 1.0 message, whichever protocol published it, as
RabbitMQ stores it: stream-protocol clients (rstream, rbfly, the Java and .NET clients) encode
and decode the AMQP 1.0 message themselves, and the broker converts an AMQP 0-9-1 publish to
AMQP 1.0 on the way in (`from_basic`) and back for an AMQP 0-9-1 consumer (`to_basic`).

- The type system is OASIS AMQP 1.0 part 1 (§1.6 encodings): every primitive type, described
  types, lists, maps and arrays. The encoder writes the shortest form (smallint, smallulong,
  uint0, str8, list0, ...). The decoder is total over bytes: anything malformed raises
  `AmqpDecodeError` (a `ValueError`) saying what and where, never another exception; nesting
  is bounded by `DEPTH_MAX`, and every count is checked against the bytes there are before
  anything is built (an array of zero-width elements gets at most a few per byte of input).
- The sections are part 3 §3.2: header, delivery-annotations, message-annotations,
  properties, application-properties, data (one or more), amqp-sequence (one or more),
  amqp-value, footer (`Message`).
- `from_basic` and `to_basic` follow RabbitMQ 3.13's message containers (`mc_amqpl`
  converting to and from `mc_amqp`, and `mc_amqp:protocol_state` adding `x-exchange` and
  `x-routing-key`), with 4.x's reading of several data sections as one body. Where RabbitMQ
  has no rule (an AMQP 1.0 uuid, char or decimal in application properties; a 0-9-1 decimal
  header) the choice made here is written next to the code. Both conversions remember the
  last few thousand property sets they converted (bounded, and only small ones), because a
  publisher sends the same properties again and again.

Python representation of AMQP 1.0 values (decoding gives exactly these types back, so a
decoded value re-encodes to the same types):

    null -> None            boolean -> bool             string -> str
    ubyte/ushort/uint/ulong -> UByte/UShort/UInt/ULong (int subclasses)
    byte/short/int -> Byte/Short/Int (int subclasses)   long -> int
    float -> Float (a float subclass)                   double -> float
    timestamp -> Timestamp (int, milliseconds since the epoch)
    char -> Char (a str subclass of length 1)           symbol -> Symbol (a str subclass)
    uuid -> uuid.UUID       binary -> bytes             decimal32/64/128 -> Decimal32/64/128 (bytes)
    list -> list            map -> dict                 described -> Described(descriptor, value)
    array -> Array (a list subclass that also holds the element type and any descriptor)

On encoding, bytearray and memoryview are binary, tuple is a list, and a datetime is a
timestamp. A plain int is a long: use the wrappers for the unsigned and narrower types. Map
keys that Python holds equal (the symbol "a" and the string "a", UInt(1) and ULong(1)) are one
key: the last one read wins. A map key that Python cannot hash (a list, a map) is refused with
`AmqpDecodeError`.

Nothing here does I/O, reads a clock, or imports another part of hutch.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import struct
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = [
    "AmqpDecodeError", "UByte", "UShort", "UInt", "ULong", "Byte", "Short", "Int", "Float",
    "Timestamp", "Char", "Symbol", "Decimal32", "Decimal64", "Decimal128", "Array", "Described",
    "encode_value", "decode_value", "Header", "Properties", "Message", "NO_VALUE", "data_only",
    "from_basic", "to_basic", "route", "filter_value", "NO_PROPERTIES", "AMQP10_TYPE", "BASIC_PROPERTY_NAMES", "DEPTH_MAX",
]

DEPTH_MAX = 64  # lists, maps, arrays and described values nested deeper are refused


class AmqpDecodeError(ValueError):
    """Bytes that are not a well-formed AMQP 1.0 value or message."""


# ---------------------------------------------------------------- the Python types

class UByte(int):
    __slots__ = ()


class UShort(int):
    __slots__ = ()


class UInt(int):
    __slots__ = ()


class ULong(int):
    __slots__ = ()


class Byte(int):
    __slots__ = ()


class Short(int):
    __slots__ = ()


class Int(int):
    __slots__ = ()


class Timestamp(int):
    """Milliseconds since the Unix epoch (signed 64 bits)."""
    __slots__ = ()


class Float(float):
    """A 32-bit IEEE 754 float."""
    __slots__ = ()


class Symbol(str):
    __slots__ = ()


class Char(str):
    """One UTF-32 code point."""
    __slots__ = ()


class Decimal32(bytes):
    """IEEE 754 decimal32, kept as its 4 bytes."""
    __slots__ = ()


class Decimal64(bytes):
    """IEEE 754 decimal64, kept as its 8 bytes."""
    __slots__ = ()


class Decimal128(bytes):
    """IEEE 754 decimal128, kept as its 16 bytes."""
    __slots__ = ()


_INT_RANGES: dict[type, tuple[int, int]] = {
    UByte: (0, 0xFF), UShort: (0, 0xFFFF), UInt: (0, 0xFFFFFFFF), ULong: (0, 2**64 - 1),
    Byte: (-2**7, 2**7 - 1), Short: (-2**15, 2**15 - 1), Int: (-2**31, 2**31 - 1),
    int: (-2**63, 2**63 - 1), Timestamp: (-2**63, 2**63 - 1),
}


class Array(list):
    """An AMQP array: elements of one type (`element_type`, one of the classes above or None's,
    bool's, str's, bytes', int's, float's, uuid.UUID, list, dict or Array), all described by
    `descriptor` when it is set (the elements are then the undescribed values)."""

    __slots__ = ("element_type", "descriptor")

    def __init__(self, items: Iterable[Any] = (), element_type: type = type(None), descriptor: Any = None):
        super().__init__(items)
        self.element_type = element_type
        self.descriptor = descriptor

    def __repr__(self) -> str:
        d = f", descriptor={self.descriptor!r}" if self.descriptor is not None else ""
        return f"Array({list.__repr__(self)}, {self.element_type.__name__}{d})"


class Described:
    """A described value: `descriptor` (usually a ULong or a Symbol) and `value`."""

    __slots__ = ("descriptor", "value")

    def __init__(self, descriptor: Any, value: Any):
        self.descriptor = descriptor
        self.value = value

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Described) and self.descriptor == other.descriptor
                and self.value == other.value)

    def __hash__(self) -> int:
        return hash((Described, self.descriptor))

    def __repr__(self) -> str:
        return f"Described({self.descriptor!r}, {self.value!r})"


# ---------------------------------------------------------------- encoding

_b = struct.Struct(">b")
_B = struct.Struct(">B")
_h = struct.Struct(">h")
_H = struct.Struct(">H")
_i = struct.Struct(">i")
_I = struct.Struct(">I")
_q = struct.Struct(">q")
_Q = struct.Struct(">Q")
_f = struct.Struct(">f")
_d = struct.Struct(">d")
_BB = struct.Struct(">BB")
_BI = struct.Struct(">BI")
_BII = struct.Struct(">BII")
_Bb = struct.Struct(">Bb")
_Bh = struct.Struct(">Bh")
_BH = struct.Struct(">BH")
_Bi = struct.Struct(">Bi")
_BQ = struct.Struct(">BQ")
_Bq = struct.Struct(">Bq")
_Bf = struct.Struct(">Bf")
_Bd = struct.Struct(">Bd")
_BBB = struct.Struct(">BBB")

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


def _check_range(v: int, t: type) -> None:
    lo, hi = _INT_RANGES[t]
    if not lo <= v <= hi:
        raise ValueError(f"{v} is out of range for an AMQP {_TYPE_NAMES[t]}")


def _enc_null(v: None) -> bytes:
    return b"\x40"


def _enc_bool(v: bool) -> bytes:
    return b"\x41" if v else b"\x42"


def _enc_long(v: int) -> bytes:
    if -128 <= v <= 127:
        return _Bb.pack(0x55, v)
    _check_range(v, int)
    return _Bq.pack(0x81, v)


def _enc_ubyte(v: int) -> bytes:
    _check_range(v, UByte)
    return _BB.pack(0x50, v)


def _enc_ushort(v: int) -> bytes:
    _check_range(v, UShort)
    return _BH.pack(0x60, v)


def _enc_uint(v: int) -> bytes:
    if v == 0:
        return b"\x43"
    if 0 < v <= 0xFF:
        return _BB.pack(0x52, v)
    _check_range(v, UInt)
    return _BI.pack(0x70, v)


def _enc_ulong(v: int) -> bytes:
    if v == 0:
        return b"\x44"
    if 0 < v <= 0xFF:
        return _BB.pack(0x53, v)
    _check_range(v, ULong)
    return _BQ.pack(0x80, v)


def _enc_byte(v: int) -> bytes:
    _check_range(v, Byte)
    return _Bb.pack(0x51, v)


def _enc_short(v: int) -> bytes:
    _check_range(v, Short)
    return _Bh.pack(0x61, v)


def _enc_int(v: int) -> bytes:
    if -128 <= v <= 127:
        return _Bb.pack(0x54, v)
    _check_range(v, Int)
    return _Bi.pack(0x71, v)


def _enc_timestamp(v: int) -> bytes:
    _check_range(v, Timestamp)
    return _Bq.pack(0x83, v)


def _enc_datetime(v: _dt.datetime) -> bytes:
    return _enc_timestamp(_datetime_ms(v))


def _datetime_ms(v: _dt.datetime) -> int:
    if v.tzinfo is None:
        v = v.replace(tzinfo=_dt.UTC)
    delta = v - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1000 + delta.microseconds // 1000


def _enc_float(v: float) -> bytes:
    try:
        return _Bf.pack(0x72, v)
    except OverflowError:
        raise ValueError(f"{v} is out of range for an AMQP float") from None


def _enc_double(v: float) -> bytes:
    return _Bd.pack(0x82, v)


def _enc_string(v: str) -> bytes:
    b = v.encode()
    n = len(b)
    if n <= 0xFF:
        return _BB.pack(0xA1, n) + b
    return _BI.pack(0xB1, n) + b


def _enc_symbol(v: str) -> bytes:
    b = v.encode()
    n = len(b)
    if n <= 0xFF:
        return _BB.pack(0xA3, n) + b
    return _BI.pack(0xB3, n) + b


def _enc_char(v: str) -> bytes:
    if len(v) != 1:
        raise ValueError(f"an AMQP char is one code point, not {len(v)}")
    return _BI.pack(0x73, ord(v))


def _enc_binary(v: bytes) -> bytes:
    n = len(v)
    if n <= 0xFF:
        return _BB.pack(0xA0, n) + bytes(v)
    return _BI.pack(0xB0, n) + bytes(v)


def _enc_uuid(v: uuid.UUID) -> bytes:
    return b"\x98" + v.bytes


def _enc_decimal(code: int, size: int) -> Callable[[bytes], bytes]:
    def enc(v: bytes) -> bytes:
        if len(v) != size:
            raise ValueError(f"an AMQP decimal{size * 8} is {size} bytes, not {len(v)}")
        return bytes((code,)) + v
    return enc


def _compound(short_code: int, long_code: int, count: int, body: bytes) -> bytes:
    n = len(body)
    if n < 0xFF and count <= 0xFF:
        return _BBB.pack(short_code, n + 1, count) + body
    return _BII.pack(long_code, n + 4, count) + body


def _enc_list(v: list | tuple) -> bytes:
    if not v:
        return b"\x45"
    return _compound(0xC0, 0xD0, len(v), b"".join([_encode(x) for x in v]))


def _enc_map(v: Mapping[Any, Any]) -> bytes:
    return _compound(0xC1, 0xD1, 2 * len(v), b"".join([_encode(k) + _encode(x) for k, x in v.items()]))


def _enc_described(v: Described) -> bytes:
    return b"\x00" + _encode(v.descriptor) + _encode(v.value)


# Array elements: the element constructor, and each element's bytes without a constructor.
# Variable-width elements take the 8-bit width when every element fits; compound elements take
# the 32-bit forms (the constructor is shared, so the widest element decides).

def _arr_fixed(code: int, fmt: str) -> Callable[[list], tuple[bytes, bytes]]:
    def parts(items: list) -> tuple[bytes, bytes]:
        return bytes((code,)), struct.pack(f">{len(items)}{fmt}", *items)
    return parts


def _arr_ranged(t: type, code: int, fmt: str) -> Callable[[list], tuple[bytes, bytes]]:
    fixed = _arr_fixed(code, fmt)

    def parts(items: list) -> tuple[bytes, bytes]:
        for x in items:
            _check_range(x, t)
        return fixed(items)
    return parts


def _arr_float(items: list) -> tuple[bytes, bytes]:
    try:
        return b"\x72", struct.pack(f">{len(items)}f", *items)
    except OverflowError:
        raise ValueError("a value is out of range for an AMQP float") from None


def _arr_variable(short_code: int, long_code: int, to_bytes: Callable[[Any], bytes]
                  ) -> Callable[[list], tuple[bytes, bytes]]:
    def parts(items: list) -> tuple[bytes, bytes]:
        raw = [to_bytes(x) for x in items]
        if all(len(r) <= 0xFF for r in raw):
            return bytes((short_code,)), b"".join([bytes((len(r),)) + r for r in raw])
        return bytes((long_code,)), b"".join([_I.pack(len(r)) + r for r in raw])
    return parts


def _arr_null(items: list) -> tuple[bytes, bytes]:
    if any(x is not None for x in items):
        raise ValueError("an array of nulls holds a value that is not None")
    return b"\x40", b""


def _arr_bool(items: list) -> tuple[bytes, bytes]:
    return b"\x56", bytes([1 if x else 0 for x in items])


def _arr_char(items: list) -> tuple[bytes, bytes]:
    return b"\x73", b"".join([_enc_char(x)[1:] for x in items])


def _arr_uuid(items: list) -> tuple[bytes, bytes]:
    return b"\x98", b"".join([x.bytes for x in items])


def _arr_decimal(code: int, size: int) -> Callable[[list], tuple[bytes, bytes]]:
    enc = _enc_decimal(code, size)
    return lambda items: (bytes((code,)), b"".join([enc(x)[1:] for x in items]))


def _arr_list(items: list) -> tuple[bytes, bytes]:
    out = []
    for x in items:
        body = b"".join([_encode(e) for e in x])
        out.append(_I.pack(len(body) + 4) + _I.pack(len(x)) + body)
    return b"\xd0", b"".join(out)


def _arr_map(items: list) -> tuple[bytes, bytes]:
    out = []
    for x in items:
        body = b"".join([_encode(k) + _encode(e) for k, e in x.items()])
        out.append(_I.pack(len(body) + 4) + _I.pack(2 * len(x)) + body)
    return b"\xd1", b"".join(out)


def _arr_array(items: list) -> tuple[bytes, bytes]:
    out = []
    for x in items:
        ctor, body = _array_parts(x)
        out.append(_I.pack(len(ctor) + len(body) + 4) + _I.pack(len(x)) + ctor + body)
    return b"\xf0", b"".join(out)


_ARRAY_PARTS: dict[type, Callable[[list], tuple[bytes, bytes]]] = {
    type(None): _arr_null, bool: _arr_bool,
    UByte: _arr_ranged(UByte, 0x50, "B"), UShort: _arr_ranged(UShort, 0x60, "H"),
    UInt: _arr_ranged(UInt, 0x70, "I"), ULong: _arr_ranged(ULong, 0x80, "Q"),
    Byte: _arr_ranged(Byte, 0x51, "b"), Short: _arr_ranged(Short, 0x61, "h"),
    Int: _arr_ranged(Int, 0x71, "i"), int: _arr_ranged(int, 0x81, "q"),
    Timestamp: _arr_ranged(Timestamp, 0x83, "q"),
    Float: _arr_float, float: _arr_fixed(0x82, "d"),
    Char: _arr_char, uuid.UUID: _arr_uuid,
    str: _arr_variable(0xA1, 0xB1, lambda x: x.encode()),
    Symbol: _arr_variable(0xA3, 0xB3, lambda x: x.encode()),
    bytes: _arr_variable(0xA0, 0xB0, bytes),
    Decimal32: _arr_decimal(0x74, 4), Decimal64: _arr_decimal(0x84, 8), Decimal128: _arr_decimal(0x94, 16),
    list: _arr_list, dict: _arr_map,
}


def _array_parts(v: Array) -> tuple[bytes, bytes]:
    """(constructor, elements) of an array."""
    parts = _ARRAY_PARTS.get(v.element_type)
    if parts is None:
        if v.element_type is Array:
            parts = _arr_array
        else:
            raise TypeError(f"cannot encode an AMQP array of {v.element_type.__name__}")
    ctor, body = parts(v)
    if v.descriptor is not None:
        ctor = b"\x00" + _encode(v.descriptor) + ctor
    return ctor, body


def _enc_array(v: Array) -> bytes:
    ctor, body = _array_parts(v)
    n = len(ctor) + len(body)
    if n < 0xFF and len(v) <= 0xFF:
        return _BBB.pack(0xE0, n + 1, len(v)) + ctor + body
    return _BII.pack(0xF0, n + 4, len(v)) + ctor + body


_ENCODERS: dict[type, Callable[[Any], bytes]] = {
    type(None): _enc_null, bool: _enc_bool, int: _enc_long, float: _enc_double, str: _enc_string,
    bytes: _enc_binary, bytearray: _enc_binary, memoryview: _enc_binary,
    UByte: _enc_ubyte, UShort: _enc_ushort, UInt: _enc_uint, ULong: _enc_ulong,
    Byte: _enc_byte, Short: _enc_short, Int: _enc_int, Timestamp: _enc_timestamp,
    Float: _enc_float, Symbol: _enc_symbol, Char: _enc_char, uuid.UUID: _enc_uuid,
    Decimal32: _enc_decimal(0x74, 4), Decimal64: _enc_decimal(0x84, 8),
    Decimal128: _enc_decimal(0x94, 16),
    list: _enc_list, tuple: _enc_list, dict: _enc_map, Array: _enc_array,
    Described: _enc_described, _dt.datetime: _enc_datetime,
}

_TYPE_NAMES: dict[type, str] = {
    UByte: "ubyte", UShort: "ushort", UInt: "uint", ULong: "ulong", Byte: "byte", Short: "short",
    Int: "int", int: "long", Timestamp: "timestamp",
}


def _encode(v: Any) -> bytes:
    enc = _ENCODERS.get(type(v))
    if enc is None:
        for base in type(v).__mro__[1:]:  # subclasses of the types above (OrderedDict, ...)
            enc = _ENCODERS.get(base)
            if enc is not None:
                break
        else:
            if isinstance(v, Mapping):
                enc = _enc_map
            else:
                raise TypeError(f"cannot encode a value of type {type(v).__name__} as AMQP 1.0")
    return enc(v)


def encode_value(v: Any) -> bytes:
    """One value in the AMQP 1.0 encoding. Raises TypeError for a Python type with no AMQP
    meaning and ValueError for a value out of its type's range."""
    try:
        return _encode(v)
    except struct.error as e:
        raise ValueError(f"cannot encode {v!r} as AMQP 1.0: {e}") from None


# ---------------------------------------------------------------- decoding
#
# A decoder takes (buf, off, end, depth) with `off` just after the constructor byte and `end`
# the end of the enclosing value, and returns (value, offset after it). Every read is checked
# against `end`.

def _truncated(what: str, off: int) -> AmqpDecodeError:
    return AmqpDecodeError(f"truncated {what} at offset {off}")


def _fixed(size: int, what: str, conv: Callable[[bytes, int], Any]):
    def dec(buf: bytes, off: int, end: int, depth: int) -> tuple[Any, int]:
        nxt = off + size
        if nxt > end:
            raise _truncated(what, off - 1)
        return conv(buf, off), nxt
    return dec


def _const(value: Any):
    def dec(buf: bytes, off: int, end: int, depth: int) -> tuple[Any, int]:
        return value, off
    return dec


def _dec_boolean(buf: bytes, off: int, end: int, depth: int) -> tuple[bool, int]:
    if off >= end:
        raise _truncated("boolean", off - 1)
    b = buf[off]
    if b > 1:
        raise AmqpDecodeError(f"boolean with value 0x{b:02x} at offset {off - 1} (0x00 or 0x01 expected)")
    return b == 1, off + 1


def _dec_char(buf: bytes, off: int, end: int, depth: int) -> tuple[Char, int]:
    if off + 4 > end:
        raise _truncated("char", off - 1)
    cp = _I.unpack_from(buf, off)[0]
    if cp > 0x10FFFF or 0xD800 <= cp <= 0xDFFF:  # (a surrogate has no UTF-8 form to pass on)
        raise AmqpDecodeError(f"char U+{cp:X} at offset {off - 1} is not a Unicode character")
    return Char(chr(cp)), off + 4


def _variable(width: int, what: str, kind: type):
    """A decoder of binary (`kind` bytes), string (str) or symbol (Symbol) values."""
    def dec(buf: bytes, off: int, end: int, depth: int) -> tuple[Any, int]:
        if width == 1:
            start = off + 1
            if start > end:
                raise _truncated(what, off - 1)
            nxt = start + buf[off]
        else:
            start = off + 4
            if start > end:
                raise _truncated(what, off - 1)
            nxt = start + _I.unpack_from(buf, off)[0]
        if nxt > end:
            raise _truncated(what, off - 1)
        if kind is bytes:
            return buf[start:nxt], nxt
        try:
            text = buf[start:nxt].decode()
        except UnicodeDecodeError:
            raise AmqpDecodeError(f"{what} at offset {off - 1} is not valid UTF-8") from None
        return (text if kind is str else Symbol(text)), nxt
    return dec


def _sizes(buf: bytes, off: int, end: int, width: int, what: str) -> tuple[int, int, int]:
    """(count, first item offset, end of the compound) of a list, map or array."""
    if off + 2 * width > end:
        raise _truncated(what, off - 1)
    if width == 1:
        size, count = buf[off], buf[off + 1]
    else:
        size, count = _I.unpack_from(buf, off)[0], _I.unpack_from(buf, off + 4)[0]
    stop = off + width + size
    if size < width or stop > end:
        raise _truncated(what, off - 1)
    return count, off + 2 * width, stop


def _list(width: int):
    what = "list8" if width == 1 else "list32"

    def dec(buf: bytes, off: int, end: int, depth: int) -> tuple[list, int]:
        if depth >= DEPTH_MAX:
            raise AmqpDecodeError(f"values nested deeper than {DEPTH_MAX} at offset {off - 1}")
        count, p, stop = _sizes(buf, off, end, width, what)
        if count > stop - p:
            raise AmqpDecodeError(f"{what} at offset {off - 1} claims {count} items in {stop - p} bytes")
        out = []
        for _ in range(count):
            if p < stop and buf[p] == 0x40:  # null, as most absent fields of a section are
                out.append(None)
                p += 1
            else:
                v, p = _decode(buf, p, stop, depth + 1)
                out.append(v)
        if p != stop:
            raise AmqpDecodeError(f"{what} at offset {off - 1}: its items end at {p}, its size says {stop}")
        return out, stop
    return dec


def _map(width: int):
    what = "map8" if width == 1 else "map32"

    def dec(buf: bytes, off: int, end: int, depth: int) -> tuple[dict, int]:
        if depth >= DEPTH_MAX:
            raise AmqpDecodeError(f"values nested deeper than {DEPTH_MAX} at offset {off - 1}")
        count, p, stop = _sizes(buf, off, end, width, what)
        if count % 2:
            raise AmqpDecodeError(f"{what} at offset {off - 1} has an odd number of items ({count})")
        if count > stop - p:
            raise AmqpDecodeError(f"{what} at offset {off - 1} claims {count} items in {stop - p} bytes")
        out = {}
        for _ in range(count // 2):
            k, p = _decode(buf, p, stop, depth + 1)
            v, p = _decode(buf, p, stop, depth + 1)
            try:
                out[k] = v
            except TypeError:
                raise AmqpDecodeError(f"{what} at offset {off - 1} has a key of type "
                                      f"{type(k).__name__}, which is not supported") from None
        if p != stop:
            raise AmqpDecodeError(f"{what} at offset {off - 1}: its items end at {p}, its size says {stop}")
        return out, stop
    return dec


# Each element constructor an array may have: the Python element type it gives.
_ARRAY_ELEMENT_TYPES: dict[int, type] = {
    0x40: type(None), 0x41: bool, 0x42: bool, 0x56: bool,
    0x50: UByte, 0x60: UShort, 0x70: UInt, 0x52: UInt, 0x43: UInt, 0x80: ULong, 0x53: ULong, 0x44: ULong,
    0x51: Byte, 0x61: Short, 0x71: Int, 0x54: Int, 0x81: int, 0x55: int, 0x72: Float, 0x82: float,
    0x74: Decimal32, 0x84: Decimal64, 0x94: Decimal128, 0x73: Char, 0x83: Timestamp, 0x98: uuid.UUID,
    0xA0: bytes, 0xB0: bytes, 0xA1: str, 0xB1: str, 0xA3: Symbol, 0xB3: Symbol,
    0x45: list, 0xC0: list, 0xD0: list, 0xC1: dict, 0xD1: dict, 0xE0: Array, 0xF0: Array,
}
_ZERO_WIDTH = frozenset((0x40, 0x41, 0x42, 0x43, 0x44, 0x45))


def _array(width: int):
    what = "array8" if width == 1 else "array32"

    def dec(buf: bytes, off: int, end: int, depth: int) -> tuple[Array, int]:
        if depth >= DEPTH_MAX:
            raise AmqpDecodeError(f"values nested deeper than {DEPTH_MAX} at offset {off - 1}")
        count, p, stop = _sizes(buf, off, end, width, what)
        if p >= stop:
            raise _truncated(what, off - 1)
        descriptor = None
        if buf[p] == 0x00:
            descriptor, p = _decode(buf, p + 1, stop, depth + 1)
            if p >= stop:
                raise _truncated(what, off - 1)
        code = buf[p]
        element_type = _ARRAY_ELEMENT_TYPES.get(code)
        if element_type is None:
            raise AmqpDecodeError(f"{what} at offset {off - 1} has elements of unknown type 0x{code:02x}")
        p += 1
        # zero-width elements take no bytes: bound them by the input's size, not the array's
        room = 255 + 8 * len(buf) if code in _ZERO_WIDTH else stop - p
        if count > room:
            raise AmqpDecodeError(f"{what} at offset {off - 1} claims {count} elements in {stop - p} bytes")
        element = _DECODERS[code]
        out = Array((), element_type, descriptor)
        for _ in range(count):
            v, p = element(buf, p, stop, depth + 1)
            out.append(v)
        if p != stop:
            raise AmqpDecodeError(f"{what} at offset {off - 1}: its elements end at {p}, its size says {stop}")
        return out, stop
    return dec


def _dec_described(buf: bytes, off: int, end: int, depth: int) -> tuple[Described, int]:
    if depth >= DEPTH_MAX:
        raise AmqpDecodeError(f"values nested deeper than {DEPTH_MAX} at offset {off - 1}")
    descriptor, p = _decode(buf, off, end, depth + 1)
    value, p = _decode(buf, p, end, depth + 1)
    return Described(descriptor, value), p


def _uuid(buf: bytes, off: int) -> uuid.UUID:
    return uuid.UUID(bytes=bytes(buf[off:off + 16]))


_DECODERS: dict[int, Callable[[bytes, int, int, int], tuple[Any, int]]] = {
    0x00: _dec_described,
    0x40: _const(None), 0x41: _const(True), 0x42: _const(False), 0x56: _dec_boolean,
    0x43: _const(UInt(0)), 0x44: _const(ULong(0)), 0x45: lambda buf, off, end, depth: ([], off),
    0x50: _fixed(1, "ubyte", lambda b, o: UByte(b[o])),
    0x60: _fixed(2, "ushort", lambda b, o: UShort(_H.unpack_from(b, o)[0])),
    0x70: _fixed(4, "uint", lambda b, o: UInt(_I.unpack_from(b, o)[0])),
    0x52: _fixed(1, "smalluint", lambda b, o: UInt(b[o])),
    0x80: _fixed(8, "ulong", lambda b, o: ULong(_Q.unpack_from(b, o)[0])),
    0x53: _fixed(1, "smallulong", lambda b, o: ULong(b[o])),
    0x51: _fixed(1, "byte", lambda b, o: Byte(_b.unpack_from(b, o)[0])),
    0x61: _fixed(2, "short", lambda b, o: Short(_h.unpack_from(b, o)[0])),
    0x71: _fixed(4, "int", lambda b, o: Int(_i.unpack_from(b, o)[0])),
    0x54: _fixed(1, "smallint", lambda b, o: Int(_b.unpack_from(b, o)[0])),
    0x81: _fixed(8, "long", lambda b, o: _q.unpack_from(b, o)[0]),
    0x55: _fixed(1, "smalllong", lambda b, o: _b.unpack_from(b, o)[0]),
    0x72: _fixed(4, "float", lambda b, o: Float(_f.unpack_from(b, o)[0])),
    0x82: _fixed(8, "double", lambda b, o: _d.unpack_from(b, o)[0]),
    0x74: _fixed(4, "decimal32", lambda b, o: Decimal32(b[o:o + 4])),
    0x84: _fixed(8, "decimal64", lambda b, o: Decimal64(b[o:o + 8])),
    0x94: _fixed(16, "decimal128", lambda b, o: Decimal128(b[o:o + 16])),
    0x73: _dec_char,
    0x83: _fixed(8, "timestamp", lambda b, o: Timestamp(_q.unpack_from(b, o)[0])),
    0x98: _fixed(16, "uuid", _uuid),
    0xA0: _variable(1, "vbin8", bytes), 0xB0: _variable(4, "vbin32", bytes),
    0xA1: _variable(1, "str8", str), 0xB1: _variable(4, "str32", str),
    0xA3: _variable(1, "sym8", Symbol), 0xB3: _variable(4, "sym32", Symbol),
    0xC0: _list(1), 0xD0: _list(4), 0xC1: _map(1), 0xD1: _map(4), 0xE0: _array(1), 0xF0: _array(4),
}


def _decode(buf: bytes, off: int, end: int, depth: int) -> tuple[Any, int]:
    if off >= end:
        raise _truncated("value", off)
    dec = _DECODERS.get(buf[off])
    if dec is None:
        raise _unknown(buf[off], off)
    return dec(buf, off + 1, end, depth)


def _unknown(code: int, off: int) -> AmqpDecodeError:
    return AmqpDecodeError(f"unknown type code 0x{code:02x} at offset {off}")


def _guarded(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a decoder; any slip the checks above did not foresee still becomes AmqpDecodeError."""
    try:
        return fn(*args)
    except AmqpDecodeError:
        raise
    except (IndexError, struct.error, ValueError, TypeError, RecursionError, UnicodeDecodeError) as e:
        raise AmqpDecodeError(f"malformed AMQP 1.0 data: {e}") from None


def decode_value(data: bytes) -> Any:
    """The one AMQP 1.0 value that `data` holds exactly. Raises AmqpDecodeError otherwise."""
    buf = bytes(data)
    v, off = _guarded(_decode, buf, 0, len(buf), 0)
    if off != len(buf):
        raise AmqpDecodeError(f"{len(buf) - off} bytes after the value at offset {off}")
    return v


# ---------------------------------------------------------------- message sections (part 3 §3.2)

HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES = 0x70, 0x71, 0x72, 0x73
APPLICATION_PROPERTIES, DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER = 0x74, 0x75, 0x76, 0x77, 0x78

_SECTION_SYMBOLS = {
    "amqp:header:list": HEADER, "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": MESSAGE_ANNOTATIONS, "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APPLICATION_PROPERTIES, "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": AMQP_SEQUENCE, "amqp:amqp-value:*": AMQP_VALUE, "amqp:footer:map": FOOTER,
}
_SECTION_NAMES = {
    HEADER: "header", DELIVERY_ANNOTATIONS: "delivery-annotations", MESSAGE_ANNOTATIONS: "message-annotations",
    PROPERTIES: "properties", APPLICATION_PROPERTIES: "application-properties", DATA: "data",
    AMQP_SEQUENCE: "amqp-sequence", AMQP_VALUE: "amqp-value", FOOTER: "footer",
}


class NoValue:
    """The absence of an amqp-value section (None is the amqp-value null)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_VALUE"

    def __bool__(self) -> bool:
        return False


NO_VALUE = NoValue()


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class _Composite:
    """A section that is a described list of typed fields (header, properties): a field is
    None when absent; trailing absent fields are not encoded."""

    __slots__ = ()
    CODE = 0
    FIELDS: tuple[str, ...] = ()
    # per field: (the class its value is encoded as, the test a decoded value must pass)
    TYPES: tuple[tuple[Callable[[Any], Any], Callable[[Any], bool]], ...] = ()

    def fields(self) -> list[Any]:
        return [getattr(self, n) for n in self.FIELDS]

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.fields() == other.fields()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        set_ = ", ".join(f"{n}={v!r}" for n, v in zip(self.FIELDS, self.fields(), strict=True) if v is not None)
        return f"{type(self).__name__}({set_})"

    def encode(self) -> bytes:
        values = self.fields()
        n = len(values)
        while n and values[n - 1] is None:
            n -= 1
        items = []
        for (as_type, _ok), v in zip(self.TYPES[:n], values[:n], strict=True):
            items.append(b"\x40" if v is None else _encode(as_type(v)))
        body = b"".join(items)
        return b"\x00\x53" + bytes((self.CODE,)) + (_compound(0xC0, 0xD0, n, body) if n else b"\x45")

    @classmethod
    def from_list(cls, values: Any) -> Any:
        name = _SECTION_NAMES[cls.CODE]
        if not isinstance(values, list):
            raise AmqpDecodeError(f"{name} section is a {type(values).__name__}, not a list")
        section = cls()
        for field, (_as_type, ok), v in zip(cls.FIELDS, cls.TYPES, values, strict=False):  # a list may be short
            if v is None:
                continue
            if not ok(v):
                raise AmqpDecodeError(f"{name} field {field.replace('_', '-')} has a value of type "
                                      f"{type(v).__name__}")
            setattr(section, field, v)
        return section  # fields past the ones defined are ignored, as the spec allows


def _message_id(v: Any) -> Any:
    if isinstance(v, (str, bytes, uuid.UUID, ULong)):
        return v
    if _is_int(v):
        return ULong(v)
    raise TypeError(f"a message id is a ulong, uuid, binary or string, not {type(v).__name__}")


def _is_message_id(v: Any) -> bool:
    return isinstance(v, (ULong, uuid.UUID, bytes, str)) and not isinstance(v, (Symbol, Char))


def _timestamp(v: Any) -> Timestamp:
    return Timestamp(_datetime_ms(v) if isinstance(v, _dt.datetime) else v)


def _is_str(v: Any) -> bool:
    return isinstance(v, str) and not isinstance(v, Char)


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def _is_bytes(v: Any) -> bool:
    return isinstance(v, bytes)


class Header(_Composite):
    __slots__ = ("durable", "priority", "ttl", "first_acquirer", "delivery_count")
    CODE = HEADER
    FIELDS = __slots__
    TYPES = ((bool, _is_bool), (UByte, lambda v: isinstance(v, UByte)), (UInt, lambda v: isinstance(v, UInt)),
             (bool, _is_bool), (UInt, lambda v: isinstance(v, UInt)))

    def __init__(self, durable: bool | None = None, priority: int | None = None, ttl: int | None = None,
                 first_acquirer: bool | None = None, delivery_count: int | None = None):
        self.durable = durable
        self.priority = priority
        self.ttl = ttl
        self.first_acquirer = first_acquirer
        self.delivery_count = delivery_count


class Properties(_Composite):
    __slots__ = ("message_id", "user_id", "to", "subject", "reply_to", "correlation_id", "content_type",
                 "content_encoding", "absolute_expiry_time", "creation_time", "group_id", "group_sequence",
                 "reply_to_group_id")
    CODE = PROPERTIES
    FIELDS = __slots__
    TYPES = ((_message_id, _is_message_id), (bytes, _is_bytes), (str, _is_str), (str, _is_str),
             (str, _is_str), (_message_id, _is_message_id),
             # content-type and content-encoding are symbols; some clients send strings
             (Symbol, _is_str), (Symbol, _is_str),
             (_timestamp, lambda v: isinstance(v, Timestamp)), (_timestamp, lambda v: isinstance(v, Timestamp)),
             (str, _is_str), (UInt, lambda v: isinstance(v, UInt)), (str, _is_str))

    def __init__(self, message_id: Any = None, user_id: bytes | None = None, to: str | None = None,
                 subject: str | None = None, reply_to: str | None = None, correlation_id: Any = None,
                 content_type: str | None = None, content_encoding: str | None = None,
                 absolute_expiry_time: int | None = None, creation_time: int | None = None,
                 group_id: str | None = None, group_sequence: int | None = None,
                 reply_to_group_id: str | None = None):
        self.message_id = message_id
        self.user_id = user_id
        self.to = to
        self.subject = subject
        self.reply_to = reply_to
        self.correlation_id = correlation_id
        self.content_type = content_type
        self.content_encoding = content_encoding
        self.absolute_expiry_time = absolute_expiry_time
        self.creation_time = creation_time
        self.group_id = group_id
        self.group_sequence = group_sequence
        self.reply_to_group_id = reply_to_group_id


def _annotations(v: Mapping[Any, Any]) -> dict[Any, Any]:
    """Annotation keys are symbols (or ulongs): a plain string key is written as a symbol."""
    return {Symbol(k) if type(k) is str else k: x for k, x in v.items()}


def _map_section(code: int, v: Mapping[Any, Any]) -> bytes:
    return b"\x00\x53" + bytes((code,)) + _enc_map(v)


def _data_header(n: int) -> bytes:
    """The bytes of a data section before its `n` bytes of payload."""
    if n <= 0xFF:
        return b"\x00\x53\x75\xa0" + bytes((n,))
    return b"\x00\x53\x75\xb0" + _I.pack(n)


class Message:
    """An AMQP 1.0 message: its sections, each None (or empty) when absent.

    The body is one of: `data`, a list of binary sections (the usual one); `sequence`, a list
    of amqp-sequence sections (each a list); or `value`, one amqp-value (any value, None being
    the null value; `NO_VALUE` when there is none). `body` gives the data sections joined."""

    __slots__ = ("header", "delivery_annotations", "message_annotations", "properties",
                 "application_properties", "data", "sequence", "value", "footer")

    def __init__(self, data: bytes | list[bytes] | None = None, *, header: Header | None = None,
                 delivery_annotations: dict | None = None, message_annotations: dict | None = None,
                 properties: Properties | None = None, application_properties: dict | None = None,
                 sequence: list[list] | None = None, value: Any = NO_VALUE, footer: dict | None = None):
        self.data: list[bytes] = [data] if type(data) is bytes or isinstance(data, (bytearray, memoryview)) \
            else (data or [])
        self.header = header
        self.delivery_annotations = delivery_annotations
        self.message_annotations = message_annotations
        self.properties = properties
        self.application_properties = application_properties
        self.sequence: list[list] = sequence or []
        self.value = value
        self.footer = footer

    @property
    def body(self) -> bytes:
        d = self.data
        return d[0] if len(d) == 1 else b"".join(d)

    def __eq__(self, other: object) -> bool:
        return type(other) is Message and all(getattr(self, s) == getattr(other, s) for s in Message.__slots__)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        set_ = ", ".join(f"{s}={getattr(self, s)!r}" for s in Message.__slots__
                         if getattr(self, s) not in (None, [], NO_VALUE))
        return f"Message({set_})"

    def encode(self) -> bytes:
        data = self.data
        if (len(data) == 1 and self.header is None and self.message_annotations is None
                and self.properties is None and self.application_properties is None
                and self.delivery_annotations is None and self.footer is None
                and self.value is NO_VALUE and not self.sequence):
            d = data[0]
            return _data_header(len(d)) + d
        try:
            return self._encode_sections()
        except struct.error as e:
            raise ValueError(f"cannot encode the message: {e}") from None

    def _encode_sections(self) -> bytes:
        kinds = bool(self.data) + bool(self.sequence) + (self.value is not NO_VALUE)
        if kinds > 1:
            raise ValueError("a message body is data, amqp-sequence or amqp-value sections, not a mix")
        out = []
        if self.header is not None:
            out.append(self.header.encode())
        if self.delivery_annotations:
            out.append(_map_section(DELIVERY_ANNOTATIONS, _annotations(self.delivery_annotations)))
        if self.message_annotations:
            out.append(_map_section(MESSAGE_ANNOTATIONS, _annotations(self.message_annotations)))
        if self.properties is not None:
            out.append(self.properties.encode())
        if self.application_properties:
            out.append(_map_section(APPLICATION_PROPERTIES, self.application_properties))
        for d in self.data:
            d = bytes(d)
            out.append(_data_header(len(d)) + d)
        for s in self.sequence:
            out.append(b"\x00\x53\x76" + _enc_list(s))
        if self.value is not NO_VALUE:
            out.append(b"\x00\x53\x77" + _encode(self.value))
        if self.footer:
            out.append(_map_section(FOOTER, _annotations(self.footer)))
        return b"".join(out)

    def __bytes__(self) -> bytes:
        return self.encode()

    @staticmethod
    def decode(data: bytes) -> Message:
        """The message `data` holds. Raises AmqpDecodeError for anything but a well-formed
        sequence of message sections."""
        buf = bytes(data)
        body = data_only(buf)
        if body is not None:
            return Message([body])
        return _guarded(_decode_sections, buf, None)


def data_only(buf: bytes) -> bytes | None:
    """The body of a message that is one data section and nothing else (the usual stream
    message), else None."""
    head = buf[:4]
    if head == b"\x00\x53\x75\xa0":
        if len(buf) >= 5 and buf[4] == len(buf) - 5:
            return buf[5:]
    elif head == b"\x00\x53\x75\xb0":
        if len(buf) >= 8 and _I.unpack_from(buf, 4)[0] == len(buf) - 8:
            return buf[8:]
    return None


def _section_code(buf: bytes, off: int, depth: int) -> tuple[int, int]:
    """(section code, offset of its value) of the section starting at `off`."""
    if buf[off] != 0x00:
        raise AmqpDecodeError(f"expected a message section at offset {off}, found type code 0x{buf[off]:02x}")
    if off + 2 < len(buf) and buf[off + 1] == 0x53 and buf[off + 2] in _SECTION_NAMES:  # smallulong, as usual
        return buf[off + 2], off + 3
    descriptor, p = _decode(buf, off + 1, len(buf), depth + 1)
    if type(descriptor) is ULong:
        code = descriptor
        if code in _SECTION_NAMES:
            return code, p
    elif type(descriptor) is Symbol and descriptor in _SECTION_SYMBOLS:
        return _SECTION_SYMBOLS[descriptor], p
    raise AmqpDecodeError(f"unknown message section {descriptor!r} at offset {off}")


def _decode_sections(buf: bytes, spans: list[tuple[int, int, int]] | None) -> Message:
    """The sections of `buf`; when `spans` is a list, (code, start, end) of each section is
    appended to it."""
    m = Message()
    seen = set()
    off = 0
    end = len(buf)
    while off < end:
        start = off
        code, p = _section_code(buf, off, 0)
        v, off = _decode(buf, p, end, 1)
        if spans is not None:
            spans.append((code, start, off))
        name = _SECTION_NAMES[code]
        if code in (DATA, AMQP_SEQUENCE, AMQP_VALUE):
            if seen & ({DATA, AMQP_SEQUENCE, AMQP_VALUE} - {code}) or (code == AMQP_VALUE and code in seen):
                raise AmqpDecodeError(f"{name} section at offset {start} after another body section")
            seen.add(code)
            if code == DATA:
                if not isinstance(v, bytes):
                    raise AmqpDecodeError(f"data section at offset {start} is a {type(v).__name__}, not binary")
                m.data.append(v)
            elif code == AMQP_SEQUENCE:
                if not isinstance(v, list) or isinstance(v, Array):
                    raise AmqpDecodeError(f"amqp-sequence section at offset {start} is not a list")
                m.sequence.append(v)
            else:
                m.value = v
            continue
        if code in seen:
            raise AmqpDecodeError(f"a second {name} section at offset {start}")
        seen.add(code)
        if code == HEADER:
            m.header = Header.from_list(v)
        elif code == PROPERTIES:
            m.properties = Properties.from_list(v)
        else:
            if v is None:
                v = {}
            elif not isinstance(v, dict):
                raise AmqpDecodeError(f"{name} section at offset {start} is a {type(v).__name__}, not a map")
            if code == MESSAGE_ANNOTATIONS:
                m.message_annotations = v
            elif code == APPLICATION_PROPERTIES:
                m.application_properties = v
            elif code == DELIVERY_ANNOTATIONS:
                m.delivery_annotations = v
            else:
                m.footer = v
    return m


# ---------------------------------------------------------------- AMQP 0-9-1 content <-> AMQP 1.0
#
# 0-9-1 content properties travel as the broker receives and sends them: property flags then
# the property list (the bytes of a content header frame after class, weight and body size).
# Header tables are read as typed entries (name, type letter, value), with the type letters
# RabbitMQ reads (rabbit_binary_parser), because the AMQP 1.0 type of a header follows its
# 0-9-1 type.

BASIC_PROPERTY_NAMES = ("content_type", "content_encoding", "headers", "delivery_mode", "priority",
                        "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
                        "message_type", "user_id", "app_id", "cluster_id")
_SHORTSTR, _TABLE, _OCTET, _TIMESTAMP = 0, 1, 2, 3
_BASIC_KINDS = (_SHORTSTR, _SHORTSTR, _TABLE, _OCTET, _OCTET, _SHORTSTR, _SHORTSTR, _SHORTSTR, _SHORTSTR,
                _TIMESTAMP, _SHORTSTR, _SHORTSTR, _SHORTSTR, _SHORTSTR)
NO_PROPERTIES = b"\x00\x00"
AMQP10_TYPE = "amqp-1.0"  # the 0-9-1 type of a body that is AMQP 1.0 sections other than data
LONGSTR_UTF8_LIMIT = 4096  # a longer 0-9-1 longstr header is binary, not checked for UTF-8

_FIELD_FIXED: dict[str, struct.Struct] = {
    "b": _b, "B": _B, "s": _h, "u": _H, "I": _i, "i": _I, "l": _q, "L": _Q, "f": _f, "d": _d, "T": _Q,
}


def _field_value(buf: bytes, off: int, end: int, depth: int) -> tuple[str, Any, int]:
    """(type letter, value, offset after) of the 0-9-1 field value at `off`."""
    t = chr(buf[off])
    off += 1
    st = _FIELD_FIXED.get(t)
    if st is not None:
        nxt = off + st.size
        if nxt > end:
            raise ValueError("truncated field value")
        return t, st.unpack_from(buf, off)[0], nxt
    if t == "t":
        if off >= end:
            raise ValueError("truncated field value")
        return t, buf[off] != 0, off + 1
    if t == "V":
        return t, None, off
    if t == "D":
        if off + 5 > end:
            raise ValueError("truncated field value")
        return t, (buf[off], _i.unpack_from(buf, off + 1)[0]), off + 5
    if t in "SxFA":
        if off + 4 > end:
            raise ValueError("truncated field value")
        nxt = off + 4 + _I.unpack_from(buf, off)[0]
        if nxt > end:
            raise ValueError("truncated field value")
        if t == "F":
            return t, _field_table(buf, off + 4, nxt, depth + 1), nxt
        if t == "A":
            if depth >= DEPTH_MAX:
                raise ValueError("field values nested too deep")
            items = []
            p = off + 4
            while p < nxt:
                it, iv, p = _field_value(buf, p, nxt, depth + 1)
                items.append((it, iv))
            return t, items, nxt
        return t, buf[off + 4:nxt], nxt
    raise ValueError(f"unknown field type {t!r}")


def _field_table(buf: bytes, off: int, end: int, depth: int) -> list[tuple[str, str, Any]]:
    """A field table's entries (name, type letter, value); `off`..`end` is the table after its
    length."""
    if depth >= DEPTH_MAX:
        raise ValueError("field values nested too deep")
    out = []
    while off < end:
        n = buf[off]
        name_end = off + 1 + n
        if name_end >= end:
            raise ValueError("truncated field table")
        name = buf[off + 1:name_end].decode(errors="replace")
        t, v, off = _field_value(buf, name_end, end, depth)
        out.append((name, t, v))
    return out


def _basic_from_bytes(props: bytes) -> dict[str, Any]:
    """Raw content properties as {name: value}; short strings as str, the headers table as its
    bytes (without its length), read when it is converted."""
    flags = _H.unpack_from(props)[0]
    off = 2
    out: dict[str, Any] = {}
    for i in range(14):
        if not flags & (1 << (15 - i)):
            continue
        kind = _BASIC_KINDS[i]
        if kind == _SHORTSTR:
            n = props[off]
            if off + 1 + n > len(props):
                raise ValueError("truncated property list")
            out[BASIC_PROPERTY_NAMES[i]] = props[off + 1:off + 1 + n].decode(errors="replace")
            off += 1 + n
        elif kind == _TABLE:
            end = off + 4 + _I.unpack_from(props, off)[0]
            if end > len(props):
                raise ValueError("truncated headers table")
            out["headers"] = props[off + 4:end]
            off = end
        elif kind == _OCTET:
            out[BASIC_PROPERTY_NAMES[i]] = props[off]
            off += 1
        else:
            out["timestamp"] = _Q.unpack_from(props, off)[0]
            off += 8
    return out


def _typed_091(v: Any) -> tuple[str, Any]:
    """A Python header value as a typed 0-9-1 field value (for properties given as a mapping)."""
    if isinstance(v, bool):
        return "t", v
    if isinstance(v, int):
        return "l", v
    if isinstance(v, str):
        return "S", v.encode()
    if isinstance(v, (bytes, bytearray)):
        return "x", bytes(v)
    if isinstance(v, float):
        return "d", v
    if v is None:
        return "V", None
    if isinstance(v, Mapping):
        return "F", [(str(k), *_typed_091(x)) for k, x in v.items()]
    if isinstance(v, (list, tuple)):
        return "A", [_typed_091(x) for x in v]
    if isinstance(v, _dt.datetime):
        return "T", _datetime_ms(v) // 1000
    if isinstance(v, decimal.Decimal) and v.is_finite():
        sign, digits, exp = v.as_tuple()
        unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
        return "D", (max(0, -int(exp)), unscaled * 10 ** max(0, int(exp)))
    raise TypeError(f"cannot send a header value of type {type(v).__name__}")


def _basic_from_mapping(props: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in props.items() if v is not None and k in BASIC_PROPERTY_NAMES}
    if "type" in props and props["type"] is not None:  # RabbitMQ's name for message_type
        out["message_type"] = props["type"]
    headers = out.get("headers")
    if headers is not None:
        out["headers"] = _table_body([(str(k), *_typed_091(v)) for k, v in headers.items()])
    return out


def _is_utf8_no_null(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return b"\x00" not in raw


def _from_091(t: str, v: Any) -> Any:
    """A typed 0-9-1 field value as AMQP 1.0 (mc_amqpl:from_091)."""
    if t == "S":
        if len(v) <= LONGSTR_UTF8_LIMIT and _is_utf8_no_null(v):
            return v.decode()
        return bytes(v)
    conv = _FROM_091.get(t)
    if conv is not None:
        return conv(v)
    if t == "F":
        return {Symbol(k): _from_091(kt, kv) for k, kt, kv in v}
    if t == "A":
        return [_from_091(it, iv) for it, iv in v]
    if t == "D":
        # RabbitMQ has no rule for a decimal header; it is kept as its decimal text
        scale, unscaled = v
        return _decimal_text(scale, unscaled)
    raise ValueError(f"unknown field type {t!r}")


def _decimal_text(scale: int, unscaled: int) -> str:
    if scale == 0:
        return str(unscaled)
    digits = str(abs(unscaled)).rjust(scale + 1, "0")
    return ("-" if unscaled < 0 else "") + digits[:-scale] + "." + digits[-scale:]


_FROM_091: dict[str, Callable[[Any], Any]] = {
    "l": int, "L": ULong, "b": Byte, "B": UByte, "s": Short, "u": UShort, "I": Int, "i": UInt,
    "d": float, "f": Float, "t": bool, "x": bytes, "T": lambda v: Timestamp(v * 1000), "V": lambda v: None,
}


def _urn_to_uuid(s: str | None) -> uuid.UUID | None:
    if s is not None and len(s) == 45 and s.startswith("urn:uuid:"):
        try:
            return uuid.UUID(s[9:])
        except ValueError:
            return None
    return None


_SYM_X_EXCHANGE = _enc_symbol(Symbol("x-exchange"))
_SYM_X_ROUTING_KEY = _enc_symbol(Symbol("x-routing-key"))
_SYM_X_BASIC_TYPE = _enc_symbol(Symbol("x-basic-type"))
_SYM_X_CC = _enc_symbol(Symbol("x-cc"))
_SYM_X_OPT_DEATHS = _enc_symbol(Symbol("x-opt-deaths"))
_TRANSIENT_HEADER = Header(durable=False).encode()
_PERSISTENT_HEADER = Header(durable=True).encode()


def from_basic(props: bytes | Mapping[str, Any], body: bytes, exchange: str, routing_key: str) -> bytes:
    """An AMQP 0-9-1 publish as the AMQP 1.0 message a stream stores (RabbitMQ 3.13's
    conversion from mc_amqpl to mc_amqp, with `x-exchange` and `x-routing-key` annotations).

    `props` is the raw content properties (property flags and list, as a publish carries them)
    or a mapping of property names (`BASIC_PROPERTY_NAMES`) to values. The header section
    carries delivery-mode (durable), priority and expiration (ttl); the properties section the
    ids, reply-to, content type and encoding, timestamp (creation-time), user-id and app-id
    (group-id). A header becomes a message annotation when its name starts with "x-" (`CC`
    becomes `x-cc`), otherwise an application property unless it is a table or an array;
    `BCC` is dropped; `type` is the annotation `x-basic-type`. Raises ValueError for raw
    properties that do not parse.

    The message is written straight from the 0-9-1 values, without building a `Message`."""
    body = bytes(body)
    key = None
    if type(props) is bytes and len(props) <= _CACHED_BYTES_MAX:
        key = (props, exchange, routing_key)
        head = _from_basic_cached.get(key)
        if head is not None:
            return head + _data_header(len(body)) + body
    try:
        p = _basic_from_mapping(props) if isinstance(props, Mapping) else _basic_from_bytes(bytes(props))
        head = _head_from_basic(p, exchange, routing_key)
    except (IndexError, struct.error, ValueError) as e:
        raise ValueError(f"malformed content header properties: {e}") from None
    if p.get("message_type") == AMQP10_TYPE and _is_body_sections(body):
        return head + body  # a body that is AMQP 1.0 body sections goes in as those sections
    if key is not None:
        _remember(_from_basic_cached, key, head)
    return head + _data_header(len(body)) + body


# Publishers send the same properties again and again (and the same route), so each direction
# of the conversion remembers the last few thousand it made: properties (and route) -> the
# sections before the body, and the sections before the body -> properties. Only small ones.
_CONVERSIONS_CACHED_MAX = 4096
_CACHED_BYTES_MAX = 1024
_from_basic_cached: dict[tuple[bytes, str, str], bytes] = {}
_to_basic_cached: dict[bytes, bytes] = {}


def _remember(cache: dict, key: Any, value: Any) -> None:
    if len(cache) >= _CONVERSIONS_CACHED_MAX:
        cache.clear()
    cache[key] = value


def _head_from_basic(p: dict[str, Any], exchange: str, routing_key: str) -> bytes:
    """The sections before the body: header, message-annotations, properties and
    application-properties."""
    get = p.get
    message_type = get("message_type")
    table = get("headers", b"")
    key = (table, message_type, exchange, routing_key)
    sections = _headers_cached.get(key)
    if sections is None:
        sections = _headers_sections(_field_table(table, 0, len(table), 0) if table else [],
                                     message_type, exchange, routing_key)
        if len(table) <= _CACHED_BYTES_MAX:
            _remember(_headers_cached, key, sections)
    annotations, application = sections
    properties = _properties_from_basic(get("message_id"), get("user_id"), get("reply_to"),
                                        get("correlation_id"), get("content_type"), get("content_encoding"),
                                        get("timestamp"), get("app_id"))
    return (_header_from_basic(get("delivery_mode"), get("priority"), get("expiration"))
            + annotations + properties + application)


# The headers, type and route of a publish -> its message-annotations and application-properties
# sections: they repeat when the message id and timestamp do not.
_headers_cached: dict[tuple[bytes, str | None, str, str], tuple[bytes, bytes]] = {}


def _headers_sections(headers: list[tuple[str, str, Any]], message_type: str | None, exchange: str,
                      routing_key: str) -> tuple[bytes, bytes]:
    """(message-annotations section, application-properties section or b"") of a publish."""
    annotations: dict[str, bytes] = {}  # name -> the encoded entry; a later duplicate wins
    application: dict[str, bytes] = {}
    if message_type is not None:
        annotations["x-basic-type"] = _SYM_X_BASIC_TYPE + _enc_string(message_type)
    for name, t, v in headers:
        if name.startswith("x-"):
            if name != "x-exchange" and name != "x-routing-key":  # the route below replaces them
                annotations[name] = _enc_symbol(name) + _encode(_from_091(t, v))
            if name == "x-death" and t == "A":
                deaths = _deaths_from_091(v)
                if deaths:
                    annotations["x-opt-deaths"] = _SYM_X_OPT_DEATHS + _enc_array(deaths)
        elif name == "CC":
            if t == "A":
                annotations["x-cc"] = _SYM_X_CC + _encode(_from_091(t, v))
        elif name != "BCC" and t != "A" and t != "F":
            application[name] = _enc_string(name) + _encode(_from_091(t, v))
    entries = (b"".join(annotations.values()) + _SYM_X_EXCHANGE + _enc_string(exchange)
               + _SYM_X_ROUTING_KEY + _enc_string(routing_key))
    ma = b"\x00\x53\x72" + _compound(0xC1, 0xD1, 2 * len(annotations) + 4, entries)
    ap = b"\x00\x53\x74" + _compound(0xC1, 0xD1, 2 * len(application), b"".join(application.values())) \
        if application else b""
    return ma, ap


def _header_from_basic(delivery_mode: int | None, priority: int | None, expiration: str | None) -> bytes:
    """The header section; none for a publish without delivery mode, priority or expiration, so
    that a 0-9-1 consumer gets no delivery mode back for it (as RabbitMQ 3.10 gives it)."""
    if priority is None and expiration is None:
        if delivery_mode is None:
            return b""
        return _PERSISTENT_HEADER if delivery_mode == 2 else _TRANSIENT_HEADER
    ttl = None
    if expiration is not None and expiration.isdigit() and int(expiration) <= 0xFFFFFFFF:
        ttl = UInt(int(expiration))  # the channel has refused a publish with another expiration
    return Header(durable=None if delivery_mode is None else delivery_mode == 2, ttl=ttl,
                  priority=None if priority is None else UByte(priority)).encode()


def _message_id_from_basic(v: str | None) -> bytes:
    if v is None:
        return b"\x40"
    u = _urn_to_uuid(v)
    return _enc_string(v) if u is None else _enc_uuid(u)


def _properties_from_basic(message_id: str | None, user_id: str | None, reply_to: str | None,
                           correlation_id: str | None, content_type: str | None, content_encoding: str | None,
                           timestamp: int | None, app_id: str | None) -> bytes:
    """The properties section, or b"" when no property is set."""
    fields = [
        _message_id_from_basic(message_id),
        b"\x40" if user_id is None else _enc_binary(user_id.encode()),
        b"\x40",  # to
        b"\x40",  # subject
        b"\x40" if reply_to is None else _enc_string(reply_to),
        _message_id_from_basic(correlation_id),
        b"\x40" if content_type is None else _enc_symbol(content_type),
        b"\x40" if content_encoding is None else _enc_symbol(content_encoding),
        b"\x40",  # absolute-expiry-time
        b"\x40" if timestamp is None else _Bq.pack(0x83, timestamp * 1000),
        b"\x40" if app_id is None else _enc_string(app_id),
    ]
    n = len(fields)
    while n and fields[n - 1] == b"\x40":
        n -= 1
    if not n:
        return b""
    return b"\x00\x53\x73" + _compound(0xC0, 0xD0, n, b"".join(fields[:n]))


def _is_body_sections(body: bytes) -> bool:
    """Whether a 0-9-1 body of type "amqp-1.0" is AMQP 1.0 body sections (and a footer)."""
    try:
        sections = _guarded(_decode_sections, body, None)
    except AmqpDecodeError:
        return False
    return (sections.header is None and sections.delivery_annotations is None
            and sections.message_annotations is None and sections.properties is None
            and sections.application_properties is None
            and bool(sections.data or sections.sequence or sections.value is not NO_VALUE))


# -- AMQP 1.0 -> 0-9-1

_INTERNAL_ANNOTATIONS = frozenset(("x-routing-key", "x-exchange", "x-death"))


def _to_091(v: Any, depth: int = 0) -> tuple[str, Any] | None:
    """An AMQP 1.0 value as a typed 0-9-1 field value (mc_amqpl:to_091), or None when 0-9-1
    has no type for it."""
    t = _TO_091.get(type(v))
    if t is not None:
        return t, v
    if isinstance(v, (Decimal32, Decimal64, Decimal128)):
        return None  # RabbitMQ has no rule for them, and 0-9-1's decimal is another type
    if isinstance(v, bool):
        return "t", v
    if isinstance(v, str):  # string, symbol, char
        return "S", v.encode()
    if isinstance(v, bytes):  # binary is a longstr in 0-9-1, as RabbitMQ sends it
        return "S", bytes(v)
    if isinstance(v, Timestamp):
        return "T", _div1000(v) & 0xFFFFFFFFFFFFFFFF
    if isinstance(v, ULong):
        # RabbitMQ sends a ulong as a long; one past a long's range goes as its decimal text
        return ("l", int(v)) if v < 2**63 else ("S", str(int(v)).encode())
    if isinstance(v, int):
        return "l", v
    if v is None:
        return "V", None
    if depth >= DEPTH_MAX:
        return None
    if isinstance(v, list):  # list and array
        items = [_to_091(x, depth + 1) for x in v]
        return "A", [x for x in items if x is not None]
    if isinstance(v, dict):
        return "F", _table_entries(v, depth + 1)
    if isinstance(v, Described):
        return _to_091(v.value, depth + 1)
    if isinstance(v, uuid.UUID):
        # RabbitMQ has no rule for a uuid header; it goes as its URN text, as a uuid message id does
        return "S", v.urn.encode()
    return None  # decimal32/64/128


_TO_091: dict[type, str] = {
    Byte: "b", UByte: "B", Short: "s", UShort: "u", Int: "I", UInt: "i", float: "d", Float: "f",
}


def _div1000(v: int) -> int:
    """Erlang's `div 1000` (rounding toward zero)."""
    return v // 1000 if v >= 0 else -(-v // 1000)


def _table_entries(m: Mapping[Any, Any], depth: int) -> list[tuple[str, str, Any]]:
    out = []
    for k, v in m.items():
        name = k.decode(errors="replace") if isinstance(k, bytes) else str(k)
        tv = _to_091(v, depth)
        if tv is not None and len(name.encode()) <= 0xFF:
            out.append((name, *tv))  # type: ignore[misc]
    return out


def _shortstr_or_none(v: Any) -> str | None:
    """A string property value that fits a 0-9-1 short string, else None."""
    if isinstance(v, str) and len(v.encode()) <= 0xFF:
        return v
    return None


def _message_id_091(v: Any, header: str, headers: list) -> str | None:
    """mc_amqpl:message_id: a message or correlation id as the 0-9-1 property, or, when it does
    not fit one, as the header `header`."""
    if v is None:
        return None
    if isinstance(v, uuid.UUID):
        return v.urn
    if isinstance(v, ULong):
        return str(int(v))
    if isinstance(v, bytes):
        headers.insert(0, (header, "x", bytes(v)))
        return None
    if isinstance(v, str):
        if len(v.encode()) <= 0xFF:
            return v
        headers.insert(0, (header, "S", v.encode()))
    return None


def _annotation(annotations: Mapping[Any, Any], key: str) -> Any:
    return annotations.get(key) if annotations else None


def _octet_or_none(v: Any) -> int | None:
    return int(v) if _is_int(v) and 0 <= v <= 0xFF else None


def to_basic(encoded: bytes) -> tuple[bytes, bytes]:
    """A stored AMQP 1.0 message as AMQP 0-9-1 content: (raw content properties, body), the
    properties ready for a content header frame (RabbitMQ 3.13's conversion from mc_amqp to
    mc_amqpl). Data sections are the body; any other body is its AMQP 1.0 encoding with type
    "amqp-1.0". Application properties become headers, and so do x- message annotations other
    than the ones the conversion itself writes. Raises AmqpDecodeError for a malformed
    message.

    A message whose body is data sections (nearly all) is read in parts: the sections before
    the body are looked up among those converted lately, and otherwise the properties section
    (where a message id or timestamp of its own usually is) is converted apart from the others,
    which are looked up again on their own."""
    buf = bytes(encoded)
    body = data_only(buf)
    if body is not None:
        return NO_PROPERTIES, body
    shape = _data_shape(buf)
    if shape is not None:
        head_end, properties_span, payloads = shape
        head = buf[:head_end]
        props = _to_basic_cached.get(head)
        if props is None:
            props = _head_to_basic(head, properties_span)
            if head_end <= _CACHED_BYTES_MAX:
                _remember(_to_basic_cached, head, props)
        return props, payloads[0] if len(payloads) == 1 else b"".join(payloads)
    spans: list[tuple[int, int, int]] = []
    m = _guarded(_decode_sections, buf, spans)
    if m.sequence or m.value is not NO_VALUE:
        body_spans = [(s, e) for code, s, e in spans if code in (AMQP_SEQUENCE, AMQP_VALUE)]
        body, message_type = buf[body_spans[0][0]:body_spans[-1][1]], AMQP10_TYPE
    else:
        body, message_type = m.body if m.data else b"", None
    return _basic_properties(_basic_template(m, message_type), m.properties), body



def route(encoded: bytes) -> tuple[str, str] | None:
    """The exchange and routing key a message was published with (the `x-exchange` and
    `x-routing-key` message annotations `from_basic` writes, as RabbitMQ delivers them to an
    AMQP 0-9-1 consumer), or None when it has not both. The sections other than the properties
    are looked up among those read lately, as `to_basic` does. Raises AmqpDecodeError for a
    malformed message."""
    buf = bytes(encoded)
    if data_only(buf) is not None:
        return None
    shape = _data_shape(buf)
    if shape is None:
        m = _guarded(_decode_sections, buf, None)
        return _route_of(m.message_annotations)
    head_end, properties_span = shape[0], shape[1]
    others = buf[:head_end] if properties_span is None else buf[:properties_span[0]] + buf[properties_span[1]:head_end]
    r = _routes_cached.get(others, _NO_ROUTE)
    if r is _NO_ROUTE:
        r = _route_of(_guarded(_decode_sections, others, None).message_annotations)
        if len(others) <= _CACHED_BYTES_MAX:
            _remember(_routes_cached, others, r)
    return r


def filter_value(encoded: bytes) -> str | None:
    """A message's stream filter value: the `x-stream-filter-value` message annotation an AMQP
    0-9-1 publisher's header of that name becomes (None when it has none). Raises
    AmqpDecodeError for a malformed message."""
    buf = bytes(encoded)
    if data_only(buf) is not None or b"x-stream-filter-value" not in buf:
        return None
    v = (_guarded(_decode_sections, buf, None).message_annotations or {}).get("x-stream-filter-value")
    return v if isinstance(v, str) else None


def _route_of(annotations: Mapping[Any, Any] | None) -> tuple[str, str] | None:
    if not annotations:
        return None
    exchange, key = annotations.get("x-exchange"), annotations.get("x-routing-key")
    return (str(exchange), str(key)) if isinstance(exchange, str) and isinstance(key, str) else None


_routes_cached: dict[bytes, tuple[str, str] | None] = {}
_NO_ROUTE = object()

def _head_to_basic(head: bytes, properties_span: tuple[int, int] | None) -> bytes:
    """The 0-9-1 properties of the sections before a data body: the properties section
    converted on its own, the other sections' template looked up or made."""
    if properties_span is None:
        others, properties = head, None
    else:
        start, end = properties_span
        others = head[:start] + head[end:]
        properties = _guarded(_decode_sections, head[start:end], None).properties
    template = _templates_cached.get(others)
    if template is None:
        template = _basic_template(_guarded(_decode_sections, others, None), None)
        if len(others) <= _CACHED_BYTES_MAX:
            _remember(_templates_cached, others, template)
    return _basic_properties(template, properties)


_templates_cached: dict[bytes, tuple] = {}


def _data_shape(buf: bytes) -> tuple[int, tuple[int, int] | None, list[bytes]] | None:
    """(where the data sections start, where the properties section is, the data payloads) of
    a message that is sections other than the body followed by data sections, found from the
    sections' sizes alone; None for any other shape (the full decoder then reads it)."""
    n = len(buf)
    off = 0
    head_end = -1
    properties_span = None
    payloads = []
    while off < n:
        if off + 5 > n or buf[off] != 0x00 or buf[off + 1] != 0x53:
            return None
        code, c = buf[off + 2], buf[off + 3]
        if c == 0xA0 or c == 0xB0:
            if code != DATA:
                return None
            if c == 0xA0:
                start = off + 5
                end = start + buf[off + 4]
            else:
                start = off + 8
                end = start + _I.unpack_from(buf, off + 4)[0] if start <= n else n + 1
            if end > n:
                return None
            if head_end < 0:
                head_end = off
            payloads.append(buf[start:end])
        elif head_end >= 0 or code not in (HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES,
                                           APPLICATION_PROPERTIES):
            return None
        elif c == 0x45 or c == 0x40:
            end = off + 4
        elif c == 0xC0 or c == 0xC1:
            end = off + 5 + buf[off + 4]
        elif (c == 0xD0 or c == 0xD1) and off + 8 <= n:
            end = off + 8 + _I.unpack_from(buf, off + 4)[0]
        else:
            return None
        if code == PROPERTIES and head_end < 0:
            if properties_span is not None:
                return None  # two properties sections: the full decoder says so
            properties_span = (off, end)
        off = end
    if head_end < 0 or off != n:
        return None
    return head_end, properties_span, payloads


# What the sections other than properties give the 0-9-1 properties: (the property values
# they set, the headers from message annotations, the headers from application properties),
# the headers as encoded field-table entries.
_Template = tuple[tuple[Any, ...], bytes, bytes]


def _basic_template(m: Message, message_type: str | None) -> _Template:
    h = m.header
    ma = m.message_annotations or {}
    values: list[Any] = [None] * 14
    durable = None if h is None else h.durable
    if durable is not None:
        values[3] = 2 if durable else 1
    else:
        values[3] = _octet_or_none(_annotation(ma, "x-basic-delivery-mode"))
    priority = None if h is None else h.priority
    values[4] = priority if priority is not None else _octet_or_none(_annotation(ma, "x-basic-priority"))
    ttl = None if h is None else h.ttl
    values[7] = str(int(ttl)) if ttl is not None else _shortstr_or_none(_annotation(ma, "x-basic-expiration"))
    values[10] = message_type or _shortstr_or_none(_annotation(ma, "x-basic-type"))

    application: list[tuple[str, str, Any]] = []
    for k, v in (m.application_properties or {}).items():
        if type(k) is str and len(k.encode()) <= 0xFF:
            tv = _to_091(v)
            if tv is not None:
                application.append((k, *tv))  # type: ignore[arg-type]
    annotations: list[tuple[str, str, Any]] = []
    for k, v in ma.items():
        if type(k) is not Symbol:
            continue
        if k == "x-cc":
            tv = _to_091(v)
            if tv is not None:
                annotations.append(("CC", *tv))  # type: ignore[arg-type]
        elif k == "x-opt-rabbitmq-received-time" and isinstance(v, Timestamp):
            annotations.append(("timestamp_in_ms", "l", int(v)))
        elif k == "x-opt-deaths":
            deaths = _deaths_to_091(v)
            if deaths is not None:
                annotations.append(("x-death", "A", deaths))
        elif k.startswith("x-") and len(k.encode()) <= 0xFF and not k.startswith("x-basic-") \
                and k not in _INTERNAL_ANNOTATIONS:
            tv = _to_091(v)
            if tv is not None:
                annotations.append((k, *tv))  # type: ignore[arg-type]
    return tuple(values), _table_body(annotations), _table_body(application)


def _basic_properties(template: _Template, p: Properties | None) -> bytes:
    """The 0-9-1 properties: a template of the other sections completed by the properties
    section `p`. Headers go in RabbitMQ's order: from message annotations, then the ids that
    do not fit a property, then from application properties."""
    fixed, annotations, application = template
    values = list(fixed)
    if p is not None:
        ids: list[tuple[str, str, Any]] = []
        values[8] = _message_id_091(p.message_id, "x-message-id", ids)
        values[5] = _message_id_091(p.correlation_id, "x-correlation-id", ids)
        user_id = p.user_id
        if isinstance(user_id, bytes) and len(user_id) <= 0xFF and _is_utf8_no_null(user_id):
            values[11] = user_id.decode()
        values[6] = _shortstr_or_none(p.reply_to) if not isinstance(p.reply_to, Symbol) else None
        values[12] = _shortstr_or_none(p.group_id) if not isinstance(p.group_id, Symbol) else None
        values[0] = _shortstr_or_none(p.content_type)
        values[1] = _shortstr_or_none(p.content_encoding)
        if p.creation_time is not None and p.creation_time >= 0:
            values[9] = _div1000(p.creation_time)
        table = annotations + _table_body(ids) + application
    else:
        table = annotations + application
    if table:
        values[2] = _I.pack(len(table)) + table
    return _encode_basic(values)


def _encode_basic(values: list[Any]) -> bytes:
    flags = 0
    parts = []
    for i, v in enumerate(values):
        if v is None:
            continue
        flags |= 1 << (15 - i)
        kind = _BASIC_KINDS[i]
        if kind == _SHORTSTR:
            b = v.encode()
            parts.append(bytes((len(b),)) + b)
        elif kind == _TABLE:
            parts.append(v)  # encoded already
        elif kind == _OCTET:
            parts.append(bytes((v,)))
        else:
            parts.append(_Q.pack(v))
    return _H.pack(flags) + b"".join(parts)


def _table_body(entries: list[tuple[str, str, Any]]) -> bytes:
    """Field-table entries (name, type letter, value) encoded, without the table's length."""
    return b"".join([_encode_name(k) + _encode_field(t, v) for k, t, v in entries])


def _encode_table(entries: list[tuple[str, str, Any]]) -> bytes:
    body = _table_body(entries)
    return _I.pack(len(body)) + body


def _encode_name(k: str) -> bytes:
    b = k.encode()
    return bytes((len(b),)) + b


def _encode_field(t: str, v: Any) -> bytes:
    st = _FIELD_FIXED.get(t)
    if st is not None:
        return t.encode() + st.pack(v)
    if t in "Sx":
        return t.encode() + _I.pack(len(v)) + v
    if t == "t":
        return b"t\x01" if v else b"t\x00"
    if t == "V":
        return b"V"
    if t == "F":
        return b"F" + _encode_table(v)
    if t == "A":
        body = b"".join([_encode_field(it, iv) for it, iv in v])
        return b"A" + _I.pack(len(body)) + body
    if t == "D":
        return b"D" + bytes((v[0],)) + _i.pack(v[1])
    raise ValueError(f"unknown field type {t!r}")


def _deaths_from_091(items: list[tuple[str, Any]]) -> Array:
    """An x-death header as the x-opt-deaths annotation RabbitMQ writes beside it (its deaths
    recovered from the header, then encode_deaths): an array of maps."""
    out = Array((), dict)
    for t, table in items:
        if t != "F":
            continue
        d = {k: (kt, kv) for k, kt, kv in table}
        try:
            count, reason, queue = d["count"][1], d["reason"][1], d["queue"][1]
            time_t, time_s = d["time"]
            exchange, (keys_t, keys) = d["exchange"][1], d["routing-keys"]
        except (KeyError, TypeError, ValueError):
            continue  # RabbitMQ ignores an x-death entry without these
        if time_t != "T" or keys_t != "A" or not _is_int(count):
            continue
        first = Timestamp(time_s * 1000)
        death: dict[Any, Any] = {}
        expiration = d.get("original-expiration")
        if expiration is not None and isinstance(expiration[1], bytes) and expiration[1].isdigit():
            death[Symbol("ttl")] = UInt(min(int(expiration[1]), 0xFFFFFFFF))
        death.update({
            Symbol("queue"): _text(queue), Symbol("reason"): Symbol(_text(reason)),
            Symbol("count"): ULong(max(0, count)), Symbol("first-time"): first, Symbol("last-time"): first,
            Symbol("exchange"): _text(exchange),
            Symbol("routing-keys"): Array((_text(k) for kt, k in keys if kt == "S"), str),
        })
        out.append(death)
    return out


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _deaths_to_091(v: Any) -> list[tuple[str, Any]] | None:
    """x-opt-deaths (an array of maps) as an x-death header: RabbitMQ's death_table."""
    if not isinstance(v, list):
        return None
    out = []
    for d in v:
        try:
            entries: list[tuple[str, str, Any]] = [
                ("count", "l", int(d["count"])),
                ("reason", "S", str(d["reason"]).encode()),
                ("queue", "S", str(d["queue"]).encode()),
                ("time", "T", _div1000(int(d["first-time"]))),
                ("exchange", "S", str(d["exchange"]).encode()),
                ("routing-keys", "A", [("S", str(k).encode()) for k in d["routing-keys"]]),
            ]
        except (KeyError, TypeError, ValueError):
            continue  # RabbitMQ reads only the shape it writes
        ttl = d.get("ttl")
        if _is_int(ttl):
            entries.insert(0, ("original-expiration", "S", str(int(ttl)).encode()))
        out.append(("F", entries))
    return out
