"""File helpers shared by the segment log and the stream log.

Whole writes to a file descriptor: `os.write` and `os.writev` may write less than they were
given (a signal, a full disk on some file systems); these go on until everything is written,
or raise. And `Unlinker`, which removes files in a thread of its own: unlinking a segment of
tens of MiB whose pages are dirty or being written back took the caller 40-70 ms."""

from __future__ import annotations

import os
import queue
import threading
from pathlib import Path


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


class Unlinker:
    """Removes files in a daemon thread of its own, in the order given; `close()` waits until
    every file handed over is gone. A file whose removal is lost with the process (a crash)
    stays: its owner must take files that were to go for files that may still be there."""

    def __init__(self, name: str):
        self._name = name
        self._queue: queue.SimpleQueue[Path | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def unlink(self, path: Path) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        self._queue.put(path)

    def _run(self) -> None:
        while (path := self._queue.get()) is not None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError:  # as if the process had stopped first: the owner copes with the file
                pass

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()
