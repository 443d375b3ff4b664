"""Reading a small file a caller names (a key file, a legacy state file): the one way,
so that what is at that path cannot hang or exhaust the reader.

A path given by a caller may name a FIFO (whose open waits for a writer forever), a
device (/dev/zero reads without end) or a huge file. `read_regular` opens without
blocking, and reads only a regular file of at most the given size; anything else is an
`OSError`, as a file that cannot be read is, for the caller to report in its own typed
error.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["KEY_FILE_MAX", "read_regular"]

KEY_FILE_MAX = 64 << 10
"""The most a key file is read of (a master key file is one line, a PEM key a few)."""


def read_regular(path: str | os.PathLike[str], limit: int | None = None) -> bytes:
    """The bytes of the regular file at `path`, of at most `limit` bytes (None: any size);
    OSError for a file that cannot be read, is not a regular file, or is larger."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        if limit is not None and st.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", os.fspath(path))
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read() if limit is None else f.read(limit + 1)
    finally:
        os.close(fd)
    if limit is not None and len(data) > limit:  # (grown since it was measured)
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", os.fspath(path))
    return data
