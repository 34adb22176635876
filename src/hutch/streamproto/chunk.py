"""Stream chunks: the unit a stream is written, replicated, stored and delivered in.

A chunk is a batch of records (each one message, an AMQP 1.0 message as stream clients write
them) behind a 48-byte header, in the layout of RabbitMQ's osiris log, which is also what the
stream protocol's `Deliver` carries: hutch stores chunks exactly as a stream-protocol consumer
receives them, so that a delivery is the stored bytes behind a short frame prefix.

    header (big-endian, 48 bytes)
      magic/version   int8    0x50
      chunk type      int8    0 user records (hutch writes no other kind)
      entries         uint16  entries in the data section
      records         uint32  records (a sub-batch entry holds several)
      timestamp       int64   ms since the epoch, when the leader wrote it
      epoch           uint64  the leader's term that wrote it
      first offset    uint64  the offset of its first record (its "chunk id")
      crc             uint32  CRC-32 of the data section
      data length     uint32
      trailer length  uint32  0 (hutch writes no trailer)
      bloom size      uint8   bytes of bloom filter after the header (0: no filter values)
      reserved        3 bytes
    bloom filter      (bloom size bytes)
    data              entries: a simple entry is uint32 size (top bit 0) + record; a sub-batch
                      entry is 1 + compression (3 bits) + 4 reserved bits, uint16 records,
                      uint32 uncompressed length, uint32 length, then the records, each
                      uint32 size + bytes, compressed as a whole
    trailer           (trailer length bytes)

The bloom filter summarises the chunk's filter values (`x-stream-filter-value`, stream
filtering as in RabbitMQ 3.13) so that a filtering consumer can skip whole chunks; the filter
is the server's business only (consumers filter records themselves), so its hashing is
hutch's own.

Must never: import other hutch packages, do I/O.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Sequence
from itertools import chain

from isal.isal_zlib import crc32

MAGIC_VERSION = 0x50
USER = 0  # chunk type of user records
HEADER = struct.Struct(">bbHIqQQIIIB3x")
HEADER_SIZE = HEADER.size  # 48
_NO_HEADER = bytes(HEADER_SIZE)  # the header's place in a chunk being built
FIRST_OFFSET_AT = 24  # where the first offset sits in the header (patched when the offset is known)
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_SUB = struct.Struct(">BHII")
ENTRIES_MAX = 0xFFFF  # entries per chunk (the header's uint16)
RECORD_BYTES_MAX = 0x7FFFFFFF  # a simple entry's size field (31 bits)
BLOOM_SIZE_DEFAULT = 16  # RabbitMQ's x-stream-filter-size-bytes default
BLOOM_SIZE_MIN = 16
BLOOM_SIZE_MAX = 255
# sub-batch compression types (the stream protocol's): only these two are read here
COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1


class ChunkError(ValueError):
    """Bytes that are not a well-formed chunk."""


class ChunkHeader:
    """A chunk's header fields and where its parts are (`size`: the whole chunk)."""

    __slots__ = ("chunk_type", "num_entries", "num_records", "timestamp", "epoch", "first_offset", "crc",
                 "data_length", "trailer_length", "bloom_size")

    def __init__(self, chunk_type: int, num_entries: int, num_records: int, timestamp: int, epoch: int,
                 first_offset: int, crc: int, data_length: int, trailer_length: int, bloom_size: int):
        self.chunk_type = chunk_type
        self.num_entries = num_entries
        self.num_records = num_records
        self.timestamp = timestamp
        self.epoch = epoch
        self.first_offset = first_offset
        self.crc = crc
        self.data_length = data_length
        self.trailer_length = trailer_length
        self.bloom_size = bloom_size

    @property
    def size(self) -> int:
        return HEADER_SIZE + self.bloom_size + self.data_length + self.trailer_length

    @property
    def data_at(self) -> int:
        return HEADER_SIZE + self.bloom_size

    @property
    def next_offset(self) -> int:
        return self.first_offset + self.num_records

    def __repr__(self) -> str:
        return (f"ChunkHeader(first_offset={self.first_offset}, records={self.num_records}, "
                f"entries={self.num_entries}, epoch={self.epoch}, ts={self.timestamp}, size={self.size})")


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> ChunkHeader:
    """The header of the chunk at `pos` (its data need not be there yet)."""
    if len(buf) - pos < HEADER_SIZE:
        raise ChunkError(f"a chunk header needs {HEADER_SIZE} bytes, {len(buf) - pos} there")
    (magic, ctype, entries, records, ts, epoch, first, crc, data_len, trailer_len,
     bloom) = HEADER.unpack_from(buf, pos)
    if magic & 0xFF != MAGIC_VERSION:
        raise ChunkError(f"not a chunk: magic/version byte {magic & 0xFF:#04x}")
    if records < entries:
        raise ChunkError(f"a chunk of {entries} entries cannot hold {records} records")
    return ChunkHeader(ctype, entries, records, ts, epoch, first, crc, data_len, trailer_len, bloom)


