"""The segment log's byte layout (hutch.store.format): records carry magic, length, seq,
key and a CRC over all of it, and a scan finds every valid record even after damage."""

import zlib

from hutch.store import format as fmt


def _segment(records: list[tuple[int, int, bytes]]) -> tuple[bytes, list[int]]:
    data = bytearray(fmt.encode_segment_header(records[0][0] if records else 1))
    offsets = []
    for seq, key, payload in records:
        offsets.append(len(data))
        data += fmt.encode_record(seq, key, payload)
    return bytes(data), offsets


def test_record_header_layout_is_magic_crc_length_seq_key():
    raw = fmt.encode_record(7, 42, b"hello")
    assert len(raw) == fmt.RECORD_HEADER_BYTES + 5 == 33
    assert raw[:4] == fmt.RECORD_MAGIC
    assert int.from_bytes(raw[8:12], "little") == 5
    assert int.from_bytes(raw[12:20], "little") == 7
    assert int.from_bytes(raw[20:28], "little") == 42
    assert raw[28:] == b"hello"
    assert int.from_bytes(raw[4:8], "little") == zlib.crc32(raw[8:])


def test_segment_header_round_trips_and_detects_damage():
    head = fmt.encode_segment_header(123456789)
    assert len(head) == fmt.SEGMENT_HEADER_BYTES == 24
    assert fmt.decode_segment_header(head) == 123456789
    damaged = bytearray(head)
    damaged[12] ^= 0x01
    assert fmt.decode_segment_header(bytes(damaged)) is None
    assert fmt.decode_segment_header(head[:20]) is None


def test_scan_finds_every_record_of_an_intact_segment():
    records = [(s, s % 3, bytes([s]) * s) for s in range(1, 20)]
    data, offsets = _segment(records)
    found, damage = fmt.scan_segment(data, fmt.SEGMENT_HEADER_BYTES, 1 << 20, 1, 1 << 64)
    assert damage == []
    assert [(r.seq, r.key, r.offset, r.length) for r in found] == [
        (s, k, o, len(p)) for (s, k, p), o in zip(records, offsets, strict=True)]


def test_scan_resynchronises_after_a_flipped_bit_and_reports_the_region():
    records = [(s, 0, b"x" * 50) for s in range(1, 6)]
    data, offsets = _segment(records)
    damaged = bytearray(data)
    damaged[offsets[2] + 40] ^= 0x80  # inside record 3's payload
    found, damage = fmt.scan_segment(bytes(damaged), fmt.SEGMENT_HEADER_BYTES, 1 << 20, 1, 1 << 64)
    assert [r.seq for r in found] == [1, 2, 4, 5]
    assert damage == [fmt.Damage(offsets[2], offsets[3] - offsets[2])]


def test_scan_does_not_trust_a_damaged_length():
    records = [(s, 0, b"y" * 30) for s in range(1, 5)]
    data, offsets = _segment(records)
    damaged = bytearray(data)
    damaged[offsets[1] + 8:offsets[1] + 12] = (10_000).to_bytes(4, "little")  # record 2 claims 10 kB
    found, damage = fmt.scan_segment(bytes(damaged), fmt.SEGMENT_HEADER_BYTES, 1 << 20, 1, 1 << 64)
    assert [r.seq for r in found] == [1, 3, 4]
    assert damage == [fmt.Damage(offsets[1], offsets[2] - offsets[1])]


def test_scan_rejects_records_whose_seq_does_not_grow_or_is_out_of_range():
    data, offsets = _segment([(5, 0, b"a"), (6, 0, b"b"), (6, 0, b"c"), (9, 0, b"d")])
    found, damage = fmt.scan_segment(data, fmt.SEGMENT_HEADER_BYTES, 1 << 20, 5, 9)
    assert [r.seq for r in found] == [5, 6]
    assert damage == [fmt.Damage(offsets[2], len(data) - offsets[2])]


def test_scan_reports_a_torn_or_zeroed_tail_as_damage_to_the_end():
    data, offsets = _segment([(s, 0, b"z" * 100) for s in range(1, 4)])
    torn = data[:-7]
    found, damage = fmt.scan_segment(torn, fmt.SEGMENT_HEADER_BYTES, 1 << 20, 1, 1 << 64)
    assert [r.seq for r in found] == [1, 2]
    assert damage == [fmt.Damage(offsets[2], len(torn) - offsets[2])]
    zeroed = data + bytes(4096)
    found, damage = fmt.scan_segment(zeroed, fmt.SEGMENT_HEADER_BYTES, 1 << 20, 1, 1 << 64)
    assert [r.seq for r in found] == [1, 2, 3]
    assert damage == [fmt.Damage(len(data), 4096)]


def test_scan_refuses_a_length_over_record_bytes_max():
    data, _ = _segment([(1, 0, b"q" * 300)])
    found, damage = fmt.scan_segment(data, fmt.SEGMENT_HEADER_BYTES, 299, 1, 1 << 64)
    assert found == [] and len(damage) == 1
