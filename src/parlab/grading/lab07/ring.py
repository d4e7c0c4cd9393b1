"""Lab 07, exercise 1: ring attention, its cases, the reference, the grader and the rules.

The student's ``ring_attention(q, k, v, positions, causal)`` runs on every
rank with this rank's chunk of queries, keys and values, each of shape
(B, H, L, D), and ``positions``, a (c, L) LongTensor: row j holds the
global token positions of rank j's chunk (``arange`` rows for the plain
split, head and tail halves for the zig-zag one).  It returns this rank's
chunk of the attention output.  The reference is
``scaled_dot_product_attention`` on the whole sequence, in one process,
float64; forward and backward (the gradients of q, k and v against a fixed
upstream gradient) are compared chunk by chunk.

Hints follow ``diagnosis``: a mistake is named when every rank's output (or
dk/dv) is what that mistake gives and no other known mistake's is (the
scores unscaled or scaled by 1/D, no causal mask, the blocks' softmaxes
averaged or summed; dk/dv of the rank's own queries only, or every part
computed but held one hop short of its owner); the causal mask is named when
only causal cases fail after a non-causal one passed.  Otherwise the message
says which tensor differs on which rank.  Rules are judged on the spy's calls
and ``recorder`` events.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from ... import check
from ..diagnosis import diagnose, hint
from ..harness import Graded, Rule
from ..plain import plain
from ..records import calls, describe, events
from . import recorder


@dataclass(frozen=True)
class RingCase:
    """One input: shapes (batch, heads, sequence, head dim), the mask and the split."""

    b: int = 1
    h: int = 2
    s: int = 12
    d: int = 4
    causal: bool = False
    layout: str = "contiguous"  # or "zigzag"
    seed: int = 0

    def describe(self, n: int) -> str:
        return (f"q, k, v of shape ({self.b}, {self.h}, {self.s}, {self.d}) split "
                f"{self.layout}, causal={self.causal}, world_size {n}")

    def tensors(self) -> dict:
        g = torch.Generator().manual_seed(7000 + self.seed)
        shape = (self.b, self.h, self.s, self.d)
        return {k: torch.randn(shape, generator=g, dtype=torch.float64) for k in ("q", "k", "v", "dout")}


def layout_positions(s: int, c: int, layout: str) -> torch.Tensor:
    """(c, s/c) global positions per rank: contiguous chunks, or zig-zag (chunks r and 2c-1-r of 2c)."""
    parts = 2 * c if layout == "zigzag" else c
    if s % parts:
        raise ValueError(f"sequence length {s} is not divisible by {parts} ({layout} split over {c} "
                         f"ranks): pad the sequence to a multiple of {parts}")
    chunks = torch.arange(s).view(parts, s // parts)
    if layout == "contiguous":
        return chunks
    return torch.stack([torch.cat([chunks[r], chunks[2 * c - 1 - r]]) for r in range(c)])


def reference(case: RingCase, scale: float | None = None) -> dict:
    """Attention on the whole sequence; the scale is 1/√D unless given (the hint tries 1)."""
    t = case.tensors()
    q, k, v = (t[n].clone().requires_grad_() for n in "qkv")
    out = F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, scale=scale)
    out.backward(t["dout"])
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


# ---------------------------------------------------------------- on the ranks
def run(fn, case: RingCase, i: int, spy) -> dict:
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    pos = layout_positions(case.s, n, case.layout)  # (n, s/n): each rank's global positions
    t = case.tensors()  # q, k, v, dout: (b, h, s, d), the whole sequence
    leaves = {k: t[k][:, :, pos[rank]].clone().requires_grad_() for k in "qkv"}  # (b, h, s/n, d)
    q, k, v = (leaves[k] * 1 for k in "qkv")  # non-leaf inputs, as inside a model
    given = pos.clone()
    spy.guard(q=q, k=k, v=v, positions=given)
    with spy.watch(), recorder.watching(spy):
        out = fn(q, k, v, given, case.causal)
        if not isinstance(out, torch.Tensor):
            return {"out": repr(out)[:100]}
        spy.note("backward")
        if out.requires_grad and out.shape == q.shape:
            out.backward(t["dout"][:, :, pos[rank]])
    # out, dq, dk, dv: (b, h, s/n, d), this rank's positions only
    return {"out": plain(out), **{f"d{k}": plain(leaves[k].grad) for k in "qkv"}}


def settle(result: dict, case: RingCase, i: int, n: int) -> bool:
    import torch.distributed as dist

    if not isinstance(result.get("out"), torch.Tensor):
        return False
    rank, ref = dist.get_rank(), reference(case)
    pos = layout_positions(case.s, n, case.layout)[rank]
    return all(check.same_values(result[key], ref[key][:, :, pos]) for key in ("out", "dq", "dk", "dv"))


# ---------------------------------------------------------------- grader
def _wrong(got: list, want: torch.Tensor, pos: torch.Tensor, name: str) -> str | None:
    for r, t in enumerate(got):
        if t is None:
            return (f"{name} is None on rank {r}: backward did not reach that input. Write the ring as "
                    "a torch.autograd.Function whose backward returns dq, dk and dv.")
        try:
            check.assert_close(t, want[:, :, pos[r]], name=name, rank=r)
        except AssertionError as err:
            return str(err)
    return None


_RESCALE = ("partial results of different chunks must be merged with the online-softmax rescaling: keep "
            "each query's running max (or log-sum-exp) and, when a new chunk's block arrives, multiply the "
            "output so far by exp(old − new) before adding the block's part, and divide by the total "
            "normaliser at the end. Averaging or summing the blocks' softmaxes gives a different answer.")
_MASK = ("the non-causal cases pass, so the causal mask is wrong. Compare global positions: a query at "
         "position p sees the keys at positions <= p, so chunks wholly before it are attended fully, its "
         "own diagonal block is triangular, and blocks after it not at all (with the zig-zag split a "
         "rank's chunk is two halves: use `positions`, not a lower triangle on every block).")
_OWN_ONLY = ("every rank's dk and dv are what its own queries alone contribute to its own chunk: the "
             "contributions of the other ranks' queries never arrived. Each rank's queries contribute to "
             "the gradients of every chunk they attended to; those dk/dv parts must travel around the ring "
             "with K and V and arrive back at the rank that owns the chunk, where they are summed.")
_HOP_SHORT = ("every part of dk and dv was computed (their sum over the ranks is right), but each rank "
              "holds the gradient of the chunk one hop further along the ring, not its own: the dk/dv "
              "parts must travel one more hop after the last block, to the rank that owns the chunk.")


def _dkdv_hint(case: RingCase, got: list, pos: torch.Tensor) -> str:
    """The known mistake whose dk and dv every rank returned, with the output and dq right, or "".

    Signatures, from the reference's probabilities on the whole sequence: "own only", rank r's
    queries' contributions to chunk r alone; "hop short", the right gradient of the chunk of rank
    r + 1 (or r - 1, a ring run the other way) on rank r.
    """
    n, t = len(got), case.tensors()
    q, k, v, dout = (t[x] for x in ("q", "k", "v", "dout"))
    scale = case.d ** -0.5
    s = q @ k.transpose(-1, -2) * scale  # (b, h, s, s): every query against every key
    if case.causal:
        s = s.masked_fill(torch.ones(case.s, case.s, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.softmax(s, -1)
    out = p @ v
    ds = p * (dout @ v.transpose(-1, -2) - (dout * out).sum(-1, keepdim=True))
    ref = reference(case)
    own = {"dk": [ds[:, :, pos[r]][..., pos[r]].transpose(-1, -2) @ q[:, :, pos[r]] * scale for r in range(n)],
           "dv": [p[:, :, pos[r]][..., pos[r]].transpose(-1, -2) @ dout[:, :, pos[r]] for r in range(n)]}
    def holds_chunk_of(r: int, way: int) -> bool:
        return all(check.same_values(got[r][x], ref[x][:, :, pos[(r + way) % n]]) for x in ("dk", "dv"))

    # one hop short the same way round on every rank: each chunk's whole gradient is on exactly one rank
    short = n > 1 and any(all(holds_chunk_of(r, way) for r in range(n)) for way in (1, -1))
    pieces = []
    for r, res in enumerate(got):
        fits = {}
        if all(check.same_values(res[x], own[x][r]) for x in ("dk", "dv")):
            fits["own only"] = _OWN_ONLY
        if short:
            fits["hop short"] = _HOP_SHORT
        pieces.append(fits)
    return diagnose(pieces)


def _blockwise(case: RingCase, n: int, merge: str) -> torch.Tensor:
    """The output when each rank's key chunk (a block) is softmaxed on its own and the blocks' outputs
    are averaged (``merge="mean"``, over the blocks a query saw) or summed: no online rescaling."""
    t = case.tensors()
    q, k, v = t["q"], t["k"], t["v"]
    pos = layout_positions(case.s, n, case.layout)
    out, seen = torch.zeros_like(q), torch.zeros(q.shape[:-1] + (1,), dtype=q.dtype)
    for j in range(n):
        s = q @ k[:, :, pos[j]].transpose(-1, -2) * q.shape[-1] ** -0.5  # (b, h, s, s/n)
        if case.causal:
            s = s.masked_fill(pos[j][None, :] > torch.arange(case.s)[:, None], float("-inf"))
        saw = torch.isfinite(s).any(-1, keepdim=True)
        p = torch.where(saw, torch.softmax(s.masked_fill(~saw, 0.0), -1), 0.0)
        out, seen = out + p @ v[:, :, pos[j]], seen + saw.to(q.dtype)
    return out / seen if merge == "mean" else out


_UNSCALED = ("the scores were left unscaled: multiply q·kᵀ by the softmax scale 1/√D (D = q.shape[-1], "
             "scaled_dot_product_attention's default), in forward and backward.")


def _output_hint(case: RingCase, got: list, want: torch.Tensor, pos: torch.Tensor) -> str:
    """The mistake whose output every rank returned, when exactly one known mistake gives it: the
    scores unscaled or scaled by 1/D, no causal mask, the blocks' softmaxes averaged or summed."""
    n, d = len(got), case.d
    variants = {"unscaled": (reference(case, scale=1.0)["out"], _UNSCALED),
                "1/D": (reference(case, scale=1.0 / d)["out"], "the scores were scaled by 1/D; the "
                        "softmax scale is 1/√D (D = q.shape[-1]), in forward and backward."),
                "mean": (_blockwise(case, n, "mean"), _RESCALE),
                "sum": (_blockwise(case, n, "sum"), _RESCALE)}
    if case.causal:
        variants["no mask"] = (reference(replace(case, causal=False))["out"], "the output is non-causal attention: every query "
                               "saw every key. Mask the keys at later global positions (`positions`).")
    variants = {k: v for k, v in variants.items() if not check.same_values(v[0], want)}
    return diagnose([{name: why for name, (out, why) in variants.items()
                      if isinstance(t, torch.Tensor) and t.shape == out[:, :, pos[r]].shape
                      and check.same_values(t, out[:, :, pos[r]])} for r, t in enumerate(got)])


