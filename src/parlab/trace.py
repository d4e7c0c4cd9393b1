"""Measure inside the ranks: time spans, collective bytes, memory.

Each process keeps its own list of spans.  A rank function records spans
and returns them; the notebook merges what ``parlab.launch`` brings back::

    def step():
        trace.reset()
        with trace.span("forward"):
            loss = model(x).sum()
        with trace.span("backward"):
            loss.backward()
        with trace.count_collectives() as counter:
            for p in model.parameters():
                dist.all_reduce(p.grad)
        return trace.spans(), counter.summary()

    results = parlab.launch(step, nproc=4)
    spans = trace.merge([r[0] for r in results])

Bytes come two ways: ``count_collectives`` computes from the calls what a
ring algorithm sends (``ring_bytes``), and ``measure_wire`` reads what this
rank's sockets (gloo) or the GPU's NVLinks (NCCL) really sent
(``parlab.wire``).

Timestamps are seconds on a shared wall clock: at import each process reads
``time.time()`` once (the anchor) and then adds ``time.perf_counter()``
deltas, which are precise and never jump.  Ranks on one machine therefore
agree to within the few microseconds between the two clock reads; ranks
on different machines agree only as well as their clocks are synchronised.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
import time
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Iterable

import torch
import torch.distributed as dist

from .cost import busbw_ratio
from .wire import WireCount, measure_wire  # noqa: F401  (bytes measured on the wire)

# ---------------------------------------------------------------- clock and spans
_WALL_ANCHOR = time.time()
_PERF_ANCHOR = time.perf_counter()


def now() -> float:
    """Seconds since the epoch, from perf_counter offset by a wall-clock anchor."""
    return _WALL_ANCHOR + (time.perf_counter() - _PERF_ANCHOR)


@dataclass
class Span:
    """One timed piece of work on one rank (picklable, so it survives launch)."""

    name: str
    rank: int
    start: float
    end: float
    bytes: int = 0
    meta: dict = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return self.end - self.start


_SPANS: list[Span] = []


def _rank() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", 0))


def reset() -> None:
    """Forget every span recorded in this process."""
    _SPANS.clear()


def spans() -> list[Span]:
    """A copy of this process's spans, in recording order."""
    return list(_SPANS)


def record(name: str, start: float, end: float, bytes: int = 0, **meta) -> Span:
    """Add a span with explicit times (from ``trace.now()``), e.g. for async work:
    take ``start = trace.now()`` before an async all_reduce and record when
    ``work.wait()`` returns."""
    if end < start:
        raise ValueError(f"span {name!r} ends before it starts ({end} < {start})")
    s = Span(name, _rank(), start, end, bytes, dict(meta))
    _SPANS.append(s)
    return s


@contextlib.contextmanager
def span(name: str, bytes: int = 0, **meta):
    """Time the body of a ``with`` block as a span (recorded even if it raises).

    Work queued on a GPU is not finished when Python moves on: call
    ``torch.cuda.synchronize()`` at the end of the body to time it.
    """
    start = now()
    try:
        yield
    finally:
        record(name, start, now(), bytes, **meta)


def merge(results: Iterable[Iterable[Span]], relative: bool = False) -> list[Span]:
    """Concatenate the span lists returned by the ranks, sorted by (start, rank).

    With relative=True, times are shifted so that the earliest span starts at 0.
    """
    out = sorted((s for r in results for s in r), key=lambda s: (s.start, s.rank))
    if relative and out:
        t0 = out[0].start
        out = [replace(s, start=s.start - t0, end=s.end - t0) for s in out]
    return out


# ---------------------------------------------------------------- interval arithmetic
def _union(intervals) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _length(intervals) -> float:
    return sum(b - a for a, b in intervals)


def _intersection(xs, ys) -> float:
    """Total length of the overlap of two unions of disjoint sorted intervals."""
    total, i, j = 0.0, 0, 0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0.0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def _names(x) -> tuple[str, ...]:
    return (x,) if isinstance(x, str) else tuple(x)


def _by_rank(spans: Iterable[Span], names) -> dict[int, list[tuple[float, float]]]:
    out: dict[int, list] = {}
    for s in spans:
        if s.name in names:
            out.setdefault(s.rank, []).append((s.start, s.end))
    return {r: _union(iv) for r, iv in out.items()}


