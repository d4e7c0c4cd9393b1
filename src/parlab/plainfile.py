"""Files and folders an untrusted process could have made: plain files only, never a link, never a wait.

The grader reads what the student's code or the student could have put in
place: a submitted folder, the answers a kernel hands in, what a launch's
ranks write in their folder.  Whoever can make a file can also make a
symbolic link there (read or copied by the grader, root, it would show a
file the student cannot read; a hard link to such a file does the same), or
a FIFO (opening it waits for a writer that never comes, and stalls the
grader).

- ``open_plain``/``read_plain``: open without following a link
  (``O_NOFOLLOW``) and without waiting (``O_NONBLOCK``), then check with
  ``fstat`` that what was opened is a regular file; anything else raises
  ``NotPlainFile``, an ``OSError``, so a caller that already treats a
  missing file as "nothing there" treats these the same way.
- ``unsafe_entry``: the first thing in a submitted folder that is not a
  plain file or folder (a link, FIFO, socket or device) or is a file with
  more than one hard link, found with ``lstat`` only, in words naming it.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


class NotPlainFile(OSError):
    """The path is a link, a FIFO, a socket, a device or a folder, not a regular file."""


_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"), (stat.S_ISDIR, "a folder"))


def kind(mode: int) -> str | None:
    """What a ``st_mode`` that is not a regular file's is, in words ("a FIFO (named pipe)"); None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((words for is_kind, words in _KINDS if is_kind(mode)), "not a regular file")


def open_plain(path: str | os.PathLike, write: bool = False) -> int:
    """A file descriptor of ``path`` (read-only, or read-write with ``write``), only if it is a regular file."""
    what = kind(os.lstat(path).st_mode)
    if what:  # checked again on the descriptor: the path may change in between
        raise NotPlainFile(errno.EINVAL, f"{what}, not a plain file", os.fspath(path))
    try:
        fd = os.open(path, (os.O_RDWR if write else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # a link now; a socket
            raise NotPlainFile(exc.errno, f"not a plain file ({exc.strerror})", os.fspath(path)) from None
        raise
    what = kind(os.fstat(fd).st_mode)
    if what:
        os.close(fd)
        raise NotPlainFile(errno.EINVAL, f"{what}, not a plain file", os.fspath(path))
    return fd


def read_plain(path: str | os.PathLike, offset: int = 0) -> bytes:
    """The bytes of the regular file ``path`` from ``offset`` on (``NotPlainFile`` for anything else)."""
    with os.fdopen(open_plain(path), "rb") as f:
        if offset:
            f.seek(offset)
        return f.read()


def entries(folder: str | os.PathLike, base: Path | None = None):
    """(path, lstat) of the folders from ``base`` down to ``folder``, then of everything below it; never following a link."""
    folder = Path(folder)
    parts = folder.relative_to(base).parts if base is not None and folder.is_relative_to(base) else ()
    for i in range(1, len(parts)):
        yield base.joinpath(*parts[:i]), base.joinpath(*parts[:i]).lstat()
    yield folder, folder.lstat()
    for top, dirs, files in os.walk(folder, followlinks=False):
        for name in sorted(dirs + files):
            path = Path(top) / name
            yield path, path.lstat()


def unsafe_entry(folder: str | os.PathLike, base: Path | None = None) -> str | None:
    """Why ``folder`` cannot be graded: the first entry in it that is not a plain file or folder, or None.

    Links are never followed (``lstat``), so a link to a folder is reported,
    not entered.  ``base``: where the paths in the message start (default
    ``folder``'s parent's parent, giving ``<student>/<lab>/<file>``).
    """
    folder = Path(folder)
    base = Path(base or folder.parent.parent)
    try:
        for path, st in entries(folder, base):
            name = path.relative_to(base) if path.is_relative_to(base) else path
            what = kind(st.st_mode)
            if what and what != "a folder":
                return (f"{name} is {what}: a submission may hold only plain files and folders, so nothing "
                        "of it was graded. Ask the student to submit again without it (a copy of the file, "
                        "not a link)")
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                return (f"{name} has {st.st_nlink} hard links (it is the same file as another one on this "
                        "disk, perhaps one the student cannot read); a submission may hold only files of "
                        "its own. Copy it (cp without -l) if you made the link, else ask the student to "
                        "submit again")
    except OSError as exc:
        return f"{exc.filename or folder} cannot be read ({exc.strerror}); check the submission's permissions"
    return None
