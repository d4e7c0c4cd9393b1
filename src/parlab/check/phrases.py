"""Small phrases the comparison messages share: which rank, which ranks, which names,
runs of indices, numbers and dtypes, and shape hints.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def rank_phrase(rank: int | None) -> str:
    return "" if rank is None else f"rank {rank}: "


def ranks_phrase(ranks: Sequence[int]) -> str:
    """[1] -> 'rank 1', [1, 3] -> 'ranks 1 and 3', [1, 2, 3] -> 'ranks 1, 2 and 3'."""
    r = [str(x) for x in ranks]
    if len(r) == 1:
        return f"rank {r[0]}"
    return f"ranks {', '.join(r[:-1])} and {r[-1]}"


def names_phrase(names: Sequence[str], limit: int = 6) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def index_runs(flat: Sequence[int], limit: int = 6) -> str:
    """Compress sorted indices into ranges: [5, 6, 7, 12] -> '5..7, 12'."""
    runs: list[list[int]] = []
    for i in flat:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = ", ".join(f"{a}..{b}" if a != b else f"{a}" for a, b in runs[:limit])
    return text + (f", ... ({len(runs)} ranges in all)" if len(runs) > limit else "")


def short_number(x: Any) -> str:
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def dtype_kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    if dtype.is_complex:
        return "complex"
    return "float" if dtype.is_floating_point else "integer"


def shape_hint(got: torch.Size, exp: torch.Size) -> str:
    """How the two shapes relate, as a fact (one shard's size, k whole tensors, the same sizes
    permuted, the same number of elements): a shape alone shows no cause, so none is named."""
    if len(got) == len(exp):
        diff = [d for d in range(len(exp)) if got[d] != exp[d]]
        if len(diff) == 1:
            d = diff[0]
            if got[d] and exp[d] % got[d] == 0:
                k = exp[d] // got[d]
                return (f": dim {d} is 1/{k} of the reference's, the size of one of {k} equal shards "
                        f"along dim {d}")
            if exp[d] and got[d] % exp[d] == 0:
                k = got[d] // exp[d]
                return f": dim {d} is {k}x the reference's, the size of {k} whole tensors joined along dim {d}"
        if sorted(got) == sorted(exp):
            return ": the same sizes in another order, the shape of a transpose or permute of the reference"
    if got.numel() == exp.numel():
        return ": the same number of elements in another shape"
    return ""
