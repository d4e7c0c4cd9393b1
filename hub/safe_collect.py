"""``nbgrader collect`` that believes the server, not the student: the hub kit's collect plugin.

The exchange's ``inbound`` folder is writable by every student (mode 0733),
and nbgrader 0.9's collect, run as the instructor, trusts what it finds there:
a folder named ``<student>+<lab>+<time>+<random>`` is taken as that student's
submission whoever made it (nbgrader only logs "cheating attempt?"), links
inside it are followed while copying (so the instructor's own files can be
copied in), and the submission time is the ``timestamp.txt`` the student
wrote.  ``hub/instructor/nbgrader_config.py`` names this class instead
(``c.ExchangeFactory.collect``); the formgrader's collect goes through the
same setting.

For each inbound folder of the lab it collects, ``SafeExchangeCollect``:

- skips, with a warning naming the folder and the reason, a folder whose
  Unix owner is not the user its name claims (the kit's student ids are the
  students' Unix names), a name that claims no Unix user or another lab,
  anything there that is not a plain folder (a link, a file), and a folder
  the instructor cannot read;
- skips, naming the file, a submission holding anywhere inside a symbolic
  link, FIFO, device or socket, an entry owned by anyone else, a file with
  more than one hard link, more than ``max_entries`` entries, folders nested
  deeper than ``max_depth``, or more than nbgrader's ``max_dir_size`` in all
  (where nbgrader would stop the whole collect);
- copies without following any link (every entry is opened relative to its
  folder with ``O_NOFOLLOW`` and checked on the opened file, so an entry
  swapped for a link after the check is refused too); copies get the
  instructor's ordinary modes, never the student's (no set-uid copy);
- takes as the submission's time the latest status-change time (ctime) of the
  folder and of everything in it, which the kernel sets and no user can set
  back, writes it into the collected ``timestamp.txt`` (nbgrader's
  timestamp format, which autograde and the late policy read), logs a
  warning when the student's own ``timestamp.txt`` said something more than
  ``timestamp_tolerance`` seconds away, and picks each student's latest
  submission by that time, not by the time in the folder's name.

A skipped folder does not hide the student's other submissions: the latest
one that passes is collected.  The ctime moves when the student changes the
folder after submitting (that change then counts as the submission), and
when the exchange is copied or restored elsewhere (every submission then
looks late): collect before moving an exchange.
"""
from __future__ import annotations

import datetime
import errno
import fnmatch
import os
import pwd
import shutil
import stat

from dateutil.tz import gettz
from nbgrader.exchange.default.collect import ExchangeCollect
from nbgrader.utils import parse_utc
from traitlets import Float, Integer

from parlab.plainfile import kind as file_kind
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: an entry swapped for a FIFO after its lstat does not hang the open.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Refused(Exception):
    """A submission that is not collected; the message names the entry and the reason."""


