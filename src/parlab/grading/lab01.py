"""Autograder checks for Lab 01: backends and collectives.

Each ``check_*`` function runs the student's function on several ranks with
``parlab.launch`` (one launch per world size, every test case looped inside
the ranks), compares what each rank returned with single-process math on the
same inputs, and raises ``AssertionError`` with a hint in the student's terms
when something is off.  Passing returns None and prints one line.

    check_allreduce_from_rs_ag(my_all_reduce)               # visible tests
    check_allreduce_from_rs_ag(my_all_reduce, hidden=True)  # other sizes/dtypes

Inputs are made from a seed per (case, rank), so the parent process can
rebuild every rank's input and add them up itself: the reference never uses
a collective.  Float32/64 inputs are random normals; half precisions and
integers get small whole numbers, whose sums are exact in every dtype.

``run_exercises`` evaluates many functions in one launch per world size; the
test suite uses it to grade a batch of wrong answers cheaply.
"""
from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import check
from . import assert_number
from ..cost import busbw as _ref_busbw
from ..cost import algbw as _ref_algbw
from ..errors import LaunchError, LaunchTimeout

__all__ = ["check_allreduce_from_rs_ag", "check_ring_allreduce", "check_tree_broadcast",
           "check_bandwidths", "run_exercises", "make_input", "Case", "TIMEOUT"]

#: Seconds per launch.  The process-group timeout is half of it, so a
#: deadlocked answer fails after about 30 s instead of hanging the grader.
TIMEOUT = 60.0


@dataclass(frozen=True)
class Case:
    """One test input: a shape, a dtype name and (for broadcast) a root."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    root: int | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def describe(self, n: int) -> str:
        root = "" if self.root is None else f", root {self.root}"
        return f"shape {self.shape} (numel {self.numel}), {self.dtype}{root}, world_size {n}"


def make_input(case: Case, rank: int, salt: int = 0) -> torch.Tensor:
    """Rank ``rank``'s input for ``case`` (the same on every process that asks)."""
    g = torch.Generator().manual_seed(7919 * salt + 104729 * rank + 17)
    dtype = getattr(torch, case.dtype)
    if dtype in (torch.float32, torch.float64):
        return torch.randn(case.shape, generator=g, dtype=torch.float64).to(dtype)
    return torch.randint(-8, 9, case.shape, generator=g).to(dtype)


# ---------------------------------------------------------------- test sets
# (world_size, cases).  Visible first; cases whose numel divides by the world
# size come before those that do not, so a remainder bug is easy to name.
_AR_VISIBLE = [(4, [Case((16,)), Case((4, 6)), Case((10,)), Case((3, 5))])]
_AR_HIDDEN = [(3, [Case((1,)), Case((2,)), Case((7,)), Case((13,)), Case((5, 3), "float64"),
                   Case((11,), "int64"), Case((9,), "bfloat16"), Case((13,), "float16"),
                   Case((2, 3, 4), "int32")])]
_RING_HIDDEN = _AR_HIDDEN + [(2, [Case((1,)), Case((5,)), Case((13,), "float64"),
                                  Case((4, 3), "int64")])]
_TREE_VISIBLE = [(4, [Case((5,), root=r) for r in range(4)]
                  + [Case((2, 3), "int64", root=r) for r in (3, 1)])]
_TREE_HIDDEN = [(3, [Case((7,), "float64", root=r) for r in range(3)]
                 + [Case((1,), "bfloat16", root=2), Case((4, 4), "int32", root=1)])]

_EXERCISES = {
    # name: (what the function computes, visible sets, hidden sets, hint on a hang)
    "rs_ag": ("all_reduce", _AR_VISIBLE, _AR_HIDDEN,
              "every rank must call reduce_scatter and all_gather the same number of times, "
              "with the same sizes"),
    "ring": ("all_reduce", _AR_VISIBLE, _RING_HIDDEN,
             "a ring where every rank first calls a blocking dist.send waits forever: gloo's "
             "send only completes once the neighbour posts the matching recv, and that "
             "neighbour is itself stuck in send. Post both with dist.isend/dist.irecv and wait "
             "on both, or let even ranks send first and odd ranks receive first"),
    "tree": ("broadcast", _TREE_VISIBLE, _TREE_HIDDEN,
             "some rank waits for a message nobody sends: check that each child receives from "
             "exactly the parent that sends to it, for every root and world size"),
}

