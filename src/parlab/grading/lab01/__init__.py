"""Checks for Lab 01: backends and collectives, on the grading harness.

    lab01.check_allreduce_from_rs_ag(all_reduce_rs_ag)     # Exercise 1
    lab01.check_ring_allreduce(ring_all_reduce)            # Exercise 2
    lab01.check_tree_broadcast(tree_broadcast)             # Exercise 3
    lab01.check_bandwidths(bandwidths)                     # Exercise 4

Inputs are made from a seed per (case, rank), so the grader can rebuild
every rank's input and add them up itself: the reference never uses a
collective.  Float32/64 inputs are random normals; half precisions and
integers get small whole numbers, whose sums are exact in every dtype.
The rules each exercise states (no built-in collective, a new tensor, the
ring's neighbours, the tree's fan-out) are judged on the spy's records.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ... import check
from ...cost import algbw as _ref_algbw
from ...cost import busbw as _ref_busbw
from .. import assert_number
from ..harness import Exercise, Graded, Rule, checker
from ..spy import COLLECTIVES, used

__all__ = ["check_allreduce_from_rs_ag", "check_ring_allreduce", "check_tree_broadcast",
           "check_bandwidths", "make_input", "Case", "EXERCISES"]


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


def expected(case: Case, n: int, i: int) -> torch.Tensor:
    """What every rank should hold: the root's input, or the sum of all inputs."""
    xs = [make_input(case, r, salt=i) for r in range(n)]
    if case.root is not None:
        return xs[case.root]
    return torch.stack([x.to(torch.float64) for x in xs]).sum(0).to(xs[0].dtype)


# ---------------------------------------------------------------- test sets
# (world_size, cases).  Visible sets hold each exercise's commonest trap: a
# numel not divisible by the world size, and a dtype other than float32.
_AR_VISIBLE = ((4, (Case((16,)), Case((4, 6)), Case((10,)), Case((3, 5)), Case((6,), "int64"))),)
_AR_HIDDEN = ((3, (Case((1,)), Case((2,)), Case((7,)), Case((13,)), Case((5, 3), "float64"),
                   Case((11,), "int64"), Case((9,), "bfloat16"), Case((13,), "float16"),
                   Case((2, 3, 4), "int32"))),)
_RING_HIDDEN = _AR_HIDDEN + ((2, (Case((1,)), Case((5,)), Case((13,), "float64"),
                                  Case((4, 3), "int64"))),)
_TREE_VISIBLE = ((4, tuple(Case((5,), root=r) for r in range(4))
                  + tuple(Case((2, 3), "int64", root=r) for r in (3, 1))),)
_TREE_HIDDEN = ((3, tuple(Case((7,), "float64", root=r) for r in range(3))
                 + (Case((1,), "bfloat16", root=2), Case((4, 4), "int32", root=1))),)


# ---------------------------------------------------------------- on the ranks
def _run(fn, case: Case, i: int, spy) -> dict:
    """Call the answer on this rank's input; return its result and whether it is right."""
    import torch.distributed as dist

    from ...launch.runtime import device

    rank, n = dist.get_rank(), dist.get_world_size()
    x = make_input(case, rank, salt=i).to(device())
    spy.guard(x=x)
    with spy.watch():
        got = fn(x) if case.root is None else fn(x, case.root)
    if isinstance(got, torch.Tensor):
        got = got.detach().cpu().clone()
    return {"got": got, "right": check.same_values(got, expected(case, n, i))}


def _settle(result: dict, case, i, n) -> bool:
    return result["right"]


# ---------------------------------------------------------------- rules
def _no_builtin(*banned: str):
    def broken(records, case, n):
        for r, rec in enumerate(records):
            if hits := used(rec, *banned):
                return f"rank {r} called dist.{hits[0]}."
        return None
    return broken


def _must_call(*needed: str):
    def broken(records, case, n):
        for r, rec in enumerate(records):
            if missing := [op for op in needed if not used(rec, op, op + "_tensor", op + "_single",
                                                            op + "_into_tensor")]:
                return f"rank {r} never called dist.{missing[0]}."
        return None
    return broken


def _input_unchanged(records, case, n):
    for r, rec in enumerate(records):
        if "x" in rec["mutated"]:
            return (f"rank {r}'s input x was modified: compute into a new tensor "
                    "(x.clone(), torch.zeros(..., dtype=x.dtype)) and leave x as it was.")
    return None


