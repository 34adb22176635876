"""A column of integers kept as differences, in as few bytes as they need.

A queue's paged tail keeps a few numbers per message (where its body lies, its size, ...) for
millions of messages. Neighbours are close to each other: journal seqs grow by one or a few,
sizes repeat. `DeltaColumn` keeps each value as its difference from the one before, in an array
of the narrowest signed width that holds every difference seen so far (1, 2, 4 or 8 bytes; the
width only grows, by one copy of the array), and every `BLOCK`-th value whole, so one value can
be read without summing from the start. So a run of journal seqs costs a byte a message rather
than eight, and a value far from its neighbour (a scratch-log location among journal seqs) costs
only a wider array, never a wrong answer: values are unsigned 64-bit and differences are taken
modulo 2**64.

Appends go at the end and `take` removes from the front (a queue reads its tail back oldest
first); what was taken is a hole at the front, compacted away when it is half of the column.

`KeyedColumns` builds a compact map on it for entries that arrive in key order and leave in
any order: the journal's table of messages recovered at boot, a mirror's messages kept by
reference.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from itertools import accumulate

MASK = (1 << 64) - 1
BLOCK = 256  # every BLOCK-th value (by position in the arrays) is kept whole
_WIDTHS = (("b", 1 << 7), ("h", 1 << 15), ("i", 1 << 31), ("q", 1 << 63))


def _delta(value: int, before: int) -> int:
    """value - before modulo 2**64, as a signed 64-bit number."""
    d = (value - before) & MASK
    return d - (1 << 64) if d >= 1 << 63 else d


class DeltaColumn:
    """Unsigned 64-bit integers, appended at the end and taken from the front."""

    __slots__ = ("_d", "_bases", "_limit", "_last", "_head", "_i")

    def __init__(self) -> None:
        self._d = array("b")        # _d[k] = value k - value k-1 (mod 2**64); _d[k] unused when k % BLOCK == 0
        self._bases = array("Q")    # value k for k = 0, BLOCK, 2*BLOCK, ...
        self._limit = 1 << 7        # |difference| < _limit fits the array's width
        self._last = 0              # the newest value
        self._head = 0              # the value at _i
        self._i = 0                 # index of the oldest value not taken

    def __len__(self) -> int:
        return len(self._d) - self._i

    @property
    def last(self) -> int:
        """The newest value (of a column that is not empty)."""
        return self._last

    def append(self, value: int) -> None:
        d = self._d
        delta = value - self._last
        limit = self._limit
        if -limit <= delta < limit and len(d) % BLOCK:  # the common case: a small step within a block
            d.append(delta)
            self._last = value
            return
        k = len(d)
        if k % BLOCK == 0:
            self._bases.append(value)
            d.append(0)
        else:
            delta = _delta(value, self._last)
            if not -limit <= delta < limit:
                self._widen(delta)
                d = self._d
            d.append(delta)
        if k == self._i:
            self._head = value
        self._last = value

    def _widen(self, delta: int) -> None:
        code, limit = next((c, lim) for c, lim in _WIDTHS if -lim <= delta < lim)
        self._d = array(code, self._d)
        self._limit = limit

    def _at(self, k: int) -> int:
        """The value at array index k."""
        b = k - k % BLOCK
        return (self._bases[b // BLOCK] + sum(self._d[b + 1:k + 1])) & MASK

    def __getitem__(self, n: int) -> int:
        """The n-th value from the front (0: the oldest not taken)."""
        if not 0 <= n < len(self):
            raise IndexError(n)
        return self._head if n == 0 else self._at(self._i + n)

    def values(self, n: int, start: int = 0) -> list[int]:
        """n values from the `start`-th on, oldest first (fewer if the column ends first)."""
        k = self._i + start
        end = min(k + n, len(self._d))
        if k >= end:
            return []
        d, bases = self._d, self._bases
        v = self._head if start == 0 else self._at(k)
        out: list[int] = []
        while True:  # block by block: a block's first slot holds its base, not a difference
            nxt = min(k - k % BLOCK + BLOCK, end)
            out.extend(accumulate(d[k + 1:nxt], initial=v))
            if nxt == end:
                break
            k = nxt
            v = bases[k // BLOCK]
        if max(out) > MASK or min(out) < 0:  # a difference taken modulo 2**64 wrapped round
            out = [v & MASK for v in out]
        return out

    def take(self, n: int) -> list[int]:
        """Remove and return the n oldest values."""
        out = self.values(n)
        if not out:
            return out
        self._i += len(out)
        if self._i == len(self._d):
            self.clear()
        else:
            self._head = self._at(self._i)
            if self._i >= 2 * BLOCK and self._i * 2 > len(self._d):
                self._compact()
        return out

    def tolist(self) -> list[int]:
        return self.values(len(self))

    def clear(self) -> None:
        if self._d.typecode == "b":
            del self._d[:]  # in place: a lazy queue whose consumers keep up empties its tail per message
        else:  # a far value widened it: start narrow again
            self._d = array("b")
            self._limit = 1 << 7
        del self._bases[:]
        self._i = 0

    def _compact(self) -> None:
        cut = self._i - self._i % BLOCK  # whole blocks only: the bases stay aligned
        self._d = self._d[cut:]
        self._bases = self._bases[cut // BLOCK:]
        self._i -= cut

    def index(self, value: int) -> int:
        """The position (from the front) of `value` in a column whose values never decrease, or
        -1 when it is not there."""
        if not len(self):
            return -1
        bases = self._bases
        first_block = self._i // BLOCK
        b = bisect_right(bases, value, first_block) - 1
        if b < first_block:
            b = first_block
        k = max(b * BLOCK, self._i)
        v = self._head if k == self._i else bases[b]
        end = min(b * BLOCK + BLOCK, len(self._d))
        d = self._d
        while True:
            if v == value:
                return k - self._i
            if v > value:
                return -1
            k += 1
            if k >= end:
                return -1
            v += d[k]

    def memory_bytes(self) -> int:
        return self._d.buffer_info()[1] * self._d.itemsize + self._bases.buffer_info()[1] * 8


class KeyedColumns:
    """Entries under ascending integer keys, a few bytes each where a dict entry costs a
    hundred: the keys as offsets from the first in an array searched by bisection (32-bit,
    widened to 64 should they span more), one integer value each in a `DeltaColumn`, and a
    mark byte each, the owner's (flags, a delivery count) but for GONE, which says the entry
    was taken out. Entries are appended in key order and taken out anywhere; once the taken
    ones at the front are most of it (a backlog read oldest first), they are dropped."""

    GONE = 255
    DROP_FRONT_MIN = 4096  # taken entries at the front worth dropping (one copy of the keys)

    __slots__ = ("base", "keys", "values", "marks", "live", "head")

    def __init__(self) -> None:
        self.base = 0  # the key of offset 0
        self.keys = array("I")
        self.values = DeltaColumn()
        self.marks = bytearray()
        self.live = 0
        self.head = 0  # no live entry before this index

    def __len__(self) -> int:
        return self.live

    @property
    def last_key(self) -> int:
        """The key appended last (of columns that ever had one)."""
        return self.base + self.keys[-1]

    def append(self, key: int, value: int, mark: int = 0) -> None:
        keys = self.keys
        if not keys:
            self.base = key
        elif key - self.base <= keys[-1]:
            raise ValueError(f"key {key} is not above the last one, {self.base + keys[-1]}")
        off = key - self.base
        if off >= 1 << 32 and keys.typecode == "I":
            keys = self.keys = array("Q", keys)
        keys.append(off)
        self.values.append(value)
        self.marks.append(mark)
        self.live += 1

    def index(self, key: int) -> int:
        """The index of the live entry under `key`, or -1."""
        keys = self.keys
        off = key - self.base
        if not keys or not 0 <= off <= keys[-1]:
            return -1
        i = bisect_left(keys, off, self.head)
        return i if i < len(keys) and keys[i] == off and self.marks[i] != self.GONE else -1

    def __contains__(self, key: int) -> bool:
        return self.index(key) >= 0

    def take(self, i: int) -> int:
        """Take out the live entry at index i; its value. Indices move when the front is dropped."""
        marks = self.marks
        marks[i] = self.GONE
        self.live -= 1
        value = self.values[i]
        if i == self.head:
            h, n, gone = i, len(marks), self.GONE
            while h < n and marks[h] == gone:
                h += 1
            self.head = h
            if h >= self.DROP_FRONT_MIN and 2 * h > n:
                self._drop_front(min(h, n - 1))  # the last entry stays: appends go above its key
        return value

    def _drop_front(self, h: int) -> None:
        """Forget the first h entries (all taken; at least one entry stays)."""
        self.values.take(h)
        keys = self.keys
        off = keys[h]
        self.keys = array(keys.typecode, (k - off for k in keys[h:]))
        del self.marks[:h]
        self.base += off
        self.head -= h

    def entries(self) -> Iterator[tuple[int, int, int, int]]:
        """(index, key, value, mark) of each live entry, in key order."""
        base, keys, marks, gone = self.base, self.keys, self.marks, self.GONE
        for start in range(self.head, len(keys), 65536):  # the values a slice at a time
            for i, value in enumerate(self.values.values(65536, start), start):
                m = marks[i]
                if m != gone:
                    yield i, base + keys[i], value, m


__all__ = ["DeltaColumn", "KeyedColumns", "BLOCK"]
