"""Fault injection for tests and the fault lab: switches a running node checks at the points
where real hardware fails.

`HUTCH_FAULT_FSYNC_FILE=PATH`: while a file exists at PATH, every fsync of the node's message
store and Raft log fails with EIO, as a failing disk's would. Tests turn the fault on and off
by creating and removing the file; the variable is read once, at start.

`HUTCH_FAULT_DISK_FREE_FILE=PATH`: while a file exists at PATH, the node's disk monitor reads
the number in it as the free bytes of its data directory (a disk filling up): below
`disk_free_limit` the disk alarm goes off and publishers are blocked, as on a full disk.

Never set in production: with the variable unset, the checks cost one attribute test.
"""

from __future__ import annotations

import errno
import os

_fsync_file = os.environ.get("HUTCH_FAULT_FSYNC_FILE") or None
_disk_free_file = os.environ.get("HUTCH_FAULT_DISK_FREE_FILE") or None


def check_fsync() -> None:
    """Raise the error a failing disk gives, when the fsync fault is switched on."""
    if _fsync_file is not None and os.path.exists(_fsync_file):
        raise OSError(errno.EIO, f"fsync failed (fault injected: {_fsync_file} exists)")


def disk_free(measured: int) -> int:
    """The free disk space the disk monitor should see: `measured`, or the injected figure."""
    if _disk_free_file is None:
        return measured
    try:
        with open(_disk_free_file) as f:
            return int(f.read().strip() or 0)
    except FileNotFoundError:
        return measured
    except ValueError:
        return 0