def encode(records: Sequence[bytes], timestamp: int, epoch: int, first_offset: int = 0,
           filter_values: Iterable[bytes] = (), bloom_size: int = BLOOM_SIZE_DEFAULT) -> bytearray:
    """A chunk of simple entries, one per record. `filter_values`: the records' filter values
    (a bloom filter of `bloom_size` bytes is added when there are any)."""
    return encode_framed(frame(records), len(records), timestamp, epoch, first_offset, filter_values, bloom_size)


def encode_framed(data: bytes | bytearray | memoryview, n: int, timestamp: int, epoch: int, first_offset: int = 0,
                  filter_values: Iterable[bytes] = (), bloom_size: int = BLOOM_SIZE_DEFAULT) -> bytearray:
    """The chunk of `n` records already framed as its data (`frame`), in one buffer."""
    head, _crc = encode_head(data, n, timestamp, epoch, first_offset, filter_values, bloom_size)
    head += data
    return head


def encode_head(data: bytes | bytearray | memoryview, n: int, timestamp: int, epoch: int, first_offset: int = 0,
                filter_values: Iterable[bytes] = (), bloom_size: int = BLOOM_SIZE_DEFAULT) -> tuple[bytearray, int]:
    """What goes before `data` (`n` records framed by `frame`) in its chunk: the header and the
    filter; and the data's CRC-32, which the header holds. The chunk is the head followed by the
    data, so a writer can hand both to the OS without joining them, and no record is looked at
    (a chunk is the hot path of every stream write, on every member)."""
    if not 0 < n <= ENTRIES_MAX:
        raise ChunkError(f"a chunk holds 1 to {ENTRIES_MAX} records, not {n}")
    bloom = bloom_of(filter_values, bloom_size)
    head = bytearray(_NO_HEADER)
    head += bloom
    crc = crc32(data)
    HEADER.pack_into(head, 0, MAGIC_VERSION, USER, n, n, timestamp, epoch, first_offset, crc, len(data), 0,
                     len(bloom))
    return head, crc


def frame(records: Sequence[bytes]) -> bytes:
    """A chunk's data of simple entries, one per record: each record after its size (uint32,
    the top bit clear). Built by C iterators, with no Python loop over the records."""
    return b"".join(chain.from_iterable(zip(map(_U32.pack, map(len, records)), records, strict=True)))


def unframe(data: bytes, n: int) -> list[bytes]:
    """The `n` records of data made by `frame` (ChunkError if it is not that)."""
    out, pos = _entries(memoryview(data), 0, len(data), n)
    if pos != len(data) or len(out) != n:
        raise ChunkError(f"framed records: {len(data) - pos} bytes after {len(out)} records, where {n} were said")
    return out


def with_first_offset(chunk: bytes, first_offset: int) -> bytes:
    """The same chunk numbered from `first_offset` (the header is not covered by the CRC)."""
    return b"".join((chunk[:FIRST_OFFSET_AT], _U64.pack(first_offset), chunk[FIRST_OFFSET_AT + 8:]))


def check(chunk: bytes | memoryview) -> ChunkHeader:
    """The header of a whole chunk whose length and CRC are right (ChunkError otherwise)."""
    h = read_header(chunk)
    if len(chunk) != h.size:
        raise ChunkError(f"chunk at offset {h.first_offset}: {len(chunk)} bytes where its header says {h.size}")
    at = h.data_at
    if crc32(chunk[at:at + h.data_length]) != h.crc:
        raise ChunkError(f"chunk at offset {h.first_offset}: CRC mismatch")
    return h


def records(chunk: bytes | memoryview, h: ChunkHeader | None = None) -> list[bytes]:
    """The records of a whole chunk, in order (sub-batches unpacked)."""
    if h is None:
        h = read_header(chunk)
    pos = h.data_at
    out, _end = _entries(memoryview(chunk), pos, pos + h.data_length, h.num_entries)
    if len(out) != h.num_records:
        raise ChunkError(f"chunk at offset {h.first_offset} holds {len(out)} records, its header says "
                         f"{h.num_records}")
    return out