def overlap_fraction(spans: Iterable[Span], comm="all_reduce", compute="backward",
                     per_rank: bool = False):
    """Fraction of communication time hidden under compute on the same rank.

    For each rank: |union(comm spans) ∩ union(compute spans)| / |union(comm spans)|.
    The overall figure sums both over ranks before dividing.  ``comm`` and
    ``compute`` are a span name or a tuple of names.  With per_rank=True,
    returns {rank: fraction}.  1.0 = fully hidden, 0.0 = fully exposed.
    """
    spans = list(spans)
    comm_iv = _by_rank(spans, _names(comm))
    comp_iv = _by_rank(spans, _names(compute))
    if not comm_iv:
        raise ValueError(f"no spans named {comm!r}")
    hidden = {r: _intersection(iv, comp_iv.get(r, [])) for r, iv in comm_iv.items()}
    total = {r: _length(iv) for r, iv in comm_iv.items()}
    if per_rank:
        return {r: hidden[r] / total[r] if total[r] else 0.0 for r in sorted(total)}
    denom = sum(total.values())
    return sum(hidden.values()) / denom if denom else 0.0


def bubble_fraction(spans: Iterable[Span], busy=("forward", "backward"), window=None,
                    per_rank: bool = False):
    """Idle share of the pipeline step on each rank (GPipe's "share" definition).

    The window is (earliest start, latest end) over ALL ranks' busy spans
    unless given as ``window=(t0, t1)``.  Per rank: 1 - |union(busy)| / |window|.
    Returns the mean over ranks, or {rank: fraction} with per_rank=True.
    Compare with ``parlab.cost.bubble_fraction(p, m, definition="share")``.
    """
    busy_iv = _by_rank(list(spans), _names(busy))
    if not busy_iv:
        raise ValueError(f"no spans named {busy!r}")
    if window is None:
        window = (min(iv[0][0] for iv in busy_iv.values()), max(iv[-1][1] for iv in busy_iv.values()))
    t0, t1 = window
    if t1 <= t0:
        raise ValueError(f"empty window {window!r}")
    per = {r: 1.0 - _intersection(iv, [(t0, t1)]) / (t1 - t0) for r, iv in sorted(busy_iv.items())}
    return per if per_rank else sum(per.values()) / len(per)


# ---------------------------------------------------------------- collective counter
def _nbytes(t) -> int:
    return t.numel() * t.element_size()


# op -> (nccl-tests collective for the busbw factor, how to get the payload S
# in bytes from the bound arguments).  S follows nccl-tests: the full array
# for all-gather (output) and reduce-scatter (input).
_OPS = {
    "all_reduce": ("all_reduce", lambda a: _nbytes(a["tensor"])),
    "broadcast": ("broadcast", lambda a: _nbytes(a["tensor"])),
    "reduce": ("reduce", lambda a: _nbytes(a["tensor"])),
    "all_gather": ("all_gather", lambda a: sum(_nbytes(t) for t in a["tensor_list"])),
    "all_gather_into_tensor": ("all_gather", lambda a: _nbytes(a["output_tensor"])),
    "reduce_scatter": ("reduce_scatter", lambda a: sum(_nbytes(t) for t in a["input_list"])),
    "reduce_scatter_tensor": ("reduce_scatter", lambda a: _nbytes(a["input"])),
    "all_gather_single": ("all_gather", lambda a: _nbytes(a["output_tensor"])),
    "reduce_scatter_single": ("reduce_scatter", lambda a: _nbytes(a["input"])),
    "all_to_all_single": ("all_to_all", lambda a: _nbytes(a["input"])),
    "all_to_all": ("all_to_all", lambda a: sum(_nbytes(t) for t in a["input_tensor_list"])),
    "send": ("sendrecv", lambda a: _nbytes(a["tensor"])),
    "isend": ("sendrecv", lambda a: _nbytes(a["tensor"])),
    "recv": (None, lambda a: _nbytes(a["tensor"])),
    "irecv": (None, lambda a: _nbytes(a["tensor"])),
    "barrier": (None, lambda a: 0),
}
# the *_single names are newer than some torch versions parlab supports
COUNTED_OPS = tuple(op for op in _OPS if hasattr(dist, op))


