"""Do the ranks' shards put back together into the full tensor?  Names the shard that
is the wrong size, shifted, or missing.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .closeness import backend_aware, bad_mask, default_tols
from .phrases import ranks_phrase
from .tensors import tensor_mismatch, to_tensor


def _along(dim: int) -> str:
    return "rows" if dim == 0 else f"indices along dim {dim}"


def _split_sizes(length: int, n: int) -> list[int]:
    """Shard sizes of ``torch.tensor_split(x, n)``: the first length % n get one more."""
    q, m = divmod(length, n)
    return [q + (r < m) for r in range(n)]


def _offsets(sizes: Sequence[int]) -> list[int]:
    return [sum(sizes[:r]) for r in range(len(sizes))]


@backend_aware
def assert_shards_reassemble(shards: Sequence[Tensor], full: Tensor, dim: int = 0,
                             name: str = "tensor", *, padded: bool = False, balanced: bool = True,
                             world_size: int | None = None,
                             rtol: float | None = None, atol: float | None = None) -> None:
    """Assert that rank r's shard is the r-th piece of ``full`` along ``dim``.

    Two layouts are accepted:

    * ``padded=False`` (default): ``torch.tensor_split`` style.  Shard sizes
      differ by at most one, the first ``len % n`` shards get the extra row,
      and concatenating the shards gives ``full``.  ``balanced=False`` accepts
      any sizes whose concatenation gives ``full`` (``torch.chunk`` style).
    * ``padded=True``: FSDP/ZeRO style.  Every shard has ``ceil(len / n)``
      rows; the last shard(s) end in zeros that pad the total to
      ``n * ceil(len / n)``.
    """
    n = len(shards)
    if world_size is not None and n != world_size:
        raise AssertionError(f"got {n} shards of '{name}' but the world size is {world_size}: "
                             "did every rank return its shard?")
    if n == 0:
        raise ValueError("shards is empty: pass one shard per rank, in rank order")
    parts = [to_tensor(s, f"{name} shard", r) for r, s in enumerate(shards)]
    full = to_tensor(full, f"reference {name}", None)
    if not -full.dim() <= dim < full.dim():
        raise ValueError(f"dim={dim} is out of range for a {full.dim()}-d tensor")
    dim %= full.dim()
    length, unit = full.shape[dim], _along(dim)
    for r, p in enumerate(parts):
        if p.dim() != full.dim() or any(p.shape[d] != full.shape[d] for d in range(full.dim()) if d != dim):
            raise AssertionError(
                f"rank {r}: the shard of '{name}' has shape {tuple(p.shape)} but should have "
                f"the full shape {tuple(full.shape)} except along dim {dim}: sharded along "
                "another dim?")
    sizes = [p.shape[dim] for p in parts]
    if padded:
        c = -(-length // n)
        wrong = [r for r in range(n) if sizes[r] != c]
        if wrong:
            raise AssertionError(
                f"padded shards of '{name}' must all have ceil({length}/{n}) = {c} {unit}; "
                f"{ranks_phrase(wrong)} {'has' if len(wrong) == 1 else 'have'} "
                f"{', '.join(str(sizes[r]) for r in wrong)}")
        offsets = [r * c for r in range(n)]
        real = [max(0, min(c, length - r * c)) for r in range(n)]
    else:
        want = _split_sizes(length, n)
        if sum(sizes) != length or (balanced and sizes != want):
            raise AssertionError(_size_message(parts, full, dim, sizes, want, name, unit, rtol, atol))
        offsets, real = _offsets(sizes), sizes
    failures = []
    for r, p in enumerate(parts):
        msg = _shard_message(p, full, r, dim, offsets[r], real[r], name, unit, rtol, atol)
        if msg is None and real[r] < p.shape[dim] and bool(p.narrow(dim, real[r], p.shape[dim] - real[r]).ne(0).any()):  # the padding: p's shape, p.shape[dim] - real[r] along dim
            msg = (f"rank {r}: the padding of '{name}' ({unit} {real[r]}..{p.shape[dim] - 1} of "
                   "its shard) should be zeros")
        if msg:
            failures.append((r, msg))
    if failures:
        raise AssertionError(f"shards of '{name}' do not reassemble into the full tensor on "
                             f"{ranks_phrase([r for r, _ in failures])}. First: {failures[0][1]}")


def _locate(part: Tensor, full: Tensor, dim: int, rtol, atol) -> int | None:
    """Offset along ``dim`` at which ``part`` appears in ``full``, if anywhere."""
    rows = part.shape[dim]
    if rows == 0 or rows > full.shape[dim]:
        return None
    rt, at = default_tols(part.dtype, full.dtype, rtol, atol)
    for o in range(full.shape[dim] - rows + 1):
        if not bool(bad_mask(part, full.narrow(dim, o, rows), rt, at).any()):  # part's shape: full at o.. along dim
            return o
    return None


def _size_message(parts, full, dim, sizes, want, name, unit, rtol, atol) -> str:
    length, n = full.shape[dim], len(parts)
    head = f"shard sizes of '{name}' are {sizes} but splitting {length} {unit} over {n} ranks gives {want}"
    if sum(sizes) != length:
        head += f" (they add up to {sum(sizes)}, not {length})"
        if len(set(sizes)) == 1 and sizes[0] and length % sizes[0] == 0 and length // sizes[0] != n:
            return head + f": looks like a split into {length // sizes[0]} pieces instead of {n}"
        if all(s == -(-length // n) for s in sizes):
            return head + ": every shard has ceil(len/n) rows; if that padding is intended pass padded=True"
    elif torch.equal(torch.cat(parts, dim), full):  # full's shape: the sizes add up here
        head += (" (they do reassemble, torch.chunk style; pass balanced=False to accept "
                 "unbalanced shards)")
    want_off = _offsets(want)
    for r in range(n):
        found = _locate(parts[r], full, dim, rtol, atol)
        if (found, sizes[r]) != (want_off[r], want[r]):
            held = (f"holds {unit} {found}..{found + sizes[r] - 1}" if found is not None
                    else f"has {sizes[r]} {unit}")
            return (head + f". Rank {r}'s shard {held}; expected {unit} "
                    f"{want_off[r]}..{want_off[r] + want[r] - 1} (torch.tensor_split: the "
                    "first len % n ranks get one extra)")
    return head


def _shard_message(part, full, r, dim, offset, rows, name, unit, rtol, atol) -> str | None:
    got = part.narrow(dim, 0, rows)  # the shard less its padding: full's shape with rows along dim
    ref = f"{unit} {offset}..{offset + rows - 1} of the full tensor"
    msg = tensor_mismatch(got, full.narrow(dim, offset, rows), f"{name} shard", r, rtol, atol, ref=ref)  # got's shape
    found = _locate(got, full, dim, rtol, atol) if msg else None
    if found is None:  # wrong values, not just the right data at the wrong place
        return msg
    return (f"rank {r}: the shard of '{name}' holds {unit} {found}..{found + rows - 1} of the "
            f"full tensor but should hold {offset}..{offset + rows - 1}: is its start "
            f"offset off by {found - offset}?")