#: What the surviving ranks report when a peer aborted in the middle of a message.
_DIED_MID_MESSAGE = ("expected size", "Received data size", "Connection closed", "Connection reset",
                     "SIGABRT")

_SIZE_HINT = ("a rank died in the middle of a collective or send/recv (its stderr is shown "
              "above). Here that usually means gloo aborted because a message and its receive "
              "buffer differ in size: the "
              "sender's chunk and the receiver's buffer must have the same number of elements and "
              "the same dtype (allocate buffers with dtype=x.dtype) "
              "(compute chunk boundaries the same way on every rank; with uneven chunks, size the "
              "buffer for the chunk that arrives, not the one you send)")


# ---------------------------------------------------------------- on the ranks
# A task is (key, function, kind, cases); kind is "all_reduce" or "broadcast".
def _on_ranks(tasks: list, catch: bool) -> dict:
    """Run each task's function on its cases; return {key: [result per case] or error text}.

    After each case the ranks agree (one tiny all_reduce) whether any of them
    got it wrong, and then all stop that function together: a wrong answer is
    reported on its first wrong case, before a later case can crash it.
    """
    from ..runtime import device

    rank, n = dist.get_rank(), dist.get_world_size()
    out: dict = {}
    for key, fn, kind, cases in tasks:
        results = []
        try:
            for i, case in enumerate(cases):
                x = make_input(case, rank, salt=i).to(device())
                got = fn(x, case.root) if kind == "broadcast" else fn(x)
                if isinstance(got, torch.Tensor):
                    got = got.detach().cpu().clone()
                results.append(got)
                wrong = torch.tensor([0.0 if _right(got, _expected(case, n, i, kind)[0]) else 1.0],
                                     device=device())
                dist.all_reduce(wrong, op=dist.ReduceOp.MAX)
                if wrong.item():
                    break
        except Exception as exc:  # noqa: BLE001 - only in batch mode; see run_exercises
            if not catch:
                if hasattr(exc, "add_note"):  # Python 3.11+: name the case in the traceback
                    exc.add_note(f"(while grading case {case.describe(n)})")
                raise
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            results = f"raised {last} on case {case.describe(n)}:\n" + traceback.format_exc(limit=-3)
        out[key] = results
    return out


def _right(got, exp: torch.Tensor) -> bool:
    return (isinstance(got, torch.Tensor) and got.shape == exp.shape
            and got.dtype.is_floating_point == exp.dtype.is_floating_point
            and bool(_close(got, exp).all()))


