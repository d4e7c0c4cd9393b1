"""Turn what a launch left behind into the exception and message the notebook shows.

``explain(facts)`` is a pure function: the job collects the facts (error
records, exit codes, stacks, stderr tails, timeouts) and this module decides
whom to blame and what to say, so every rule here is testable without
starting a process.
"""
from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field

from . import stacks as _stacks
from .errors import LaunchError, LaunchTimeout, WorkerError
from .failures import classify, describe_exit

NOT_STARTED = "not started yet (still importing) or not responding"
_CRASH = "Fatal Python error"


@dataclass
class Facts:
    nproc: int
    timeout: float = 120.0
    debug: bool = False
    labels: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)      # rank -> error record (see jobdir)
    returned: set = field(default_factory=set)      # ranks that wrote a result
    dead: list = field(default_factory=list)        # ranks gone without a result or an error
    stacks: dict = field(default_factory=dict)      # rank -> raw faulthandler dump (live ranks)
    stderr: dict = field(default_factory=dict)      # rank -> last part of a dead rank's stderr
    exit_codes: dict = field(default_factory=dict)  # rank -> torchrun's exit code (negative: signal)
    root_cause: int | None = None                   # torchrun's "first observed failure"
    agent_code: int | None = None                   # torchrun's own exit status, None if running
    agent_pid: int = 0
    agent_log: str = ""
    timed_out: bool = False
    subject: str = "the launch"                     # what timed out: "the launch", or a warm "cell"