def grade(g: Graded) -> str | None:
    done = min(len(r) for r in g.results)
    for i, case in enumerate(g.cases[:done]):
        res = g.at(i)
        bad = [(r, o) for r, o in enumerate(res) if not isinstance(o.get("out"), torch.Tensor)]
        if bad:
            return f"{g.name} returned {bad[0][1]['out']} on rank {bad[0][0]}, not a tensor ({case.describe(g.n)})."
        ref, pos = reference(case), layout_positions(case.s, g.n, case.layout)
        if any(o["out"].shape != ref["out"][:, :, pos[r]].shape for r, o in enumerate(res)):
            return (f"{g.name} returned shape {tuple(res[0]['out'].shape)} for {case.describe(g.n)}; "
                    "return this rank's chunk of the output, shaped like q.")
        wrong = _wrong([o["out"] for o in res], ref["out"], pos, "output")
        if wrong:
            named = _output_hint(case, [o["out"] for o in res], ref["out"], pos)
            if not named and case.causal and _passed_plain(g, i):
                named = _MASK
            return f"{g.name}'s output is wrong for {case.describe(g.n)}.\n{wrong}" + hint(named)
        wrong = _wrong([o["dq"] for o in res], ref["dq"], pos, "dq")
        if wrong:
            return (f"{g.name}'s gradient of q is wrong for {case.describe(g.n)}.\n{wrong}\nHint: backward "
                    "recomputes each block's probabilities P = exp(q·kᵀ·scale − lse) and adds "
                    "(P ∘ (dout·vᵀ − rowsum(dout ∘ out)))·k·scale over every block the query saw.")
        for key in ("dk", "dv"):
            wrong = _wrong([o[key] for o in res], ref[key], pos, key)
            if wrong:
                named = _dkdv_hint(case, res, pos) if all(
                    isinstance(o.get(x), torch.Tensor) and o[x].shape == o["out"].shape
                    for o in res for x in ("dk", "dv")) else ""
                return (f"{g.name}'s {key} is wrong for {case.describe(g.n)} (its output and dq are "
                        f"right).\n{wrong}" + hint(named))
    return None


