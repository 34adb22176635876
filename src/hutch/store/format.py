"""The on-disk byte layout of a segment log: segment headers, records, and the scan that
finds every intact record in a damaged segment.

Pure functions over bytes; nothing here opens a file. The layout (little-endian):

    segment header, 24 bytes:
        magic     8  b"HUTCHSEG"
        version   2  FORMAT_VERSION
        reserved  2  zero
        base_seq  8  the sequence number of the first record the segment was made for
        crc       4  CRC-32 of the 20 bytes before it

    record, 28-byte header then the payload:
        magic     4  RECORD_MAGIC (b"\\xc7HR1"): where a scan can resynchronise
        crc       4  CRC-32 of everything after it: length, seq, key and payload
        length    4  payload length in bytes
        seq       8  the log-wide sequence number, strictly increasing
        key       8  the user's stream key (a queue id, a Raft group id), opaque here
        payload   length bytes

A record is *valid* at an offset when the magic is there, the length is within
`record_bytes_max` and inside the data, the CRC matches and the seq is in the range the
caller allows. The scan never trusts a length it has not checked against the CRC, so one
damaged byte costs at most the record it sits in: the scan looks for the next magic and
carries on from the first valid record it finds there.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from isal.isal_zlib import crc32

FORMAT_VERSION = 1

SEGMENT_MAGIC = b"HUTCHSEG"
_SEGMENT_HEADER = struct.Struct("<8sHHQ")
_SEGMENT_CRC = struct.Struct("<I")
SEGMENT_HEADER_BYTES = _SEGMENT_HEADER.size + _SEGMENT_CRC.size  # 24

RECORD_MAGIC = b"\xc7HR1"
_RECORD_HEADER = struct.Struct("<4sIIQQ")  # magic, crc, length, seq, key
_RECORD_CRC_FROM = 8  # the CRC covers the header from `length` onwards, then the payload
_RECORD_TAIL = struct.Struct("<IQQ")  # length, seq, key: the part of the header under the CRC
RECORD_HEADER_BYTES = _RECORD_HEADER.size  # 28

KEY_MAX = (1 << 64) - 1
SEQ_MAX = (1 << 64) - 1


def encode_segment_header(base_seq: int) -> bytes:
    head = _SEGMENT_HEADER.pack(SEGMENT_MAGIC, FORMAT_VERSION, 0, base_seq)
    return head + _SEGMENT_CRC.pack(crc32(head))


def decode_segment_header(data: bytes | memoryview) -> int | None:
    """The base seq in a segment header, or None when the header is missing or damaged."""
    if len(data) < SEGMENT_HEADER_BYTES:
        return None
    head = bytes(data[: _SEGMENT_HEADER.size])
    (crc,) = _SEGMENT_CRC.unpack_from(data, _SEGMENT_HEADER.size)
    if crc32(head) != crc:
        return None
    magic, version, _reserved, base_seq = _SEGMENT_HEADER.unpack(head)
    if magic != SEGMENT_MAGIC or version != FORMAT_VERSION:
        return None
    return base_seq


def encode_record_header(seq: int, key: int, payload: bytes | memoryview) -> bytes:
    """The 28 bytes that go before `payload` on disk."""
    tail = _RECORD_TAIL.pack(len(payload), seq, key)
    crc = crc32(payload, crc32(tail))
    return RECORD_MAGIC + crc.to_bytes(4, "little") + tail


def encode_record(seq: int, key: int, payload: bytes | memoryview) -> bytes:
    return encode_record_header(seq, key, payload) + bytes(payload)


class ScannedRecord(NamedTuple):
    seq: int
    key: int
    offset: int  # of the record header in the segment
    length: int  # of the payload


class Damage(NamedTuple):
    offset: int  # first byte that is not part of a valid record
    length: int  # bytes skipped up to the next valid record (or to the end of the data)


def decode_record_at(data: bytes | memoryview, offset: int, record_bytes_max: int) -> ScannedRecord | None:
    """The record whose header starts at `offset`, or None when there is no valid one there.

    The seq range is the caller's to check; this checks magic, length and CRC.
    """
    end_header = offset + RECORD_HEADER_BYTES
    if end_header > len(data):
        return None
    magic, crc, length, seq, key = _RECORD_HEADER.unpack_from(data, offset)
    if magic != RECORD_MAGIC or length > record_bytes_max or end_header + length > len(data):
        return None
    view = memoryview(data)
    if crc32(view[end_header : end_header + length], crc32(view[offset + _RECORD_CRC_FROM : end_header])) != crc:
        return None
    return ScannedRecord(seq, key, offset, length)


def checked_record(view: memoryview, offset: int, seq: int, length: int) -> tuple[int, memoryview] | None:
    """(key, payload) of the record at `offset` of `view` when it is the valid record `seq` with
    a payload of `length` bytes (magic, seq, length and CRC as `decode_record_at` checks them);
    None otherwise. The payload is a view into `view`, not a copy. For a reader that knows where
    a record is and what it must be."""
    end = offset + RECORD_HEADER_BYTES + length
    if end > len(view):
        return None
    magic, crc, rlength, rseq, key = _RECORD_HEADER.unpack_from(view, offset)
    if magic != RECORD_MAGIC or rlength != length or rseq != seq:
        return None
    if crc32(view[offset + _RECORD_CRC_FROM:end]) != crc:
        return None
    return key, view[offset + RECORD_HEADER_BYTES:end]


# the key of a record known to be valid, from its header's offset: `(key,) = unpack_record_key(data, offset)`
unpack_record_key = struct.Struct("<20xQ").unpack_from


def record_seq_key(data: bytes, offset: int) -> tuple[int, int]:
    """The seq and key of a record already known to be valid at `offset`."""
    _magic, _crc, _length, seq, key = _RECORD_HEADER.unpack_from(data, offset)
    return seq, key


def record_bytes(length: int) -> int:
    """Bytes a record with a payload of `length` bytes takes on disk."""
    return RECORD_HEADER_BYTES + length


def scan_segment(data: bytes, start: int, record_bytes_max: int,
                 seq_min: int, seq_limit: int) -> tuple[list[ScannedRecord], list[Damage]]:
    """Every valid record in `data[start:]`, in order, and the damaged regions between them.

    A record is accepted only when its seq is at least `seq_min`, below `seq_limit` and
    above the seq of the record accepted before it: seqs only grow within a segment, so
    a stale or misplaced record is not taken for a live one. After damage the scan
    resynchronises at the next record magic that starts a valid record.
    """
    records: list[ScannedRecord] = []
    damage: list[Damage] = []
    end = len(data)
    last_seq = seq_min - 1
    pos = start
    view = memoryview(data)
    unpack, header_bytes = _RECORD_HEADER.unpack_from, RECORD_HEADER_BYTES
    while pos < end:
        # the common case, a valid record right here, inlined (a log of millions is scanned at
        # every start); anything else goes the way of decode_record_at and the resync below
        end_header = pos + header_bytes
        if end_header <= end:
            magic, crc, length, seq, key = unpack(data, pos)
            end_record = end_header + length
            if (magic == RECORD_MAGIC and length <= record_bytes_max and end_record <= end
                    and last_seq < seq < seq_limit and crc32(view[pos + _RECORD_CRC_FROM:end_record]) == crc):
                records.append(ScannedRecord(seq, key, pos, length))
                last_seq = seq
                pos = end_record
                continue
        rec = decode_record_at(data, pos, record_bytes_max)
        if rec is not None and last_seq < rec.seq < seq_limit:
            records.append(rec)
            last_seq = rec.seq
            pos = rec.offset + RECORD_HEADER_BYTES + rec.length
            continue
        bad_from = pos
        probe = pos + 1
        while True:
            probe = data.find(RECORD_MAGIC, probe)
            if probe < 0:
                damage.append(Damage(bad_from, end - bad_from))
                pos = end
                break
            rec = decode_record_at(data, probe, record_bytes_max)
            if rec is not None and last_seq < rec.seq < seq_limit:
                damage.append(Damage(bad_from, probe - bad_from))
                pos = probe
                break
            probe += 1
    return records, damage