def parse_agent_log(log: str) -> tuple[dict, int | None]:
    """(rank -> exit code, root-cause rank) from torchrun's failure summary."""
    pattern = re.compile(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")
    codes = {int(rank): int(code) for rank, code in pattern.findall(log)}
    root = None
    if "Root Cause" in log:
        found = pattern.search(log.split("Root Cause", 1)[1])
        root = int(found.group(1)) if found else None
    return codes, root


_STOPPED_BY_OTHERS = {-signal.SIGTERM: 3, -signal.SIGINT: 3, -signal.SIGKILL: 2}


def blame_order(dead: list, codes: dict, stderr: dict, root_cause: int | None = None) -> list:
    """Dead ranks, the likeliest cause first.

    When one rank fails, torchrun stops the others with SIGTERM (SIGKILL
    after a grace period).  So a rank that crashed (faulthandler's report in
    its stderr, another signal, a non-zero exit) comes before a rank whose
    status is unknown, which comes before SIGKILL, then SIGTERM; timing plays
    no part.  Ties go to torchrun's first observed failure, then the lowest rank.
    """
    def key(r):
        code = codes.get(r)
        crashed = _CRASH in stderr.get(r, "")
        if crashed or (code is not None and code not in _STOPPED_BY_OTHERS):
            tier = 0
        elif code is None:
            tier = 1
        else:
            tier = _STOPPED_BY_OTHERS[code]
        return tier, r != root_cause, r
    return sorted(dead, key=key)


def stderr_tail(text: str, labels: dict, lines: int = 15) -> str:
    """The useful end of a dead rank's stderr: the crash report, with what the library said first."""
    crash = text.rfind(_CRASH)
    if crash < 0:
        return "\n".join(text.splitlines()[-lines:])
    before = [x for x in text[:crash].splitlines() if x.strip()][-4:]  # e.g. gloo's enforce message
    dump = text[crash:]
    return "\n".join(before + [dump.splitlines()[0], _stacks.format_dump(dump, labels)]).rstrip()


def status(f: Facts) -> dict:
    """rank -> one line: what each rank was doing when the launch ended."""
    out = {}
    for r in range(f.nproc):
        if r in f.errors:
            first_line = (f.errors[r]["message"].splitlines() or [""])[0]
            short = first_line if len(first_line) <= 100 else first_line[:97] + "..."
            out[r] = f"raised {f.errors[r]['exc_type']}" + (f": {short}" if short else "")
        elif r in f.returned:
            out[r] = "returned"
        elif r in f.dead:
            out[r] = "died (" + describe_exit(f.exit_codes.get(r))[0] + ")"
        elif r in f.stacks:
            out[r] = _stacks.where(_stacks.main_thread_frames(f.stacks[r]), f.labels)
        else:
            out[r] = NOT_STARTED
    return out


def _formatted_stacks(f: Facts) -> dict:
    return {r: _stacks.format_dump(d, f.labels) for r, d in f.stacks.items()}


def _failures(f: Facts) -> dict:
    return {k: f"{e['exc_type']}: {e['message']}" for k, e in f.errors.items()}


def _others(f: Facts, blamed: int) -> list[str]:
    others = {k: v for k, v in status(f).items() if k != blamed}
    return ["", "The other ranks:"] + [f"  rank {k}: {v}" for k, v in sorted(others.items())] if others else []


def _died(f: Facts) -> WorkerError:
    order = blame_order(f.dead, f.exit_codes, f.stderr, f.root_cause)
    r = order[0]
    how, exc_type = describe_exit(f.exit_codes.get(r))
    tail = stderr_tail(f.stderr.get(r, ""), f.labels)
    lines = [f"rank {r} died without raising a Python exception: {how}.",
             ("Where it crashed:" if _CRASH in tail else "Its last lines of stderr:") if tail
             else "It printed nothing to stderr.", tail]
    lines += _others(f, r)
    return _with_hint(f, "\n".join(x for x in lines if x is not None).rstrip(), dict(
        rank=r, remote_traceback=tail, exc_type=exc_type, stacks=_formatted_stacks(f),
        failures=_failures(f), phase="died", exit_codes={k: f.exit_codes[k] for k in f.dead if k in f.exit_codes},
        blamed=tuple(order)))


def _raised(f: Facts) -> WorkerError:
    first = min(f.errors.values(), key=lambda e: e["time"])
    r = first["rank"]
    verb = "could not start" if first["kind"] in ("init", "setup") else "failed"
    lines = [f"rank {r} {verb}: {first['exc_type']}: {first['message']}".rstrip(), "",
             f"Traceback from rank {r}:", first["traceback"].rstrip()]
    lines += _others(f, r)
    later = sorted((e for e in f.errors.values() if e["rank"] != r), key=lambda e: e["time"])
    return _with_hint(f, "\n".join(lines), dict(
        rank=r, remote_traceback=first["traceback"], exc_type=first["exc_type"],
        stacks=_formatted_stacks(f), failures=_failures(f), phase=first["kind"],
        blamed=(r, *(e["rank"] for e in later))))


def _with_hint(f: Facts, message: str, fields: dict) -> WorkerError:
    draft = WorkerError(message, **fields)
    tip = hint(draft, f)
    return WorkerError(message + ("\n\n" + tip if tip else ""), **fields)


def hint(err: WorkerError, f: Facts) -> str:
    """A next step for the student, chosen by the kind of failure."""
    kind = classify(err).kind
    text = err.failures.get(err.rank, "") + "\n" + err.remote_traceback
    if kind == "hang" and ("Timed out" in text or "timed out" in text):
        tip = ("Hint: a collective timed out, so the ranks were waiting for each other: usually one "
               "rank skipped a collective or called a different one.")
        return tip if f.debug else tip + " Rerun with launch(..., debug=True) to name the mismatch."
    if kind == "hang":
        return ("Hint: another rank left (it returned or crashed) while this rank waited for it: every "
                "rank must call the same collectives, and every send needs its matching recv, in the "
                "same order.")
    if kind == "mismatch":
        return ("Hint: a message and the buffer that received it differ in size or dtype: the sender "
                "and the receiver must agree on both (or the ranks called different collectives).")
    if "default process group twice" in text:
        return ("Hint: parlab.launch has already set up the process group on every rank; remove "
                "init_process_group (and destroy_process_group) from the function.")
    if "EOFError" in err.exc_type and "input" in err.remote_traceback:
        return "Hint: ranks have no keyboard: input() cannot work there. Pass values as arguments."
    if err.phase == "setup" and "No module named" in text:
        return ("Hint: the ranks could not import something the function needs. Define it in the "
                "notebook or in a module on the kernel's sys.path.")
    return ""


def _timed_out(f: Facts) -> LaunchTimeout:
    st = status(f)
    unfinished = [r for r in range(f.nproc) if r not in f.errors and r not in f.returned]
    lines = [f"{f.subject} did not finish within {f.timeout:g} s. Where each rank was:"]
    lines += [f"  rank {r}: {text}" for r, text in st.items()]
    starting = [r for r, v in st.items() if v in (_stacks.STARTING_UP, NOT_STARTED)]
    if starting:  # a rank still starting holds up any collective of the others, so say that first
        which = "The ranks" if len(starting) == len(unfinished) else \
            f"Rank{'s' if len(starting) > 1 else ''} {', '.join(map(str, starting))}"
        lines += ["", f"{which} had not finished starting: a start takes about 1-2 s forked from the "
                      f"kernel's fork server and 4-10 s cold, more when many launches share the CPU cores "
                      f"or the task imports large modules. Raise timeout= (it was {f.timeout:g} s)."]
        return LaunchTimeout("\n".join(lines), timeout=f.timeout, stacks={}, status=st)
    if any(v == "returned" for v in st.values()):
        lines += ["", "Some ranks returned while others wait: the ranks probably disagree about "
                      "which collectives to call (a collective inside `if rank == ...`, or a "
                      "different number of calls per rank)."]
    if not f.debug:
        lines += ["Rerun with launch(..., debug=True) to have torch name mismatched collectives "
                  "at once; raise timeout= if the work is merely slow."]
    return LaunchTimeout("\n".join(lines), timeout=f.timeout, stacks=_formatted_stacks(f), status=st)


def explain(f: Facts) -> LaunchError | None:
    """The exception that describes how the launch ended, or None when every rank returned.

    A rank that fails after writing its result (in torch's shutdown, say, when
    a peer closed its connection first) lost nothing: ``late_exit`` words a
    note for it and the results stand.
    """
    missing = [r for r in range(f.nproc) if r not in f.returned and r not in f.errors]
    agent_killed = f.agent_code is not None and f.agent_code < 0
    if agent_killed and not f.errors:  # torchrun itself was killed: its ranks died with it
        return LaunchError(f"torchrun (pid {f.agent_pid}) was killed by signal {-f.agent_code} "
                           f"({describe_exit(f.agent_code)[1]}) while rank(s) {missing} were running; "
                           "they were stopped with it. Run the cell again.")
    if f.dead and not agent_killed:
        return _died(f)
    if f.errors:
        return _raised(f)
    if f.timed_out:
        return _timed_out(f)
    if not missing:  # every rank delivered its result; a failure after that lost nothing
        return None
    who = f"rank(s) {missing} never finished" if missing else "every rank finished"
    return LaunchError(f"torchrun exited with code {f.agent_code} and {who}, but no rank reported an "
                       "error or died. torchrun's last lines:\n" + "\n".join(f.agent_log.splitlines()[-25:]))


def late_exit(f: Facts) -> str | None:
    """A note for ranks that ended badly after every rank had delivered its result."""
    if f.agent_code in (0, None) or f.errors or len(f.returned) < f.nproc:
        return None
    codes = ", ".join(f"rank {r}: {describe_exit(c)[1]}" for r, c in sorted(f.exit_codes.items())) \
        or f"torchrun exit code {f.agent_code}"
    return (f"parlab: every rank returned its result, then the ranks did not all shut down cleanly "
            f"({codes}). The results are complete and kept.")
