"""Whole writes to a file descriptor, shared by the segment log and the stream log: `os.write`
and `os.writev` may write less than they were given (a signal, a full disk on some file
systems); these go on until everything is written, or raise."""

from __future__ import annotations

import os


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    written = os.write(fd, data)
    if written == len(data):
        return
    with memoryview(data) as view:
        while written < len(data):
            n = os.write(fd, view[written:])
            if n == 0:
                raise OSError("write returned 0")
            written += n


def writev_all(fd: int, parts: tuple) -> None:
    """The parts one after the other, in one `writev` unless it comes up short."""
    written = os.writev(fd, parts)
    if written != sum(map(len, parts)):
        write_all(fd, memoryview(b"".join(parts))[written:])  # a short write: rare
