"""A file that cannot be written: one line naming it and the fix (exits.EXIT_UNWRITABLE), not a traceback."""

from __future__ import annotations

import contextlib
import errno
from pathlib import Path

# The file system's refusals of a write, whatever the path (no permission, a read-only or immutable file or folder, a
# read-only file system, a full disk): a file that cannot be written, even where a start finds it before writing
# anything; a path that names no file that could be (a file in its way, a name too long) is a bad setting instead.
REFUSED_WRITES = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT})


class Unwritable(OSError):
    """A file could not be written: a full disk, no permission, a read-only file system, something in its way."""

    def __str__(self) -> str:
        return f"{self.filename} cannot be written ({self.strerror})"

    @property
    def fix(self) -> str:
        space, in_way = "free some space", "move away what is in its way"
        return {
            errno.ENOSPC: space,
            errno.EDQUOT: space,
            errno.EFBIG: space,
            errno.EISDIR: in_way,
            errno.ENOTDIR: in_way,
            errno.EEXIST: in_way,
        }.get(self.errno, "make it writable")


@contextlib.contextmanager
def writing(path: Path):
    """An OSError while ``path`` is written (also torch.save's, in a RuntimeError) as Unwritable naming the file."""
    try:
        yield
    except (OSError, RuntimeError) as e:
        cause = e if isinstance(e, OSError) else e.__context__
        if isinstance(e, Unwritable) or not isinstance(cause, OSError):
            raise
        raise Unwritable(cause.errno, cause.strerror or str(cause), str(path)) from e