def _passed_plain(g: Graded, i: int) -> bool:
    """Whether a non-causal case before case i passed (so only the mask can be wrong)."""
    return any(not c.causal for c in g.cases[:i])


# ---------------------------------------------------------------- rules
P2P = ("isend", "irecv", "send", "recv")


def _ring_only(records, case, n):
    chunk = case.b * case.h * (case.s // n) * case.d
    for r, rec in enumerate(records):
        for c in calls(rec):
            if c["op"] not in P2P:
                return (f"rank {r} called {describe(rec, c)}: K and V must travel around the ring by "
                        "point-to-point messages only (an all-gather holds the whole K/V on every rank, "
                        "which is what context parallelism avoids).")
            if c["numel"] > 4 * chunk:
                return (f"rank {r} sent or received {c['numel']} elements in one message; one rank's K, V "
                        f"(and in backward dK, dV) chunks are at most {4 * chunk}.")
        wrong = _direction(r, n, calls(rec, backward=False), forward=True)
        wrong = wrong or _direction(r, n, calls(rec, backward=True), forward=False)
        if wrong:
            return wrong
    return None


def _direction(r: int, n: int, calls: list, forward: bool) -> str | None:
    """Whether one pass's messages keep to the ring: forward r -> r + 1, backward one way or the other."""
    sends = {c["peer"] for c in calls if c["op"] in ("isend", "send")}
    recvs = {c["peer"] for c in calls if c["op"] in ("irecv", "recv")}
    nxt, prev = (r + 1) % n, (r - 1) % n
    if sends <= {nxt} and recvs <= {prev}:
        return None
    if forward:
        return (f"in forward rank {r} sent to ranks {sorted(sends)} and received from ranks {sorted(recvs)}: "
                f"the ring runs forward, each rank sending only to its next neighbour, rank (r + 1) mod c "
                f"= {nxt}, and receiving only from rank (r − 1) mod c = {prev} (at step i rank r holds the "
                "chunk of rank (r − i) mod c).")
    if sends <= {prev} and recvs <= {nxt}:
        return None  # backward may run the ring the other way (TransformerEngine's does)
    return (f"in backward rank {r} sent to ranks {sorted(sends)} and received from ranks {sorted(recvs)}: "
            f"backward runs the ring too (either way round, but one way: send to {nxt} and receive from "
            f"{prev}, or send to {prev} and receive from {nxt}). dK and dV travel with K and V, one hop at "
            "a time, not straight to the rank that owns them.")


def _overlap(records, case, n):
    if n == 1:
        return None
    for r, rec in enumerate(records):
        forward = events(rec, backward=False)  # compute, sent, received: in the order they happened
        first = next((i for i, e in enumerate(forward) if e["event"] == "compute"), None)
        if first is None:
            continue
        if not any(e["event"] == "sent" for e in forward[:first]):
            return (f"rank {r} computed attention before posting any send: post the send of the chunk "
                    "you hold (and the receive of the next) first, then compute on it while it travels.")
        for i, e in enumerate(forward):
            if e["event"] == "compute" and _sent_after(e, forward[i + 1:]):
                return (f"rank {r} computed on a K/V chunk and only then posted its send to the next rank: "
                        "post the send first, so the transfer overlaps the compute.")
    return None


def _sent_after(compute: dict, later: list) -> bool:
    """Whether a storage computed on is sent later before anything is received into it again.

    ``later``: the events after the compute, in order (within one ``batch_isend_irecv`` the order
    its ops are listed in, which is not an order of posting: they are posted together).
    """
    storages = set(compute["storages"])
    for m in later:
        if m["event"] not in ("sent", "received") or not storages & set(m["storages"]):
            continue
        if m["event"] == "sent":
            return True
        storages -= set(m["storages"])  # refilled by a receive: a new chunk in an old buffer
    return False


def _unchanged(records, case, n):
    for r, rec in enumerate(records):
        if rec["mutated"]:
            return (f"rank {r} modified {', '.join(rec['mutated'])} in place: compute into new tensors "
                    "(the caller, and autograd, still need the inputs).")
    return None


RULES = (
    Rule("No all-gather of the whole K/V: K and V travel by point-to-point messages (`dist.isend`/"
         "`dist.irecv`, or `dist.batch_isend_irecv`), one chunk at a time (K and V as one message or two; "
         "no message larger than four chunks). In forward each rank sends only to its next neighbour, "
         "rank (r + 1) mod c, and receives only from rank (r − 1) mod c. Backward runs the ring too, "
         "either way round but one way only; dK and dV travel with K and V, one hop at a time, not "
         "straight to the rank that owns them.", _ring_only),
    Rule("In forward, the next chunk's send is posted before the current chunk's attention is computed "
         "(the transfer overlaps the compute): never compute on a chunk and only then send it on.",
         _overlap),
    Rule("No input is modified in place: `q`, `k`, `v` and `positions` keep their values.", _unchanged),
)

ON_HANG = ("in a ring where every rank first calls a blocking dist.send, nobody reaches its recv: gloo's "
           "send completes only once the neighbour posts the matching receive. Post the send and the "
           "receive together with dist.isend/dist.irecv (or dist.batch_isend_irecv) and wait on both.")

#: Test sets: ((world size, cases), ...).
VISIBLE = ((3, (RingCase(s=12), RingCase(s=12, causal=True, seed=1),
                RingCase(b=2, h=1, s=12, d=3, causal=True, layout="zigzag", seed=2))),)
HIDDEN = ((2, (RingCase(s=8, seed=3), RingCase(s=8, h=3, causal=True, seed=4),
               RingCase(s=16, causal=True, layout="zigzag", seed=5))),)
#: Only in tests/ranks/test_lab07.py (4 ranks cost a launch the notebook's budget has no room for).
FOUR_RANKS = ((4, (RingCase(s=8, seed=6), RingCase(s=16, causal=True, seed=7),
                   RingCase(s=16, causal=True, layout="zigzag", seed=8))),)
