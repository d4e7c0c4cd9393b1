"""What kind of failure ended a launch: the one place that reads error text.

The launcher (for its hints and its one retry) and the graders (for their
messages) ask ``classify(err)`` instead of matching strings themselves.

Kinds:

- ``hang``: the ranks waited for each other: the launch timed out, a
  collective or receive hit the process-group timeout, or a rank waited for
  a peer that had already left (gloo then says "Connection closed by peer").
- ``died``: a rank ended without a Python exception (a signal, ``os._exit``).
- ``mismatch``: gloo found that a message and its receive buffer differ in
  size or dtype (an exception, or an abort from gloo's enforce checks).
- ``transient``: the ranks could not connect while the group was forming,
  before any user code ran; the launcher retries these once.
- ``raised``: user code raised a Python exception on a rank.
- ``interrupted``: the stop button (KeyboardInterrupt).
- ``other``: anything else.

A failure is classified by its first cause.  When a rank dies or leaves,
the survivors report "Connection closed by peer" or "Connection reset"; that
is a consequence and never decides the kind by itself.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass

from .errors import LaunchError, LaunchTimeout, WorkerError

#: Connection errors while the process group forms; worth one more start.
TRANSIENT_MARKERS = ("connectFullMesh", "Connection closed by peer", "Connection refused",
                     "Connect timeout", "Connection reset by peer")
#: gloo's words for a message that does not fit its receive buffer.
MISMATCH_MARKERS = ("doesn't match expected size", "Received data size", "op.preamble.length <= op.nbytes")
#: A wait that ran into the process group's timeout.
TIMEOUT_MARKERS = ("Timed out", "timed out", "DistBackendError: Wait timeout", "Watchdog caught collective")
#: What survivors say when a peer went away (a consequence, not a cause).
PEER_GONE_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Connection reset",
                     "Broken pipe")


@dataclass(frozen=True)
class Failure:
    kind: str                # "hang" | "died" | "mismatch" | "transient" | "raised" | "interrupted" | "other"
    ranks: tuple[int, ...]   # the ranks to blame, most likely first; () if unknown
    detail: str              # one line in plain words


def transient_reason(phase: str, text: str) -> str:
    """The marker that makes a failure while the group was forming worth a retry, or ""."""
    if phase != "init":
        return ""
    return next((m for m in TRANSIENT_MARKERS if m in text), "")


def _has(text: str, markers) -> bool:
    return any(m in text for m in markers)


def describe_exit(code) -> tuple[str, str]:
    """(sentence, short name) for a rank's exit status; negative codes are signals."""
    if code is None:
        return "its exit status is unknown", "died"
    if code >= 0:
        return (f"it exited with code {code} (os._exit or sys.exit outside Python's error handling)",
                f"exit code {code}")
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    why = {"SIGSEGV": "a crash in C/C++ code, e.g. a bad pointer or tensor access",
           "SIGKILL": "often the out-of-memory killer",
           "SIGABRT": "an abort inside a library, e.g. gloo on mismatched message sizes",
           "SIGBUS": "a crash in C/C++ code"}.get(name, "")
    return f"it was killed by {name}" + (f" ({why})" if why else ""), name


def about_rank(sentence: str, rank: int) -> str:
    """``describe_exit``'s sentence about "it", said of rank ``rank``."""
    if sentence.startswith("its "):
        return f"rank {rank}'s " + sentence[4:]
    if sentence.startswith("it "):
        return f"rank {rank} " + sentence[3:]
    return sentence


def _first_line(text: str) -> str:
    line = next((x.strip() for x in text.splitlines() if x.strip()), "")
    return line if len(line) <= 120 else line[:117] + "..."


def _classify_worker_error(err: WorkerError) -> Failure:
    ranks = err.blamed
    r = err.rank
    summary = err.failures.get(r, f"{err.exc_type}")
    text = f"{summary}\n{err.remote_traceback}"
    if err.phase == "died":
        how = about_rank(describe_exit(err.exit_codes.get(r))[0], r)
        if err.exc_type == "SIGABRT" and _has(text, MISMATCH_MARKERS + ("gloo::EnforceNotMet",)):
            return Failure("mismatch", ranks, f"rank {r} was aborted by gloo: a message and its "
                                              "receive buffer differ in size or dtype")
        return Failure("died", ranks, how.split(" (")[0])
    reason = transient_reason(err.phase, text)
    if reason:
        return Failure("transient", ranks, f"rank {r} could not connect while the group formed ({reason})")
    if _has(text, MISMATCH_MARKERS):
        return Failure("mismatch", ranks, f"rank {r} received a message whose size or dtype differs "
                                          "from its receive buffer")
    if _has(text, TIMEOUT_MARKERS):
        return Failure("hang", ranks, f"rank {r} timed out waiting for the other ranks")
    if _has(text, PEER_GONE_MARKERS):
        return Failure("hang", ranks, f"rank {r} was waiting for a rank that had already left "
                                      "(returned, crashed or was stopped)")
    if err.phase in ("raised", "init", "setup", "result"):
        return Failure("raised", ranks, f"rank {r} raised {_first_line(summary) or err.exc_type}")
    return Failure("other", ranks, _first_line(str(err)))


def classify(err: BaseException) -> Failure:
    """The kind of failure ``err`` (from ``parlab.launch``) reports, whom to blame, in one line."""
    if isinstance(err, KeyboardInterrupt):
        return Failure("interrupted", (), "the launch was interrupted (stop button or Ctrl-C)")
    if isinstance(err, LaunchTimeout):
        waiting = tuple(r for r, s in sorted(err.status.items()) if s != "returned")
        return Failure("hang", waiting, f"the launch did not finish within {err.timeout:g} s")
    if isinstance(err, WorkerError):
        return _classify_worker_error(err)
    if isinstance(err, LaunchError):
        return Failure("other", (), _first_line(str(err)))
    return Failure("other", (), f"{type(err).__name__}: {_first_line(str(err))}")
