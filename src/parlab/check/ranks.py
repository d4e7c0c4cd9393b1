"""Did every rank end with the same thing?  Replicas that drifted apart name the ranks
and the first tensor that differs.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from .closeness import backend_aware
from .named import as_named, names_problem
from .phrases import ranks_phrase
from .tensors import tensor_mismatch


_SYNC_HINT = ("did every rank start from rank 0's parameters (broadcast), and did every "
              "rank apply the same averaged gradients?")


@backend_aware
def assert_same_across_ranks(per_rank: Sequence[Any], name: str = "tensor",
                             rtol: float | None = None, atol: float | None = None, *,
                             exact: bool = False, hint: str = _SYNC_HINT) -> None:
    """Assert that every rank returned the same tensor (or dict of tensors) as rank 0.

    Compared to float tolerance by default, not bit for bit: synchronised ranks
    usually agree exactly, but some correct schemes (FSDP's reduce-scatter then
    all-gather, say) only agree to rounding, while a missing broadcast differs
    by the size of the initial weights, far above any tolerance.  Pass
    ``exact=True`` to demand bitwise equality.
    """
    if len(per_rank) == 0:
        raise ValueError("per_rank is empty: pass one result per rank, in rank order")
    if exact:
        rtol = atol = 0.0
    for r, x in enumerate(per_rank):
        if x is None:
            raise AssertionError(f"rank {r}: '{name}' is None: did every rank return it?")
    first = per_rank[0]
    named = isinstance(first, (Mapping, nn.Module))
    base = as_named(first, "tensor", 0) if named else None
    details: dict[int, str] = {}
    for r in range(1, len(per_rank)):
        msg = (_named_differ(per_rank[r], base, r, name, rtol, atol) if named
               else tensor_mismatch(per_rank[r], first, name, r, rtol, atol, ref="rank 0's value"))
        if msg:
            details[r] = msg
    if details:
        bad = sorted(details)
        verb = "differs" if len(bad) == 1 else "differ"
        raise AssertionError(f"{ranks_phrase(bad)} {verb} from rank 0 in '{name}': {hint}\n"
                             f"First difference: {details[bad[0]]}")


def _named_differ(obj: Any, base: dict, r: int, name: str, rtol, atol) -> str | None:
    """First difference between rank r's named tensors and rank 0's, if any."""
    other = as_named(obj, "tensor", r)
    problem = names_problem(other, base, r, "tensor")
    if problem:
        return problem.replace("the reference", "rank 0's")
    for key, ref in base.items():
        msg = tensor_mismatch(other[key], ref, f"{name}.{key}", r, rtol, atol, ref="rank 0's value")
        if msg:
            return msg
    return None