# ---------------------------------------------------------------- in the parent
def _expected(case: Case, n: int, i: int, kind: str) -> list[torch.Tensor]:
    """What every rank should hold: the sum of all inputs, or the root's input."""
    xs = [make_input(case, r, salt=i) for r in range(n)]
    if kind == "broadcast":
        return [xs[case.root]] * n
    total = torch.stack([x.to(torch.float64) for x in xs]).sum(0)
    return [total.to(xs[0].dtype)] * n


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _close(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    rtol, atol = check.tolerances(b.dtype)
    a, b = a.to(torch.float64), b.to(torch.float64)
    return (a - b).abs() <= atol + rtol * b.abs()


def _diagnose(kind: str, case: Case, n: int, i: int, got: list, passed: list[Case]) -> str:
    """A guess at the mistake behind a wrong result, in the student's terms."""
    xs = [make_input(case, r, salt=i) for r in range(n)]
    exp = _expected(case, n, i, kind)[0]
    for r, g in enumerate(got):
        if isinstance(g, torch.Tensor) and g.numel() < case.numel:
            return (f"Rank {r} returned {g.numel()} of {case.numel} elements: only its own chunk? "
                    "After reducing, every rank needs every chunk back (the all-gather phase).")
    if kind == "broadcast":
        if case.root != 0 and any(c.root == 0 for c in passed):
            return ("Root 0 works but root {} does not: does your tree assume the root is rank 0? "
                    "Number the ranks relative to the root, vrank = (rank - root) % world_size, "
                    "and map back with (vrank + root) % world_size.".format(case.root))
        stuck = [r for r, g in enumerate(got) if isinstance(g, torch.Tensor)
                 and g.shape == xs[r].shape and r != case.root and bool(_close(g, xs[r]).all())]
        if stuck:
            pow2 = "" if n & (n - 1) == 0 else (f" world_size {n} is not a power of two: does "
                                                "your tree only reach every rank when it is?")
            verb = "still holds its" if len(stuck) == 1 else "still hold their"
            return (f"{_ranks(stuck)} {verb} own input: the broadcast never reached "
                    f"{'it' if len(stuck) == 1 else 'them'} (or you returned the input instead of "
                    f"what you received).{pow2}")
        return ""
    if case.numel % n and all(c.numel % n == 0 for c in passed) and passed:
        return (f"Every case with numel divisible by world_size passed, but numel {case.numel} "
                f"leaves a remainder of {case.numel % n}: did you forget the last chunk when numel "
                "is not divisible by world_size? (Pad to a multiple of world_size, or use uneven chunks.)")
    for r, g in enumerate(got):
        if not isinstance(g, torch.Tensor) or g.shape != exp.shape:
            continue
        bad = ~_close(g, exp)
        if not bool(bad.any()):
            continue
        if bool(_close(g, xs[r])[bad].all()):
            return (f"On rank {r}, the wrong elements still hold rank {r}'s own input: that part "
                    "was never reduced or never gathered back (is a phase missing or cut short?).")
        if _partial_sums(g, xs)[bad].all():
            return (f"On rank {r}, each wrong element is the sum of only some ranks' inputs: a "
                    "phase is cut short, or a chunk is passed on before it is complete. Each "
                    f"phase of a ring takes world_size - 1 = {n - 1} steps; after the "
                    "reduce-scatter, rank r holds the complete sum of chunk (r + 1) % world_size, "
                    "so the all-gather starts by sending that one.")
    return ""


def _partial_sums(g: torch.Tensor, xs: list[torch.Tensor]) -> torch.Tensor:
    """True where ``g`` equals the sum over some proper subset of the ranks' inputs."""
    n = len(xs)
    if n > 8:
        return torch.zeros(g.shape, dtype=torch.bool)
    stack = torch.stack([x.to(torch.float64) for x in xs])
    hit = torch.zeros(g.shape, dtype=torch.bool)
    for mask in range(1, 2**n - 1):
        pick = torch.tensor([(mask >> j) & 1 for j in range(n)], dtype=torch.float64)
        hit |= _close(g, torch.tensordot(pick, stack, dims=1).to(xs[0].dtype))
    return hit


def _grade(kind: str, name: str, n: int, cases: list[Case], per_rank: list) -> str | None:
    """Compare the ranks' results with the reference; None or a message in the student's terms."""
    raised = [(r, out) for r, out in enumerate(per_rank) if isinstance(out, str)]
    if raised:
        r, text = raised[0]
        first, _, rest = text.partition("\n")
        return f"{name} {first.rstrip(':')} (rank {r}):\n{rest}"
    passed: list[Case] = []
    for i, case in enumerate(cases[:min(len(out) for out in per_rank)]):
        got = [out[i] for out in per_rank]
        exp = _expected(case, n, i, kind)
        odd = [(r, g.dtype) for r, g in enumerate(got) if isinstance(g, torch.Tensor)
               and g.dtype != exp[0].dtype]
        if odd:
            return (f"{name} is wrong for {case.describe(n)}: rank {odd[0][0]} returned dtype "
                    f"{odd[0][1]}, but the input was {exp[0].dtype}. The result must keep the "
                    "input's dtype: create buffers with dtype=x.dtype (torch.zeros and "
                    "torch.empty default to float32), or use torch.zeros_like/empty_like.")
        rtol, atol = check.tolerances(exp[0].dtype)
        try:
            check.assert_collective_result(got, exp, op_name=kind, rtol=rtol, atol=atol)
        except AssertionError as err:
            hint = _diagnose(kind, case, n, i, got, passed)
            return (f"{name} is wrong for {case.describe(n)}.\n{err}"
                    + (f"\nHint: {hint}" if hint else ""))
        passed.append(case)
    return None


def run_exercises(batch: Mapping[str, Mapping[str, Callable]], *, hidden: bool = False,
                  timeout: float = TIMEOUT, catch: bool = True) -> dict[tuple[str, str], str | None]:
    """Grade many functions, ``{exercise: {name: fn}}`` with exercise "rs_ag", "ring" or "tree".

    Returns {(exercise, name): None if it passed, else the failure message}.
    Everything shares one launch per world size.  With ``catch`` an exception
    in one function is recorded instead of ending the launch (one that raises
    on only some ranks then leaves the others waiting until the process-group
    timeout).  A hang or crash of the launch raises ``AssertionError``.
    """
    report = {(ex, name): None for ex, fns in batch.items() for name in fns}
    sizes = sorted({n for ex in batch for n, _ in _EXERCISES[ex][2 if hidden else 1]}, reverse=True)
    for n in sizes:
        tasks = [((ex, name), fn, _EXERCISES[ex][0], cases)
                 for ex, fns in batch.items() for name, fn in fns.items()
                 for m, cases in _EXERCISES[ex][2 if hidden else 1]
                 if m == n and report[(ex, name)] is None]
        if not tasks:
            continue
        try:
            per_rank = _launch(_on_ranks, args=(tasks, catch), nproc=n, timeout=timeout)
        except LaunchError as err:
            text = str(err) + " ".join(getattr(err, "failures", {}).values())
            hang = isinstance(err, LaunchTimeout) or "Timed out" in text
            names = ", ".join(name for (_, name), *_ in tasks)
            what = "did not finish: the ranks waited for each other" if hang else "failed"
            hints = {_EXERCISES[ex][3] for (ex, _), *_ in tasks} if hang else set()
            if not hang and any(s in text for s in _DIED_MID_MESSAGE):
                hints = {_SIZE_HINT}  # a rank died mid-message: most likely gloo's abort
            tried = "; ".join(sorted({c.describe(n).rsplit(", world_size", 1)[0]
                                      for *_, cases in tasks for c in cases}))
            raise AssertionError(
                f"{names} {what} on {n} ranks, in one of these cases: {tried}.\n"
                + "".join(f"Hint: {h}.\n" for h in hints) + f"\n{err}") from None
        for key, _, kind, cases in tasks:
            report[key] = _grade(kind, key[1], n, cases, [out[key] for out in per_rank])
    return report


def _launch(fn, **kw):
    from ..launcher import launch

    return launch(fn, **kw)


def _check(exercise: str, fn: Callable, hidden: bool, timeout: float) -> None:
    if not callable(fn):
        raise AssertionError(f"expected your function, got a {type(fn).__name__}")
    name = getattr(fn, "__name__", "your function")
    batch = {exercise: {name: fn}}
    msg = run_exercises(batch, hidden=hidden, timeout=timeout, catch=False)[(exercise, name)]
    if msg:
        raise AssertionError(msg)
    sets = _EXERCISES[exercise][2 if hidden else 1]
    sizes = " and ".join(str(n) for n, _ in sets)
    print(f"{name}: {sum(len(c) for _, c in sets)} {'hidden' if hidden else 'visible'} "
          f"cases passed on {sizes} ranks")


# ---------------------------------------------------------------- public checks
def check_allreduce_from_rs_ag(fn: Callable, *, hidden: bool = False,
                               timeout: float = TIMEOUT) -> None:
    """Exercise 1: ``fn(x)`` returns the sum of ``x`` over all ranks via reduce-scatter + all-gather."""
    _check("rs_ag", fn, hidden, timeout)


def check_ring_allreduce(fn: Callable, *, hidden: bool = False, timeout: float = TIMEOUT) -> None:
    """Exercise 2: ``fn(x)`` returns the sum of ``x`` over all ranks, built from point-to-point."""
    _check("ring", fn, hidden, timeout)


def check_tree_broadcast(fn: Callable, *, hidden: bool = False, timeout: float = TIMEOUT) -> None:
    """Exercise 3: ``fn(x, root)`` returns root's ``x`` on every rank."""
    _check("tree", fn, hidden, timeout)


# ---------------------------------------------------------------- exercise 4
# (numel, dtype, seconds, world_size); sizes in bytes as nccl-tests counts them.
_BW_VISIBLE = [(3 * 2**18, torch.float64, 0.5, 2), (2**20, torch.float32, 0.01, 4),
               (1000, torch.bfloat16, 2e-5, 8)]
_BW_HIDDEN = [(12345, torch.int8, 3e-4, 16), (7, torch.float16, 1e-6, 3),
              (2**30, torch.float32, 0.37, 5), (500, torch.int64, 1.5e-3, 1)]


def _bw_mistakes(numel: int, dtype: torch.dtype, n: int, alg: float, bus: float):
    """(value a typical mistake gives, what the mistake is) for algbw and busbw."""
    k = dtype.itemsize
    alg_m = [(alg * 8, "That is 8x too large: bits instead of bytes? S is in bytes."),
             (alg / n, "That is 1/world_size of it: S is the whole tensor, not one rank's share."),
             (alg / k, f"That is 1/{k} of it: count bytes (numel x element size), not elements."),
             (alg * 1e9 / 2**30, "GB here means 1e9 bytes, not 2**30 (GiB)."),
             (alg * 1e9, "That is 1e9x too large: return GB/s (bytes/s divided by 1e9).")]
    bus_m = [(alg * 2, "busbw uses a factor 2; the all-reduce factor is 2(n-1)/n."),
             (alg, "busbw equals algbw: the all-reduce factor 2(n-1)/n is missing."),
             (alg * (n - 1) / n, "busbw uses (n-1)/n, the all-gather factor; an all-reduce moves "
                                 "the data twice (reduce-scatter, then all-gather): 2(n-1)/n."),
             (bus * 8, "That is 8x too large: bits instead of bytes?")]
    return alg_m, bus_m


def _check_bw_case(fn: Callable, numel: int, dtype: torch.dtype, seconds: float, n: int) -> None:
    s = numel * dtype.itemsize
    alg = _ref_algbw(s, seconds) / 1e9
    bus = _ref_busbw("all_reduce", s, seconds, n) / 1e9
    call = f"bandwidths(numel={numel}, dtype={dtype}, seconds={seconds}, world_size={n})"
    try:
        got = fn(numel, dtype, seconds, n)
    except Exception as exc:  # noqa: BLE001 - report it in the student's terms
        raise AssertionError(f"{call} raised {type(exc).__name__}: {exc}") from None
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise AssertionError(f"{call} should return a pair (algbw, busbw), got {got!r}")
    alg_m, bus_m = _bw_mistakes(numel, dtype, n, alg, bus)
    assert_number(got[0], alg, f"algbw of {call}", alg_m, unit="GB/s")
    assert_number(got[1], bus, f"busbw of {call}", bus_m, unit="GB/s")


def check_bandwidths(fn: Callable, *, hidden: bool = False) -> None:
    """Exercise 4: ``fn(numel, dtype, seconds, world_size) -> (algbw, busbw)`` in GB/s (1e9 B/s)
    for an all-reduce, with the nccl-tests definitions (doc/PERFORMANCE.md; shared/FACTS.md)."""
    cases = _BW_HIDDEN if hidden else _BW_VISIBLE
    for case in cases:
        _check_bw_case(fn, *case)
    print(f"{getattr(fn, '__name__', 'bandwidths')}: {len(cases)} "
          f"{'hidden' if hidden else 'visible'} cases passed")
