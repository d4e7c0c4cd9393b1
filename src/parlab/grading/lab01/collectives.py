"""Lab 01, exercises 1-3: what the three collectives built by hand share.

Each answer (an all-reduce from reduce-scatter + all-gather, a ring
all-reduce, a tree broadcast) runs on every rank on an input made from a
seed per (case, rank), so the grader can rebuild every rank's input and add
them up itself: the reference never uses a collective.  Float32/64 inputs are
random normals; half precisions and integers get small whole numbers, whose
sums are exact in every dtype.  ``grade`` compares every rank's result with
that reference and, when it is wrong, ``_diagnose`` guesses the mistake from
which elements are wrong and what they hold.  The rules more than one of the
exercises state (no built-in collective, a new tensor) are judged here on the
spy's records; each exercise's module holds its cases, its own rules and hints.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ... import check
from ..harness import Graded
from ..records import describe, first


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
    # (n, *shape) summed over the ranks, in float64 so that no dtype rounds the sum
    return torch.stack([x.to(torch.float64) for x in xs]).sum(0).to(xs[0].dtype)


#: The visible and hidden inputs of both all-reduces, (world_size, cases).  The visible set
#: holds the commonest traps: a numel not divisible by the world size, a dtype other than float32.
ALL_REDUCE_VISIBLE = ((4, (Case((16,)), Case((4, 6)), Case((10,)), Case((3, 5)), Case((6,), "int64"))),)
ALL_REDUCE_HIDDEN = ((3, (Case((1,)), Case((2,)), Case((7,)), Case((13,)), Case((5, 3), "float64"),
                          Case((11,), "int64"), Case((9,), "bfloat16"), Case((13,), "float16"),
                          Case((2, 3, 4), "int32"))),)


# ---------------------------------------------------------------- on the ranks
def run(fn, case: Case, i: int, spy) -> dict:
    """Call the answer on this rank's input; return its result and whether it is right."""
    import torch.distributed as dist

    from ...launch.runtime import device

    rank, n = dist.get_rank(), dist.get_world_size()
    x = make_input(case, rank, salt=i).to(device())  # case.shape: this rank's whole input
    spy.guard(x=x)
    with spy.watch():
        got = fn(x) if case.root is None else fn(x, case.root)
    if isinstance(got, torch.Tensor):
        got = got.detach().cpu().clone()
    return {"got": got, "right": check.same_values(got, expected(case, n, i))}


def settle(result: dict, case, i, n) -> bool:
    return result["right"]


# ---------------------------------------------------------------- rules more than one exercise states
NEW_TENSOR = "Return a new tensor and leave `x` unchanged."
ONLY_P2P_SAYS = "Use only `dist.send`, `dist.recv`, `dist.isend` and `dist.irecv`: no collective."


def no_builtin(*banned: str):
    def broken(records, case, n):
        for r, rec in enumerate(records):
            if hit := first(rec, *banned):
                return f"rank {r} called {describe(rec, hit)}."
        return None
    return broken


def input_unchanged(records, case, n):
    for r, rec in enumerate(records):
        if "x" in rec["mutated"]:
            return (f"rank {r}'s input x was modified: compute into a new tensor "
                    "(x.clone(), torch.zeros(..., dtype=x.dtype)) and leave x as it was.")
    return None


#: The hint when gloo aborts on a message whose buffer differs in size or dtype.
SIZE_HINT = ("the sender's chunk and the receiver's buffer must have the same number of "
             "elements and the same dtype: compute chunk boundaries the same way on every rank, "
             "and size each receive buffer for the chunk that arrives, not the one you send "
             "(allocate it with dtype=x.dtype).")


# ---------------------------------------------------------------- grader
def grade(g: Graded) -> str | None:
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
            pow2 = (f" world_size {n} is not a power of two, and the ranks left out are those at "
                    f"distance {_below_pow2(n)} or more from the root: does your tree only reach every "
                    "rank when the world size is a power of two?"
                    if _pow2_only(case, n, stuck, passed) else "")
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


def _below_pow2(n: int) -> int:
    """The largest power of two not above n."""
    return 1 << (n.bit_length() - 1)


def _pow2_only(case: Case, n: int, stuck: list, passed: list) -> bool:
    """The evidence of a tree that reaches every rank only on a power of two: the world size is not
    one, no case at this world size passed, and the ranks left out are exactly those whose distance
    from the root, (rank − root) % n, is the largest power of two below n or more (what
    ⌊log2 n⌋ rounds of doubling leave out)."""
    far = [r for r in range(n) if (r - case.root) % n >= _below_pow2(n)]
    return n & (n - 1) != 0 and not passed and sorted(stuck) == far


def _partial_sums(g: torch.Tensor, xs: list[torch.Tensor]) -> torch.Tensor:
    """True where ``g`` equals the sum over some proper subset of the ranks' inputs."""
    n = len(xs)
    hit = torch.zeros(g.shape, dtype=torch.bool)
    if n > 8:
        return hit
    stack = torch.stack([x.to(torch.float64) for x in xs])  # (n, *shape): every rank's input
    for mask in range(1, 2**n - 1):
        # (n,): 1 for each rank in the subset, 0 for the others
        pick = torch.tensor([(mask >> j) & 1 for j in range(n)], dtype=torch.float64)
        hit |= check.close_mask(g, torch.tensordot(pick, stack, dims=1).to(xs[0].dtype))
    return hit
