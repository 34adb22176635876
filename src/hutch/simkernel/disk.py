"""A simulated disk under real files: what a power failure keeps, and the errors a failing or
full disk gives.

The whole-cluster simulation (hutch.sim.cluster) runs real stores on real files in a temporary
directory. A process crash (kill -9) loses nothing they wrote: the page cache outlives the
process. A power failure loses what the page cache held and the disk did not: every write made
since the file's last fsync. This module keeps, while it is installed, an undo record of every
such write, per file, under the directories it is told belong to a simulated host (`mount`), so
that `power_loss(host)` can put each file back as the disk held it. It also injects the errors
of a failing disk (`fsync` raises EIO) and of a full one (writes raise ENOSPC, and the free space
`shutil.disk_usage` reports, which the node's disk alarm reads, is below any limit).

The model, and what it leaves out:

- a write not fsynced is lost at a power failure, except that the disk may have taken a prefix
  of a file's unsynced writes in the order they were made, the last of them torn at any byte:
  how much is drawn from the seed (half the time nothing survives). `fsync` and `fdatasync` of a
  file make everything written to it so far durable;
- directory entries are durable at once: a create, rename, unlink or truncate-at-open is never
  undone by a power failure (a real file system needs a directory fsync for that; hutch's stores
  make one, but the model does not check that they do). A file created and not fsynced survives
  empty, with its unsynced writes lost;
- only the calls a store makes through the `os` module are seen (`os.open`, `write`, `writev`,
  `pwrite`, `truncate`, `ftruncate`, `fsync`, `fdatasync`, `close`, `unlink`, `rename`,
  `replace`). Files written through Python file objects (`open()`, `Path.write_text`: the
  cluster file, the cookie) are durable as soon as written;
- a full disk fails every write under the host's directory, whole (never a short write); an
  fsync error fails every fsync of the host's files, and the model then distrusts the page cache
  (the caller treats the host's next start as after a power failure);
- a slow disk (`slow[host]`: a range of seconds) makes each fsync of the host's files take a
  time drawn from that range. The fsync itself still runs at once, and its data is durable from
  then on; the time is added to `fsync_s`, which the simulated loop reads around each function
  a node runs in a worker thread (`VirtualLoop.work_clock`), so the node learns that the fsync
  finished only that much later, while its loop goes on. An fsync a node makes on its event loop
  takes no simulated time: its loop would stop for it, and the nodes of a simulation share one
  loop.

It never touches a file outside the mounted directories, and `installed()` restores every
function it replaced.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from random import Random
from types import ModuleType

DISK_BYTES = 64 * 1024**3  # the size every simulated disk reports
FREE_BYTES = 32 * 1024**3  # the free space it reports while it is not full

_REAL = {name: getattr(os, name) for name in (
    "open", "close", "write", "writev", "pwrite", "truncate", "ftruncate", "fsync", "fdatasync", "unlink",
    "rename", "replace")}
_real_disk_usage = shutil.disk_usage


@dataclass(slots=True)
class _Unsynced:
    """What a file's writes since its last fsync changed, so a power failure can undo them."""
    host: str
    synced_size: int  # the file's size at its last fsync (or when first written after it)
    undo: list[tuple[int, bytes]] = field(default_factory=list)  # (offset, bytes overwritten), in order
    redo: list[tuple[str, int, bytes]] = field(default_factory=list)  # ("w", offset, data) / ("t", size, b"")


@dataclass(frozen=True, slots=True)
class PowerLoss:
    """What one power failure did to a host's files."""
    host: str
    files: int  # files that had unsynced writes
    bytes_lost: int  # unsynced bytes that did not survive
    torn: int  # files whose last surviving write was cut short