def _entries(mv: memoryview, pos: int, end: int, count: int) -> tuple[list[bytes], int]:
    """The records of `count` entries of a chunk's data from `pos` (sub-batches unpacked), and
    where they end."""
    out: list[bytes] = []
    unpack = _U32.unpack_from
    try:
        for _ in range(count):
            first = mv[pos]
            if first & 0x80 == 0:
                (size,) = unpack(mv, pos)
                pos += 4
                if pos + size > end:
                    raise ChunkError("an entry runs past the chunk's data")
                out.append(bytes(mv[pos:pos + size]))
                pos += size
            else:
                kind = (first >> 4) & 0x7
                _b, sub_count, raw_len, length = _SUB.unpack_from(mv, pos)
                pos += _SUB.size
                if pos + length > end:
                    raise ChunkError("a sub-batch runs past the chunk's data")
                out.extend(sub_batch_records(kind, sub_count, raw_len, bytes(mv[pos:pos + length])))
                pos += length
    except (struct.error, IndexError, OSError, EOFError, zlib.error) as e:
        raise ChunkError(f"malformed chunk data: {e}") from None
    return out, pos


def sub_batch_records(compression: int, count: int, raw_len: int, packed: bytes) -> list[bytes]:
    """The records of a sub-batch entry (as a stream-protocol publisher sends one, too)."""
    try:
        if compression == COMPRESSION_NONE:
            raw = packed
        elif compression == COMPRESSION_GZIP:
            raw = _gunzip(packed, raw_len)
        else:
            raise ChunkError(f"sub-batch compression type {compression} is not supported here")
        if len(raw) != raw_len:
            raise ChunkError("a sub-batch's uncompressed length does not match")
        out = []
        rp = 0
        unpack = _U32.unpack_from
        for _i in range(count):
            (size,) = unpack(raw, rp)
            rp += 4
            if rp + size > len(raw):
                raise ChunkError("a sub-batch record runs past its batch")
            out.append(raw[rp:rp + size])
            rp += size
        return out
    except (struct.error, OSError, EOFError, zlib.error) as e:
        raise ChunkError(f"malformed sub-batch: {e}") from None


def _gunzip(packed: bytes, raw_len: int) -> bytes:
    """The gzip members' data, inflated no further than one byte past `raw_len`: a sub-batch that
    inflates to more than it declares is refused without being inflated in full (a gzip bomb)."""
    out = bytearray()
    while packed:
        if len(out) > raw_len:
            break  # the length check refuses it
        member = zlib.decompressobj(wbits=31)  # one gzip member
        out += member.decompress(packed, raw_len + 1 - len(out))
        if not member.eof:
            raise ChunkError("a sub-batch's gzip data is cut short or inflates past its length")
        packed = member.unused_data
    return bytes(out)


def without_bloom(chunk: bytes | memoryview, h: ChunkHeader) -> bytes | memoryview:
    """The chunk as a consumer that knows nothing of filtering reads it: no bloom filter."""
    if h.bloom_size == 0:
        return chunk
    head = bytearray(chunk[:HEADER_SIZE])
    head[44] = 0  # the bloom size byte
    return bytes(head) + bytes(chunk[HEADER_SIZE + h.bloom_size:])


# ---------------------------------------------------------------- bloom filters

def _positions(value: bytes, bits: int) -> tuple[int, int]:
    h1 = crc32(value)
    h2 = zlib.adler32(value) | 1
    return h1 % bits, (h1 + h2) % bits


def bloom_of(values: Iterable[bytes], size: int = BLOOM_SIZE_DEFAULT) -> bytes:
    """A bloom filter of `size` bytes over the filter values (b"" when there are none)."""
    bloom = None
    bits = size * 8
    for v in values:
        if not v:
            continue
        if bloom is None:
            bloom = bytearray(size)
        for p in _positions(v, bits):
            bloom[p >> 3] |= 1 << (p & 7)
    return bytes(bloom) if bloom is not None else b""


def bloom_may_contain(bloom: bytes | memoryview, value: bytes) -> bool:
    """Whether a chunk with this bloom filter may hold a record with this filter value."""
    if not bloom:
        return False
    bits = len(bloom) * 8
    return all(bloom[p >> 3] & (1 << (p & 7)) for p in _positions(value, bits))


def bloom_of_chunk(chunk: bytes | memoryview, h: ChunkHeader) -> bytes | memoryview:
    return chunk[HEADER_SIZE:HEADER_SIZE + h.bloom_size]


__all__ = ["ChunkError", "ChunkHeader", "HEADER_SIZE", "read_header", "encode", "encode_framed", "encode_head", "frame",
           "unframe",
           "with_first_offset", "check",
           "records", "sub_batch_records", "without_bloom", "bloom_of", "bloom_may_contain", "bloom_of_chunk"]
