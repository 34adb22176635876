"""Fuzzing a published sub-batch's decoding (`chunk.sub_batch_records`), the one place where the
server inflates what a stream-protocol client sent: whatever the compression type, counts,
declared length and data, it returns records or raises ChunkError, never inflates more than one
byte past the length the sub-batch declares (a gzip bomb costs nothing), and takes gzip data in
one member or several. The frame decoder itself is fuzzed in test_stream_frames.py and the
connection in test_stream_connection.py.
"""

from __future__ import annotations

import struct
import tracemalloc
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hutch.streamproto import chunk as chunks

FUZZ = settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def packed_records(records: list[bytes]) -> bytes:
    return b"".join(struct.pack(">I", len(r)) + r for r in records)


def decode(compression: int, count: int, raw_len: int, data: bytes) -> list[bytes] | None:
    """The records, or None for a ChunkError; anything else raised fails the test."""
    try:
        out = chunks.sub_batch_records(compression, count, raw_len, data)
    except chunks.ChunkError:
        return None
    assert len(out) == count and sum(4 + len(r) for r in out) <= raw_len
    return out


@FUZZ
@given(compression=st.integers(0, 7), count=st.integers(0, 0xFFFF), raw_len=st.integers(0, 2 ** 32 - 1),
       data=st.binary(max_size=200))
def test_any_sub_batch_gives_records_or_chunk_error(compression, count, raw_len, data):
    decode(compression, count, raw_len, data)


@FUZZ
@given(records=st.lists(st.binary(max_size=40), min_size=1, max_size=8), members=st.integers(1, 3),
       edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
       cut=st.integers(0, 10_000), len_delta=st.integers(-3, 3), count_delta=st.integers(-1, 1))
def test_mutated_gzip_sub_batches_give_records_or_chunk_error(records, members, edits, cut, len_delta, count_delta):
    raw = packed_records(records)
    step = max(1, len(raw) // members)
    data = bytearray(b"".join(zlib.compress(raw[i:i + step], wbits=31) for i in range(0, len(raw), step)))
    if not edits and cut >= len(data) and len_delta == 0 and count_delta == 0:
        assert decode(chunks.COMPRESSION_GZIP, len(records), len(raw), bytes(data)) == records
    for where, byte in edits:
        data[where % len(data)] = byte
    decode(chunks.COMPRESSION_GZIP, max(0, len(records) + count_delta), max(0, len(raw) + len_delta),
           bytes(data[:cut]))


@pytest.mark.parametrize("declared", [0, 1000, 1 << 20])
def test_a_gzip_bomb_is_refused_without_being_inflated(declared):
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    bomb = z.compress(struct.pack(">I", 64 << 20)) + b"".join(z.compress(block) for _ in range(64)) + z.flush()
    assert len(bomb) < 100_000  # 64 MiB of zeros
    tracemalloc.start()
    try:
        assert decode(chunks.COMPRESSION_GZIP, 1, declared, bomb) is None
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * declared + (1 << 20), peak  # what it declared, not what it would inflate to


def test_gzip_in_one_member_or_several_and_trailing_garbage():
    records = [b"a", b"", b"ccc" * 50]
    raw = packed_records(records)
    one = zlib.compress(raw, wbits=31)
    several = b"".join(zlib.compress(raw[i:i + 5], wbits=31) for i in range(0, len(raw), 5))
    assert decode(chunks.COMPRESSION_GZIP, 3, len(raw), one) == records
    assert decode(chunks.COMPRESSION_GZIP, 3, len(raw), several) == records
    assert decode(chunks.COMPRESSION_GZIP, 3, len(raw), one + b"junk") is None
    assert decode(chunks.COMPRESSION_GZIP, 3, len(raw), one[:-1]) is None
    assert decode(chunks.COMPRESSION_GZIP, 3, len(raw) - 1, one) is None
    assert decode(chunks.COMPRESSION_NONE, 3, len(raw), raw) == records
