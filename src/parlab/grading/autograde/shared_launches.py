"""Grade every answer of one submission in as few launches as possible.

The sandbox grades a notebook's check calls: every exercise, visible and
hidden cases.  One launch per call costs a cold start each (seconds on a
laptop), so here the calls that need the same world size share one launch.

Sharing must never change a verdict, so:

- A pass is kept if the answer ran in under half its exercise's timeout
  (alone, a single wait longer than that would have timed out).  Before
  each answer every rank reseeds as a fresh launch does and restores
  torch's defaults, and after it the ranks meet at a barrier, so an answer
  neither sees another's random state nor receives its messages.
- A failure is kept only when its answer ran first in its launch.  An answer
  that ran after another one may have met what that answer left behind (a
  send nobody received, say), so it is graded again in a launch of its own.
- When a launch fails, the answer that raised is known (its exception carries
  a note naming its task): it gets its message, and the launch is started
  again without it.  Any other failure (a rank that died, a launch that timed
  out) leaves the launch's answers to one launch each.  (The note needs
  Python 3.11's ``add_note``; on 3.10 every failed shared launch goes that
  way: slower, with the same verdicts.)

A call gets a launch for a world size of its own only once the calls before
it in its test cell have passed (a cell stops at its first failure, so that
launch could only be wasted); until then it rides along in launches that run
anyway.  A blank notebook, whose visible calls all fail, so starts no launch
for its hidden calls' sizes.

``grade_shared`` returns the verdicts it could decide; the sandbox grades the
rest one launch per call (``harness.grade_batch``).
"""
from __future__ import annotations

import re
import time
from collections.abc import Hashable

from ..harness import (BACKEND_KEY, Exercise, judge, launch_failure, launch_tasks, report_of,
                       reported_backend, run_task, task_slot)

#: Added to an exception raised by the task at this index (only in a shared launch).
TASK_NOTE = "parlab shared task "
_NOTE = re.compile(r"\n?" + re.escape(TASK_NOTE) + r"(\d+)")
#: Seconds of launch timeout per answer beyond the first.
PER_EXTRA_TASK = 10.0


def task_of(err: BaseException) -> int | None:
    """The index of the task whose exception ended a shared launch, if it says.

    The note is the last line of the traceback of the rank that raised first;
    text the answer printed or put in its exception cannot stand in for it.
    """
    if getattr(err, "phase", None) != "raised":
        return None
    lines = getattr(err, "remote_traceback", "").rstrip().splitlines()
    found = _NOTE.fullmatch(lines[-1].strip()) if lines else None
    return int(found.group(1)) if found else None


def _on_ranks_shared(tasks: list) -> dict:
    """On each rank: every task as a fresh launch would run it, timed, with a barrier after it."""
    import torch
    import torch.distributed as dist

    from ... import check
    from ...launch.worker import seed_everything

    n, rank = dist.get_world_size(), dist.get_rank()
    backend = str(dist.get_backend())
    out: dict = {BACKEND_KEY: backend}
    with check.judged_on(backend):
        for key, ex, answer, cases in tasks:
            seed_everything(rank)  # as a launch with seed=0 (harness.launch_tasks) starts rank `rank`
            torch.set_default_dtype(torch.float32)
            torch.set_grad_enabled(True)
            start = time.perf_counter()
            out[task_slot(key)] = run_task(ex, answer, cases, n, False, f"{TASK_NOTE}{task_slot(key)}")
            out[task_slot(key)]["seconds"] = time.perf_counter() - start
            dist.barrier()
    return out


def without_notes(text: str) -> str:
    return _NOTE.sub("", text)