class SafeExchangeCollect(ExchangeCollect):
    """nbgrader's collect, with each inbound folder checked and timed by the server (module docstring)."""

    max_entries = Integer(10000, help="Most files and folders one submission may hold").tag(config=True)
    max_depth = Integer(32, help="Most levels of folders inside one submission").tag(config=True)
    timestamp_tolerance = Float(
        60.0, help="Seconds the student's timestamp.txt may differ from the server's time without a warning"
    ).tag(config=True)

    def _path_to_record(self, path):
        """nbgrader's record of one inbound folder, timed by the server; a refused one in a group of its own.

        nbgrader's ``init_src`` groups the records by ``username`` and keeps
        each group's latest: a refused folder gets a key no student has, so
        it cannot displace the real student's submission, and ``init_src``
        then drops it.
        """
        filename = os.path.basename(path)
        try:
            uid, student = self._claimed_owner(filename)
            checked = self._walk(path, uid)
        except Refused as why:
            self.log.warning("Not collecting %r: %s", path, why)
            return {"username": object(), "filename": filename, "timestamp": datetime.datetime.min,
                    "refused": str(why)}
        return {"username": student, "filename": filename, "uid": uid,
                "timestamp": parse_utc(self._format(checked["ctime_ns"]))}

    def init_src(self):
        super().init_src()
        self.src_records = [rec for rec in self.src_records if "refused" not in rec]
        self._uids = {rec["filename"]: rec["uid"] for rec in self.src_records}

    def _claimed_owner(self, filename: str) -> tuple[int, str]:
        parts = filename.rsplit("+", 3)
        if len(parts) < 3:
            raise Refused("its name is not <student>+<lab>+<time>[+<random>]")
        student, lab = parts[0], parts[1]
        if lab != self.coursedir.assignment_id:
            raise Refused(f"its name claims lab {lab!r}, not {self.coursedir.assignment_id!r}")
        try:
            return pwd.getpwnam(student).pw_uid, student
        except KeyError:
            raise Refused(f"its name claims student {student!r}, and no Unix user has that name") from None

    def _format(self, ctime_ns: int) -> str:
        when = datetime.datetime.fromtimestamp(ctime_ns / 1e9, gettz(self.timezone))
        return when.strftime(self.timestamp_format)

    def do_copy(self, src, dest, log=None):
        """Copy the checked submission ``src`` to ``dest`` (as nbgrader does), then stamp the server's time."""
        try:
            checked = self._walk(src, self._uids[os.path.basename(src)], dest)
        except Refused as why:  # changed since init_src checked it
            shutil.rmtree(dest, ignore_errors=True)
            self.log.warning("Not collecting %r: %s", src, why)
            return
        server = self._format(checked["ctime_ns"])
        stated = checked["stated"]
        try:
            differs = abs((parse_utc(stated) - parse_utc(server)).total_seconds()) > self.timestamp_tolerance
        except (ValueError, OverflowError, TypeError):  # none, or not a time
            differs = True
        if differs:
            self.log.warning("%r: the student's timestamp.txt says %r; collected with the server's time of "
                             "the submission instead, %s", src, stated, server)
        with open(os.path.join(dest, "timestamp.txt"), "w") as fh:
            fh.write(server)

    def _walk(self, path: str, uid: int, dest: str | None = None) -> dict:
        """Check every entry of the submission at ``path`` (and copy it to ``dest``); refuse with the reason.

        Returns the latest ctime of everything in it (ns) and, when copying,
        the text of its top-level timestamp.txt (None when there is none).
        """
        parent, name = os.path.split(path)
        parent_fd = os.open(parent, _DIR_FLAGS)
        opened = []
        try:
            st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                raise Refused(f"it is {file_kind(st.st_mode) or 'a file'}, not a folder")
            top = self._open(name, parent_fd, _DIR_FLAGS, ".", uid, st, want=stat.S_IFDIR)
            opened.append(top)
            found = {"ctime_ns": os.fstat(top).st_ctime_ns, "stated": None}
            if dest is not None:
                os.makedirs(dest)
            budget = {"entries": 0, "bytes": 0}
            stack = [(top, "", dest, 0)]
            while stack:
                fd, rel, out, depth = stack.pop()
                for entry in self._entries(fd, rel, budget):
                    sub = os.path.join(rel, entry)
                    st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
                    what = file_kind(st.st_mode)  # None for a regular file
                    if what and not stat.S_ISDIR(st.st_mode):
                        raise Refused(f"{sub!r} is {what}")
                    if what:  # a folder
                        if sub == "timestamp.txt":  # where the server's time is written
                            raise Refused(f"{sub!r} is a folder")
                        if depth + 1 > self.max_depth:
                            raise Refused(f"{sub!r} is nested more than {self.max_depth} folders deep")
                        child = self._open(entry, fd, _DIR_FLAGS, sub, uid, st, want=stat.S_IFDIR)
                        opened.append(child)
                        found["ctime_ns"] = max(found["ctime_ns"], os.fstat(child).st_ctime_ns)
                        copy_to = None
                        if out is not None and not self._ignored(entry):
                            copy_to = os.path.join(out, entry)
                            os.mkdir(copy_to)
                        stack.append((child, sub, copy_to, depth + 1))
                        continue
                    self._check_owner(sub, uid, st)
                    if st.st_nlink > 1:
                        raise Refused(f"{sub!r} has {st.st_nlink} hard links (a link to a file elsewhere)")
                    budget["bytes"] += st.st_size
                    if budget["bytes"] > 1000 * self.coursedir.max_dir_size:
                        raise Refused(f"it holds more than nbgrader's max_dir_size, "
                                      f"{self.coursedir.max_dir_size} kB, at {sub!r}")
                    found["ctime_ns"] = max(found["ctime_ns"], st.st_ctime_ns)
                    if out is not None and self._copied(entry, sub, st):
                        text = self._copy_file(entry, fd, sub, uid, st, os.path.join(out, entry), found)
                        if sub == "timestamp.txt":
                            found["stated"] = text.decode("utf-8", "replace").strip()
            return found
        except OSError as e:
            raise Refused(f"reading or copying it failed ({e.strerror}: {e.filename or path!r})") from None
        finally:
            for fd in opened:
                os.close(fd)
            os.close(parent_fd)

    def _entries(self, fd: int, rel: str, budget: dict) -> list[str]:
        names = []
        with os.scandir(fd) as it:
            for entry in it:
                budget["entries"] += 1
                if budget["entries"] > self.max_entries:
                    raise Refused(f"it holds more than {self.max_entries} entries (at {rel or '.'!r})")
                names.append(entry.name)
        return sorted(names)

    def _open(self, name: str, dir_fd: int, flags: int, rel: str, uid: int, seen, want: int) -> int:
        """``name`` opened in ``dir_fd`` without following a link, checked on what was opened."""
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except OSError as e:
            if e.errno == errno.ELOOP:  # the entry became a link after its lstat
                raise Refused(f"{rel!r} is a symbolic link") from None
            raise
        st = os.fstat(fd)
        if stat.S_IFMT(st.st_mode) != want or (seen is not None and (st.st_ino, st.st_dev) != (seen.st_ino,
                                                                                            seen.st_dev)):
            os.close(fd)
            raise Refused(f"{rel!r} changed while it was checked (now mode {st.st_mode:o})")
        try:
            self._check_owner(rel, uid, st)
        except Refused:
            os.close(fd)
            raise
        return fd

    @staticmethod
    def _check_owner(rel: str, uid: int, st: os.stat_result) -> None:
        if st.st_uid != uid:
            try:
                owner = pwd.getpwuid(st.st_uid).pw_name
            except KeyError:
                owner = f"uid {st.st_uid}"
            try:
                claimed = pwd.getpwuid(uid).pw_name
            except KeyError:
                claimed = f"uid {uid}"
            raise Refused(f"{rel!r} is owned by {owner}, not by {claimed}, whose submission it claims to be")

    def _ignored(self, name: str) -> bool:
        return any(fnmatch.fnmatch(name, glob) for glob in self.coursedir.ignore)

    def _copied(self, name: str, rel: str, st: os.stat_result) -> bool:
        """nbgrader's rules (CourseDirectory ignore, include, max_file_size) for one file."""
        if self._ignored(name) or not any(fnmatch.fnmatch(name, glob) for glob in self.coursedir.include):
            return False
        if self.coursedir.max_file_size and st.st_size > 1000 * self.coursedir.max_file_size:
            self.log.warning("Ignoring file too large %r (see config option CourseDirectory.max_file_size)", rel)
            return False
        return True

    def _copy_file(self, name: str, dir_fd: int, rel: str, uid: int, seen, target: str, found: dict) -> bytes:
        """One file copied through its own descriptor; its ctime taken after the read. Returns what it held
        when it is timestamp.txt (empty otherwise)."""
        fd = self._open(name, dir_fd, _FILE_FLAGS, rel, uid, seen, want=stat.S_IFREG)
        kept = b""
        try:
            with open(target, "wb") as out:
                while chunk := os.read(fd, 1 << 20):
                    out.write(chunk)
                    if rel == "timestamp.txt" and len(kept) < 4096:
                        kept += chunk[:4096]
            found["ctime_ns"] = max(found["ctime_ns"], os.fstat(fd).st_ctime_ns)
        finally:
            os.close(fd)
        return kept