def _ring_neighbours(records, case, n):
    for r, rec in enumerate(records):
        for c in rec["calls"]:
            if c["op"] in ("send", "isend") and c["peer"] not in (None, (r + 1) % n):
                return (f"rank {r} sent to rank {c['peer']}; in a ring it sends only to its right "
                        f"neighbour {(r + 1) % n}.")
            if c["op"] in ("recv", "irecv") and c["peer"] not in (None, (r - 1) % n):
                return (f"rank {r} received from rank {c['peer']}; in a ring it receives only "
                        f"from its left neighbour {(r - 1) % n}.")
    return None


def _ring_chunks(records, case, n):
    chunk = -(-case.numel // n)
    for r, rec in enumerate(records):
        sends = [c for c in rec["calls"] if c["op"] in ("send", "isend")]
        big = [c["numel"] for c in sends if c["numel"] > chunk]
        if big:
            return (f"rank {r} sent a message of {big[0]} elements; each message of a ring "
                    f"all-reduce carries one chunk, at most ceil(numel / n) = {chunk} here.")
        if len(sends) > 2 * (n - 1):
            return (f"rank {r} sent {len(sends)} messages; a ring all-reduce sends "
                    f"2(n - 1) = {2 * (n - 1)}.")
    return None


def _tree_fan_out(records, case, n):
    for r, rec in enumerate(records):
        sends = [c for c in rec["calls"] if c["op"] in ("send", "isend")]
        peers = sorted({c["peer"] for c in sends if c["peer"] is not None})
        if len(sends) > 2:
            return (f"rank {r} sent {len(sends)} messages (to ranks {peers}): a linear chain from "
                    "one rank, not a binary tree, where every rank sends to at most its two "
                    "children.")
        recvs = [c for c in rec["calls"] if c["op"] in ("recv", "irecv")]
        if r != case.root and len(recvs) != 1:
            return f"rank {r} received {len(recvs)} messages; in a tree each non-root rank receives once."
    return None


NEW_TENSOR = "Return a new tensor and leave `x` unchanged."
_ONLY_P2P_SAYS = "Use only `dist.send`, `dist.recv`, `dist.isend` and `dist.irecv`: no collective."


# ---------------------------------------------------------------- graders
def _grade_collective(g: Graded) -> str | None:
    passed: list[Case] = []
    for i, case in enumerate(g.cases[:min(len(r) for r in g.results)]):
        got = [res["got"] for res in g.at(i)]
        exp = expected(case, g.n, i)
        odd = [(r, t.dtype) for r, t in enumerate(got)
               if isinstance(t, torch.Tensor) and t.dtype != exp.dtype]
        if odd:
            return (f"{g.name} is wrong for {case.describe(g.n)}: rank {odd[0][0]} returned dtype "
                    f"{odd[0][1]}, but the input was {exp.dtype}. The result must keep the input's "
                    "dtype: create buffers with dtype=x.dtype (torch.zeros and torch.empty default "
                    "to float32), or use torch.zeros_like/empty_like.")
        op = "broadcast" if case.root is not None else "all_reduce"
        try:
            check.assert_collective_result(got, exp, op_name=op)
        except AssertionError as err:
            hint = _diagnose(case, g.n, i, got, passed)
            return (f"{g.name} is wrong for {case.describe(g.n)}.\n{err}"
                    + (f"\nHint: {hint}" if hint else ""))
        passed.append(case)
    return None


def _diagnose(case: Case, n: int, i: int, got: list, passed: list[Case]) -> str:
    """A guess at the mistake behind a wrong result, in the student's terms (never raises)."""
    xs = [make_input(case, r, salt=i) for r in range(n)]
    exp = expected(case, n, i)
    tensors = {r: g for r, g in enumerate(got) if isinstance(g, torch.Tensor)}
    for r, g in tensors.items():
        if g.numel() < case.numel:
            return (f"Rank {r} returned {g.numel()} of {case.numel} elements: only its own chunk? "
                    "After reducing, every rank needs every chunk back (the all-gather phase).")
    if case.root is not None:
        if case.root != 0 and any(c.root == 0 for c in passed):
            return (f"Root 0 works but root {case.root} does not: does your tree assume the root "
                    "is rank 0? Number the ranks relative to the root, vrank = (rank - root) % "
                    "world_size, and map back with (vrank + root) % world_size.")
        stuck = [r for r, g in tensors.items() if r != case.root and check.same_values(g, xs[r])]
        if stuck:
            pow2 = "" if n & (n - 1) == 0 else (f" world_size {n} is not a power of two: does "
                                                "your tree only reach every rank when it is?")
            one = len(stuck) == 1
            return (f"{check.ranks_phrase(stuck)} {'still holds its' if one else 'still hold their'}"
                    f" own input: the broadcast never reached {'it' if one else 'them'} (or you "
                    f"returned the input instead of what you received).{pow2}")
        return ""
    if passed and case.numel % n and all(c.numel % n == 0 for c in passed):
        return (f"Every case with numel divisible by world_size passed, but numel {case.numel} "
                f"leaves a remainder of {case.numel % n}: did you forget the last chunk when numel "
                "is not divisible by world_size? (Pad to a multiple of world_size, or use uneven "
                "chunks.)")
    for r, g in tensors.items():
        if g.shape != exp.shape:
            continue
        bad = ~check.close_mask(g, exp)
        if not bool(bad.any()):
            continue
        if bool(check.close_mask(g, xs[r])[bad].all()):
            return (f"On rank {r}, the wrong elements still hold rank {r}'s own input: that part "
                    "was never reduced or never gathered back (is a phase missing or cut short?).")
        if bool(_partial_sums(g, xs)[bad].all()):
            return (f"On rank {r}, each wrong element is the sum of only some ranks' inputs: a "
                    "phase is cut short, or a chunk is passed on before it is complete. Each "
                    f"phase of a ring takes world_size - 1 = {n - 1} steps; after the "
                    "reduce-scatter, rank r holds the complete sum of chunk (r + 1) % world_size, "
                    "so the all-gather starts by sending that one.")
    return ""


def _partial_sums(g: torch.Tensor, xs: list[torch.Tensor]) -> torch.Tensor:
    """True where ``g`` equals the sum over some proper subset of the ranks' inputs."""
    n = len(xs)
    hit = torch.zeros(g.shape, dtype=torch.bool)
    if n > 8:
        return hit
    stack = torch.stack([x.to(torch.float64) for x in xs])
    for mask in range(1, 2**n - 1):
        pick = torch.tensor([(mask >> j) & 1 for j in range(n)], dtype=torch.float64)
        hit |= check.close_mask(g, torch.tensordot(pick, stack, dims=1).to(xs[0].dtype))
    return hit


# ---------------------------------------------------------------- hints on failures
_SIZE_HINT = ("the sender's chunk and the receiver's buffer must have the same number of "
              "elements and the same dtype: compute chunk boundaries the same way on every rank, "
              "and size each receive buffer for the chunk that arrives, not the one you send "
              "(allocate it with dtype=x.dtype).")

RS_AG = Exercise(
    key="lab01.rs_ag", answer="all_reduce_rs_ag", run=_run, grade=_grade_collective,
    visible=_AR_VISIBLE, hidden=_AR_HIDDEN, settle=_settle,
    rules=(Rule("Use `dist.reduce_scatter` and `dist.all_gather` (or their `_tensor` forms), "
                "not `dist.all_reduce`.", _no_builtin("all_reduce")),
           Rule("Call both collectives: a reduce-scatter, then an all-gather.",
                _must_call("reduce_scatter", "all_gather")),
           Rule(NEW_TENSOR, _input_unchanged)),
    on_hang="every rank must call reduce_scatter and all_gather the same number of times, with "
            "the same sizes.",
    on_mismatch=_SIZE_HINT)

RING = Exercise(
    key="lab01.ring", answer="ring_all_reduce", run=_run, grade=_grade_collective,
    visible=_AR_VISIBLE, hidden=_RING_HIDDEN, settle=_settle,
    rules=(Rule(_ONLY_P2P_SAYS, _no_builtin(*COLLECTIVES)),
           Rule("Rank r sends only to (r + 1) % n and receives only from (r - 1) % n.",
                _ring_neighbours),
           Rule("Each message carries one chunk: 2(n − 1) messages of at most ceil(numel / n) "
                "elements per rank.", _ring_chunks),
           Rule(NEW_TENSOR, _input_unchanged)),
    on_hang="a ring where every rank first calls a blocking dist.send waits forever: gloo's send "
            "only completes once the neighbour posts the matching recv, and that neighbour is "
            "itself stuck in send. Post both with dist.isend/dist.irecv and wait on both, or let "
            "even ranks send first and odd ranks receive first.",
    on_mismatch=_SIZE_HINT)

TREE = Exercise(
    key="lab01.tree", answer="tree_broadcast", run=_run, grade=_grade_collective,
    visible=_TREE_VISIBLE, hidden=_TREE_HIDDEN, settle=_settle,
    rules=(Rule(_ONLY_P2P_SAYS.replace(": no collective.", ": no `dist.broadcast` or other "
                                                           "collective."),
                _no_builtin(*COLLECTIVES)),
           Rule("Every rank sends to at most its two children, and every rank but the root "
                "receives exactly once.", _tree_fan_out)),
    on_hang="some rank waits for a message nobody sends: check that each child receives from "
            "exactly the parent that sends to it, for every root and world size.",
    on_mismatch=_SIZE_HINT)


# ---------------------------------------------------------------- exercise 4
# (numel, dtype, seconds, world_size); sizes in bytes as nccl-tests counts them.
_BW_VISIBLE = ((1, ((3 * 2**18, "float64", 0.5, 2), (2**20, "float32", 0.01, 4),
                    (1000, "bfloat16", 2e-5, 8))),)
_BW_HIDDEN = ((1, ((12345, "int8", 3e-4, 16), (7, "float16", 1e-6, 3),
                   (2**30, "float32", 0.37, 5), (500, "int64", 1.5e-3, 1))),)


def _run_bandwidths(fn, case, i, spy):
    numel, dtype, seconds, n = case
    with spy.watch():
        got = fn(numel, getattr(torch, dtype), seconds, n)
    if isinstance(got, (tuple, list)) and len(got) == 2:
        return [_plain_number(v) for v in got]
    return {"not_a_pair": repr(got)[:200]}


def _plain_number(v):
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return v.item()
    return v if isinstance(v, (int, float, bool)) or v is None else repr(v)[:100]


def _bw_mistakes(n: int, k: int, alg: float, bus: float):
    """(value a typical mistake gives, what the mistake is) for algbw and busbw."""
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


def _grade_bandwidths(g: Graded) -> str | None:
    for i, (numel, dtype, seconds, n) in enumerate(g.cases[:len(g.results[0])]):
        got = g.results[0][i]
        call = f"bandwidths(numel={numel}, dtype=torch.{dtype}, seconds={seconds}, world_size={n})"
        if isinstance(got, dict):
            if got["not_a_pair"] == "None":
                return f"{call} returned None: did you forget the `return` statement?"
            return f"{call} should return a pair (algbw, busbw), got {got['not_a_pair']}"
        k = getattr(torch, dtype).itemsize
        s = numel * k
        alg, bus = _ref_algbw(s, seconds) / 1e9, _ref_busbw("all_reduce", s, seconds, n) / 1e9
        alg_m, bus_m = _bw_mistakes(n, k, alg, bus)
        try:
            assert_number(got[0], alg, f"algbw of {call}", alg_m, unit="GB/s")
            assert_number(got[1], bus, f"busbw of {call}", bus_m, unit="GB/s")
        except AssertionError as err:
            return str(err)
    return None


BANDWIDTHS = Exercise(
    key="lab01.bandwidths", answer="bandwidths", run=_run_bandwidths, grade=_grade_bandwidths,
    visible=_BW_VISIBLE, hidden=_BW_HIDDEN, solo=True)

EXERCISES = {"rs_ag": RS_AG, "ring": RING, "tree": TREE, "bandwidths": BANDWIDTHS}

check_allreduce_from_rs_ag = checker(RS_AG, """Exercise 1: ``fn(x)`` returns the sum of ``x`` over
all ranks, built from reduce-scatter + all-gather.""")
check_ring_allreduce = checker(RING, """Exercise 2: ``fn(x)`` returns the sum of ``x`` over all
ranks, built from point-to-point messages around a ring.""")
check_tree_broadcast = checker(TREE, """Exercise 3: ``fn(x, root)`` returns root's ``x`` on every
rank, sent down a binary tree.""")
check_bandwidths = checker(BANDWIDTHS, """Exercise 4: ``fn(numel, dtype, seconds, world_size) ->
(algbw, busbw)`` in GB/s (1e9 B/s) for an all-reduce, with the nccl-tests definitions
(NVIDIA nccl-tests, doc/PERFORMANCE.md).""")
