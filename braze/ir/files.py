"""Opening files a user names (models, saved graphs, weights, feeds), which may be hostile: only
regular files are read, so a FIFO cannot block the open forever and a device (/dev/zero) cannot
be read until memory runs out; an .npz archive's arrays are checked against the bytes that hold
them before NumPy allocates them."""
from __future__ import annotations

import errno
import math
import os
import stat
import zipfile

import numpy as np

__all__ = ["open_regular", "load_npz"]

_NPY_MAGIC = b"\x93NUMPY"


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


def load_npz(path: str | os.PathLike, keys=None) -> dict[str, np.ndarray]:
    """The arrays of the .npz archive (np.savez) at `path`, only those named in `keys` when given
    (others are not read). Each array's header is checked against the size of the archive member
    holding it first, so a member declaring f32[2**40] in a few bytes is refused, not allocated.
    ValueError (OSError when unreadable) saying what is wrong."""
    with open_regular(path) as f:
        head = f.read(len(_NPY_MAGIC))
        if head.startswith(_NPY_MAGIC):
            raise ValueError("it holds one unnamed array (np.save), not arrays by name")
        f.seek(0)
        try:
            archive = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, EOFError) as e:
            raise ValueError(f"not an .npz archive ({e})") from None
        with archive:
            out = {}
            for info in archive.infolist():
                key = info.filename.removesuffix(".npy")
                if keys is None or key in keys:
                    out[key] = _read_member(archive, info)
            return out


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    from numpy.lib import format as npy

    try:
        with archive.open(info) as m:
            if m.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
                raise ValueError(f"member {info.filename!r} is not a NumPy array (.npy)")
            m.seek(0)
            version = npy.read_magic(m)
            read_header = npy.read_array_header_1_0 if version == (1, 0) else \
                npy.read_array_header_2_0
            shape, _, dtype = read_header(m)
            need = math.prod(shape) * dtype.itemsize
            if need > info.file_size - m.tell():
                raise ValueError(f"member {info.filename!r} declares {dtype}{list(shape)} "
                                 f"({need} bytes) but holds {info.file_size - m.tell()} bytes "
                                 "(truncated or corrupt)")
            m.seek(0)
            return npy.read_array(m, allow_pickle=False)
    except (zipfile.BadZipFile, EOFError, OSError, TypeError) as e:
        raise ValueError(f"member {info.filename!r} is corrupt ({e})") from None