class SimDisk:
    """The disks of the simulated hosts. `mount(host, directory)`, then inside `installed()`
    every file under the directory is on that host's disk."""

    def __init__(self, rng: Random) -> None:
        self.rng = rng
        self._mounts: list[tuple[str, str]] = []  # (directory with a trailing separator, host)
        self._fds: dict[int, tuple[str, tuple[int, int]]] = {}  # fd -> (host, file key) for mounted files
        self._unsynced: dict[tuple[int, int], _Unsynced] = {}  # (st_dev, st_ino) -> its unsynced writes
        self.fsync_failing: set[str] = set()  # hosts whose fsyncs raise EIO
        self.full: set[str] = set()  # hosts whose writes raise ENOSPC
        self.free_bytes: dict[str, int] = {}  # hosts whose disk reports this little free space
        self.slow: dict[str, tuple[float, float]] = {}  # hosts whose fsyncs take from-to seconds
        self.fsync_s = 0.0  # seconds the slow disks' fsyncs have taken in all

    def mount(self, host: str, directory: str) -> None:
        self._mounts.append((os.path.join(os.path.abspath(directory), ""), host))

    def host_of(self, path: str | os.PathLike) -> str | None:
        p = os.path.abspath(os.fspath(path))
        for root, host in self._mounts:
            if p.startswith(root) or p + os.sep == root:
                return host
        return None

    # -- what a host's process and power do

    def open_fds(self, host: str) -> list[int]:
        """The descriptors a host's process holds on its files (a crash closes them)."""
        return sorted(fd for fd, (h, _) in self._fds.items() if h == host)

    def close_all(self, host: str) -> None:
        for fd in self.open_fds(host):
            del self._fds[fd]
            _REAL["close"](fd)

    def unsynced_bytes(self, host: str) -> int:
        return sum(len(d) for u in self._unsynced.values() if u.host == host for k, _, d in u.redo if k == "w")

    def power_loss(self, host: str) -> PowerLoss:
        """The host loses power: each of its files goes back to what its last fsync made durable,
        plus, drawn from the seed, a prefix of the writes since (the last of them torn). Call it
        once the host's process is gone (`close_all`)."""
        paths = self._paths(host)
        files = bytes_lost = torn = 0
        mine = [k for k, u in self._unsynced.items() if u.host == host]
        for key in mine:
            if key not in paths:  # unlinked since: nothing left to restore
                del self._unsynced[key]
        # in the order of their paths (inode numbers differ from run to run; the draws must not)
        for key in sorted((k for k in mine if k in paths), key=paths.__getitem__):
            u = self._unsynced.pop(key)
            path = paths[key]
            files += 1
            fd = _REAL["open"](path, os.O_WRONLY)
            try:
                for offset, old in reversed(u.undo):
                    _REAL["pwrite"](fd, old, offset)
                _REAL["ftruncate"](fd, u.synced_size)
                total = sum(len(d) for k, _, d in u.redo if k == "w")
                keep = 0 if self.rng.random() < 0.5 else self.rng.randint(0, total)
                bytes_lost += total - keep
                for kind, at, data in u.redo:
                    if kind == "t":
                        if keep <= 0:
                            break
                        _REAL["ftruncate"](fd, at)
                        continue
                    if keep <= 0:
                        break
                    part = data[:keep]
                    _REAL["pwrite"](fd, part, at)
                    keep -= len(part)
                    if len(part) < len(data):
                        torn += 1
                        break
            finally:
                _REAL["close"](fd)
        return PowerLoss(host, files, bytes_lost, torn)

    def _paths(self, host: str) -> dict[tuple[int, int], str]:
        """The current path of each file on a host's disk, by its key."""
        out: dict[tuple[int, int], str] = {}
        for root, h in self._mounts:
            if h != host:
                continue
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames.sort()
                for name in sorted(filenames):
                    p = os.path.join(dirpath, name)
                    with contextlib.suppress(FileNotFoundError):
                        st = os.stat(p)
                        out.setdefault((st.st_dev, st.st_ino), p)
        return out

    # -- the intercepted calls

    def _fd_host(self, fd: int) -> tuple[str, tuple[int, int]] | None:
        known = self._fds.get(fd)
        if known is not None:
            return known
        try:  # a descriptor opened some other way (a Python file object): find its file
            host = self.host_of(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            return None
        if host is None:
            return None
        st = os.fstat(fd)
        return host, (st.st_dev, st.st_ino)

    def _changing(self, host: str, key: tuple[int, int], fd: int) -> _Unsynced:
        u = self._unsynced.get(key)
        if u is None:
            u = self._unsynced[key] = _Unsynced(host, os.fstat(fd).st_size)
        return u

    def _note_write(self, fd: int, offset: int | None, data: bytes, do) -> int:
        """Write through `do()` and keep what it overwrote. `offset` None: at the descriptor's
        position (the end of the file for O_APPEND)."""
        known = self._fd_host(fd)
        if known is None:
            return do()
        host, key = known
        if host in self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        u = self._changing(host, key, fd)
        size = os.fstat(fd).st_size
        if offset is None:
            offset = size if _flags(fd) & os.O_APPEND else os.lseek(fd, 0, os.SEEK_CUR)
        overlap = max(0, min(size, offset + len(data)) - offset)
        if overlap:
            u.undo.append((offset, _pread_path(fd, overlap, offset)))
        written = do()
        u.redo.append(("w", offset, bytes(data[:written])))
        return written

    def _note_truncate(self, host: str, key: tuple[int, int], fd: int, length: int) -> None:
        u = self._changing(host, key, fd)
        size = os.fstat(fd).st_size
        if length < size:
            u.undo.append((length, _pread_path(fd, size - length, length)))
        u.redo.append(("t", length, b""))

    def _fsync_time(self, fd: int) -> None:
        if self.slow and (known := self._fd_host(fd)) is not None and known[0] in self.slow:
            self.fsync_s += self.rng.uniform(*self.slow[known[0]])

    def _synced(self, fd: int) -> None:
        known = self._fd_host(fd)
        if known is None:
            return
        host, key = known
        if host in self.fsync_failing:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        self._unsynced.pop(key, None)

    def _forget_path(self, path) -> None:
        """A file is unlinked or replaced: its key may be reused by the next file created."""
        with contextlib.suppress(OSError):
            st = os.stat(path)
            self._unsynced.pop((st.st_dev, st.st_ino), None)

    @contextlib.contextmanager
    def installed(self, bound: tuple[tuple[ModuleType, str], ...] = ()) -> Iterator[SimDisk]:
        """Replace the `os` calls (and `shutil.disk_usage`) while it lasts. `bound`: (module,
        attribute) pairs that hold `os.fsync` or `os.fdatasync` bound at import, replaced too."""
        real = _REAL
        disk = self

        def sim_open(path, flags, mode=0o777, *, dir_fd=None):
            host = disk.host_of(path) if dir_fd is None else None
            if host is None:
                return real["open"](path, flags, mode, dir_fd=dir_fd)
            existed = os.path.exists(path)
            if flags & os.O_TRUNC and existed and os.path.getsize(path) and flags & (os.O_WRONLY | os.O_RDWR):
                fd0 = real["open"](path, os.O_RDONLY)
                try:
                    st = os.fstat(fd0)
                    disk._note_truncate(host, (st.st_dev, st.st_ino), fd0, 0)
                finally:
                    real["close"](fd0)
            fd = real["open"](path, flags, mode)
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)
            if not existed:
                disk._unsynced.pop(key, None)  # a key reused from a file gone since
            disk._fds[fd] = (host, key)
            return fd

        def sim_close(fd):
            disk._fds.pop(fd, None)
            real["close"](fd)

        def sim_write(fd, data):
            return disk._note_write(fd, None, data, lambda: real["write"](fd, data))

        def sim_writev(fd, buffers):
            buffers = list(buffers)
            data = b"".join(bytes(b) for b in buffers)
            return disk._note_write(fd, None, data, lambda: real["writev"](fd, buffers))

        def sim_pwrite(fd, data, offset):
            return disk._note_write(fd, offset, data, lambda: real["pwrite"](fd, data, offset))

        def sim_ftruncate(fd, length):
            known = disk._fd_host(fd)
            if known is not None:
                disk._note_truncate(known[0], known[1], fd, length)
            real["ftruncate"](fd, length)

        def sim_truncate(path, length):
            host = disk.host_of(path) if not isinstance(path, int) else None
            if host is None:
                return sim_ftruncate(path, length) if isinstance(path, int) else real["truncate"](path, length)
            fd = real["open"](path, os.O_RDONLY)
            try:
                st = os.fstat(fd)
                disk._note_truncate(host, (st.st_dev, st.st_ino), fd, length)
            finally:
                real["close"](fd)
            real["truncate"](path, length)

        def sim_fsync(fd):
            fd = fd if isinstance(fd, int) else fd.fileno()
            disk._fsync_time(fd)
            disk._synced(fd)
            real["fsync"](fd)

        def sim_fdatasync(fd):
            fd = fd if isinstance(fd, int) else fd.fileno()
            disk._fsync_time(fd)
            disk._synced(fd)
            real["fdatasync"](fd)

        def sim_unlink(path, *, dir_fd=None):
            if dir_fd is None:
                disk._forget_path(path)
            real["unlink"](path, dir_fd=dir_fd)

        def sim_rename(src, dst, **kw):
            disk._forget_path(dst)
            real["rename"](src, dst, **kw)

        def sim_replace(src, dst, **kw):
            disk._forget_path(dst)
            real["replace"](src, dst, **kw)

        def sim_disk_usage(path):
            host = disk.host_of(path)
            if host is None:
                return _real_disk_usage(path)
            free = 0 if host in disk.full else disk.free_bytes.get(host, FREE_BYTES)
            return shutil._ntuple_diskusage(DISK_BYTES, DISK_BYTES - free, free)

        fakes = {"open": sim_open, "close": sim_close, "write": sim_write, "writev": sim_writev,
                 "pwrite": sim_pwrite, "truncate": sim_truncate, "ftruncate": sim_ftruncate, "fsync": sim_fsync,
                 "fdatasync": sim_fdatasync, "unlink": sim_unlink, "rename": sim_rename, "replace": sim_replace}
        saved_bound = [(m, a, getattr(m, a)) for m, a in bound]
        for name, fake in fakes.items():
            setattr(os, name, fake)
        shutil.disk_usage = sim_disk_usage
        for m, a, was in saved_bound:
            setattr(m, a, sim_fdatasync if was is real["fdatasync"] else sim_fsync)
        try:
            yield self
        finally:
            for name, fn in real.items():
                setattr(os, name, fn)
            shutil.disk_usage = _real_disk_usage
            for m, a, was in saved_bound:
                setattr(m, a, was)


def _flags(fd: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_GETFL)


def _pread_path(fd: int, length: int, offset: int) -> bytes:
    """Read from the file behind a descriptor that may be write-only."""
    if _flags(fd) & os.O_ACCMODE != os.O_WRONLY:
        return os.pread(fd, length, offset)
    rfd = _REAL["open"](f"/proc/self/fd/{fd}", os.O_RDONLY)
    try:
        return os.pread(rfd, length, offset)
    finally:
        _REAL["close"](rfd)


__all__ = ["DISK_BYTES", "FREE_BYTES", "PowerLoss", "SimDisk"]