def grade_shared(items: list[tuple[Hashable, str, Exercise, object, bool]], *,
                 after: dict | None = None, backend: str | None = None,
                 deadline: float | None = None) -> dict:
    """{key: message or None} for the items ``(key, name, exercise, answer, hidden)`` it could decide.

    ``name`` is the answer's name, for messages; ``key`` tells items apart.
    ``after`` maps a key to the key graded before it in the same test cell:
    once that one has failed, this one is moot and is not run.  No launch
    starts that could run past ``deadline`` (``time.monotonic()``); what is
    left then stays undecided.
    """
    state = _State(after or {}, deadline)
    # a pass counts only once the answer passed on every world size it is graded on
    every_size = {key: {n for n, _ in ex.sets(hidden)} for key, _, ex, _, hidden in items}
    to_run = {key: set(sizes) for key, sizes in every_size.items()}
    while sizes := {n for key, left in to_run.items() if state.open(key) and _ready(key, state, every_size)
                    for n in left}:
        # the widest launch that a call whose earlier calls have all passed still needs; the other
        # open calls on that many ranks ride along (a launch costs its start, not its answers),
        # so a call after one that fails costs no launch of its own
        n = max(sizes)
        tasks = [(key, name, ex, answer, tuple(cases)) for key, name, ex, answer, hidden in items
                 if state.open(key) and n in to_run[key] for m, cases in ex.sets(hidden) if m == n]
        for key, *_ in tasks:
            to_run[key].discard(n)
        while tasks:
            tasks = [t for t in _one_launch(tasks, n, backend, state) if state.open(t[0])]
    return {k: v for k, v in state.decided.items() if k not in state.undecided
            and (v is not None or state.passed_on.get(k) == every_size[k])}


def _ready(key, state: "_State", every_size: dict) -> bool:
    """Whether every call before ``key`` in its cell has passed on all of its world sizes."""
    while (key := state.after.get(key)) is not None:
        if state.passed_on.get(key) != every_size.get(key):
            return False
    return True


class _State:
    """What the shared launches have decided so far."""

    def __init__(self, after: dict, deadline: float | None = None):
        self.after = after
        self.deadline = deadline
        self.decided: dict = {}   # key -> message, or None for an answer that passed every size so far
        self.undecided: set = set()  # keys left to a launch of their own
        self.passed_on: dict = {}    # key -> the world sizes it passed on

    def open(self, key) -> bool:
        """Whether ``key`` still needs running: not failed, not undecided, and not moot."""
        while key is not None:
            if key in self.undecided or self.decided.get(key) is not None:
                return False
            key = self.after.get(key)
        return True


def _one_launch(tasks: list, n: int, backend, state: _State) -> list:
    """Run ``tasks`` in one launch and record what it decides; the tasks still to run."""
    decided, undecided = state.decided, state.undecided
    on_ranks = [((f"{i}",), ex, answer, cases) for i, (_, _, ex, answer, cases) in enumerate(tasks)]
    wait = max(ex.timeout for _, _, ex, _, _ in tasks) + PER_EXTRA_TASK * (len(tasks) - 1)
    if state.deadline is not None and time.monotonic() + wait > state.deadline:
        undecided.update(t[0] for t in tasks)  # no time to share: each is graded alone
        return []
    try:
        per_rank = launch_tasks(_on_ranks_shared, (on_ranks,), nproc=n, timeout=wait,
                           isolate=True, backend=backend)
    except Exception as err:  # noqa: BLE001 - a LaunchError: one answer failed, or the launch did
        culprit = task_of(err)
        if culprit is None or culprit >= len(tasks):
            if len(tasks) == 1:
                decided[tasks[0][0]] = _failure(err, tasks[0], n)
            else:
                undecided.update(t[0] for t in tasks)
            return []
        if culprit == 0:
            decided[tasks[0][0]] = _failure(err, tasks[0], n)
        else:
            undecided.add(tasks[culprit][0])
        return tasks[:culprit] + tasks[culprit + 1:]
    used = reported_backend(per_rank)
    for i, (key, name, ex, _, cases) in enumerate(tasks):
        reports = [report_of(out, f"{i}") for out in per_rank]
        message = judge(ex, name, n, cases, reports, used)
        seconds = [r.get("seconds", 0.0) for r in reports if isinstance(r, dict)]
        slow = any(not isinstance(t, (int, float)) or t > ex.timeout / 2 for t in seconds)
        if message is None and slow:
            undecided.add(key)  # alone, a wait that long could have timed out: grade it alone
        elif message is None:
            decided.setdefault(key, None)  # passed at this size; the next size may still fail it
            state.passed_on.setdefault(key, set()).add(n)
        elif i == 0:
            decided[key] = message
        else:
            undecided.add(key)
    return []


def _failure(err: BaseException, task: tuple, n: int) -> str:
    """The message a launch of this task alone would have given."""
    _, name, ex, answer, cases = task
    return without_notes(launch_failure(err, [((ex.key, name), ex, answer, cases)], n))