class CollectiveCounter:
    """Tally of torch.distributed calls made inside ``count_collectives()``.

    Per op: ``calls``; ``bytes`` = payload S as nccl-tests defines it
    (all_reduce/broadcast/reduce/send/recv: the tensor; all_gather: the full
    output = per-rank bytes × n; reduce_scatter: the full input;
    all_to_all(_single): the input); ``ring_bytes`` = the bytes THIS rank
    would send if every collective ran as a ring = S × busbw_factor(op, n).
    Receives and barriers send nothing (ring_bytes 0): the peer's send counts
    those bytes.  ``ring_bytes`` is a model computed from the calls, not a
    measurement: ``measure_wire()`` reads what the sockets really sent.
    """

    def __init__(self, spans: bool = False):
        self.record_spans = spans
        self._calls: dict[str, int] = {}
        self._bytes: dict[str, int] = {}
        self._ring: dict[str, Fraction] = {}  # exact, so sums do not drift

    def _add(self, op: str, nbytes: int, ring: Fraction) -> None:
        self._calls[op] = self._calls.get(op, 0) + 1
        self._bytes[op] = self._bytes.get(op, 0) + nbytes
        self._ring[op] = self._ring.get(op, Fraction(0)) + ring

    def summary(self) -> dict[str, dict]:
        """{op: {"calls": int, "bytes": int, "ring_bytes": float}} for ops that were called."""
        return {op: {"calls": self._calls[op], "bytes": self._bytes[op],
                     "ring_bytes": float(self._ring[op])} for op in self._calls}

    @property
    def total_bytes(self) -> int:
        return sum(self._bytes.values())

    @property
    def total_ring_bytes(self) -> float:
        """Bytes this rank sends under the ring model, summed over the calls."""
        return float(sum(self._ring.values(), Fraction(0)))

    def __repr__(self) -> str:
        return f"CollectiveCounter({self.summary()})"


def _group_size(group) -> int:
    return dist.get_world_size(group) if group is not None else dist.get_world_size()


def _counting(op: str, original, counter: CollectiveCounter):
    kind, payload = _OPS[op]
    sig = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        nbytes = payload(a)
        n = _group_size(a.get("group"))
        ring = nbytes * busbw_ratio(kind, n) if kind else Fraction(0)
        counter._add(op, nbytes, ring)  # async ops count at call time
        start = now()
        result = original(*args, **kwargs)
        if counter.record_spans:
            record(op, start, now(), nbytes, n=n, ring_bytes=float(ring),
                   async_op=bool(a.get("async_op", False)) or op in ("isend", "irecv"))
        return result

    return wrapper


@contextlib.contextmanager
def count_collectives(spans: bool = False):
    """Count torch.distributed collectives called inside the block.

    Replaces the functions in the ``torch.distributed`` namespace listed in
    COUNTED_OPS and puts the originals back on exit, even after an error.
    Only calls made through ``torch.distributed.<op>`` are seen: code that
    did ``from torch.distributed import all_reduce`` earlier, DDP's C++
    reducer, DTensor/functional collectives and batch_isend_irecv bypass it.
    With spans=True each call is also recorded as a span named after the op
    (for async ops the span covers only the launch, with meta async_op=True).
    """
    counter = CollectiveCounter(spans)
    saved = {op: getattr(dist, op) for op in COUNTED_OPS}
    try:
        for op, fn in saved.items():
            setattr(dist, op, _counting(op, fn, counter))
        yield counter
    finally:
        for op, fn in saved.items():
            setattr(dist, op, fn)


# ---------------------------------------------------------------- memory
def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (shared storage counts once)."""
    seen: dict[tuple, int] = {}
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        if hasattr(t, "to_local"):  # DTensor: count the local shard
            t = t.to_local()
        st = t.untyped_storage()
        key = (t.device, st.data_ptr()) if st.data_ptr() else ("tensor", id(t))
        seen[key] = max(seen.get(key, 0), st.nbytes())
    return sum(seen.values())



def state_bytes(model, optimizer=None) -> dict[str, int]:
    """Bytes this rank holds in parameters, gradients and optimizer state.

    Counts distinct storages (``untyped_storage().data_ptr()``), so tied
    weights, or grads that are views of one DDP bucket, count once, and a
    tensor that views part of a bigger storage counts the whole storage.
    Optimizer state includes every tensor in ``optimizer.state``, the scalar
    step counters too (Adam keeps one fp32 ``step`` per parameter tensor:
    4 bytes each).  Buffers and activations are not included.
    Returns {"params", "grads", "optimizer", "total"}.
    """
    params = list(model.parameters())
    out = {"params": storage_bytes(params), "grads": storage_bytes(p.grad for p in params)}
    opt = []
    if optimizer is not None:
        for state in optimizer.state.values():
            opt.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    out["optimizer"] = storage_bytes(opt)
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def cuda_peak_bytes(device=None) -> int | None:
    """torch.cuda.max_memory_allocated(device), or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    return torch.cuda.max_memory_allocated(device)


def reset_cuda_peak(device=None) -> None:
    """Start a new peak-memory measurement (no-op without CUDA)."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats(device)
