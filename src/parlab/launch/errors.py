"""The exceptions a launch can raise in the notebook."""
from __future__ import annotations


class LaunchError(RuntimeError):
    """Base class: something went wrong while running code on the ranks."""


class WorkerError(LaunchError):
    """A rank raised an exception (or died) while running the launched code.

    Attributes:
        rank: the rank blamed first.
        remote_traceback: that rank's traceback, as text, with notebook cells
            named as ``Cell In[n]`` (for a rank that died: its last stderr lines).
        exc_type: the name of the exception type raised on the rank (for a
            rank that died: the signal, e.g. "SIGSEGV", or "exit code 3").
        stacks: where the other ranks were when the failure was seen
            (rank -> text); empty when they had already finished.
        failures: every rank that raised, rank -> one-line summary.
        phase: when the blamed rank failed: "init" (forming the process
            group), "setup" (loading the task), "raised" (in the task),
            "result" (sending the result back) or "died" (no Python exception).
        exit_codes: rank -> exit status reported by torchrun (negative: the
            signal), for the ranks that died.
        blamed: the ranks to blame, most likely cause first.
    """

    def __init__(self, message: str, *, rank: int, remote_traceback: str = "",
                 exc_type: str = "", stacks: dict | None = None, failures: dict | None = None,
                 phase: str = "raised", exit_codes: dict | None = None, blamed: tuple = ()):
        super().__init__(message)
        self.rank = rank
        self.remote_traceback = remote_traceback
        self.exc_type = exc_type
        self.stacks = dict(stacks or {})
        self.failures = dict(failures or {})
        self.phase = phase
        self.exit_codes = dict(exit_codes or {})
        self.blamed = tuple(blamed) or (rank,)


class LaunchTimeout(LaunchError, TimeoutError):
    """The launch ran past its ``timeout``; ``.stacks`` maps rank -> Python stack."""

    def __init__(self, message: str, *, timeout: float, stacks: dict | None = None,
                 status: dict | None = None):
        super().__init__(message)
        self.timeout = timeout
        self.stacks = dict(stacks or {})
        self.status = dict(status or {})
