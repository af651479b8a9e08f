"""Opening files a user names (models, saved graphs, weights, feeds), which may be hostile: only
regular files are read, so a FIFO cannot block the open forever and a device (/dev/zero) cannot
be read until memory runs out."""
from __future__ import annotations

import errno
import os
import stat

__all__ = ["open_regular"]


def open_regular(path: str | os.PathLike, mode: str = "rb", **kw):
    """`open(path, mode)` for reading, but an OSError (IsADirectoryError for a folder) when
    `path` is not a regular file. Opened non-blocking first, so a FIFO does not hang."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, "Is a directory", os.fspath(path))
            raise OSError(errno.EINVAL, "not a regular file (a pipe, socket or device)",
                          os.fspath(path))
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, mode, **kw)
    except BaseException:
        os.close(fd)
        raise
