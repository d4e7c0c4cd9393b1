"""Lab 08, Exercise 2: the global gradient norm and clipping when no rank holds every gradient.

The student writes ``clip_grad_norm_sharded(sharded, replicated, max_norm)``:
``sharded`` are the parameters whose gradient is split over the ranks (each
rank holds another piece), ``replicated`` those every rank holds whole, with
the same gradient.  It returns the norm of the whole model's gradient and
scales every gradient in place as ``torch.nn.utils.clip_grad_norm_`` would.

On every rank the check computes parlab's GPT's gradients in one process
(the same everywhere), then hands the rank its pieces, in one of two layouts:

- ``tp``: Megatron's tensor parallelism (Shoeybi et al. 2019, §3): the Q, K, V and
  MLP-up weights and biases split by rows, the attention-output and MLP-down weights by
  columns; the norms, embeddings and the two row-parallel biases replicated;
- ``fsdp``: every parameter split by rows as FSDP2 does, ceil(rows / N) per rank (the
  last ranks fewer, some none).

The reference is ``torch.nn.utils.clip_grad_norm_`` on the whole model in one process.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ... import check
from .. import records as read
from ..diagnosis import diagnose
from ..harness import Graded, Rule
from ..plain import plain
from .rules import one_small_collective

COLUMN = ("attn.q.", "attn.k.", "attn.v.", "mlp.up.")
ROW = ("attn.o.weight", "mlp.down.weight")


def rows_of(total: int, rank: int, n: int) -> tuple[int, int]:
    """FSDP2's split of ``total`` rows: ceil(total / n) per rank, the last ranks fewer or none."""
    c = -(-total // n)
    return min(rank * c, total), min((rank + 1) * c, total)


@dataclass(frozen=True)
class ClipCase:
    layout: str                # "tp" or "fsdp"
    max_norm: float
    config: tuple = field(default_factory=tuple)
    seed: int = 5

    def describe(self, n: int) -> str:
        c = dict(self.config)
        what = ("tensor parallel (Megatron's column and row splits, norms and embeddings replicated)"
                if self.layout == "tp" else "FSDP2's row shards of every parameter")
        return (f"parlab's GPT (d_model {c['d_model']}, {c['n_layer']} block{'s' * (c['n_layer'] > 1)}) under {what}, "
                f"max_norm {self.max_norm:g}, world_size {n}")

    def grads(self) -> dict[str, torch.Tensor]:
        from ...models import lm_loss, tiny_gpt

        cfg = dict(self.config)
        model = tiny_gpt(seed=self.seed, **cfg)
        g = torch.Generator().manual_seed(self.seed + 1)
        idx = torch.randint(0, cfg["vocab_size"], (3, cfg["seq_len"] + 1), generator=g)
        lm_loss(model, idx[:, :-1], idx[:, 1:]).backward()
        return {k: p.grad.detach().clone() for k, p in model.named_parameters()}

    def placement(self, name: str) -> int | None:
        """The dimension ``name``'s gradient is split on, or None: replicated."""
        if self.layout == "fsdp":
            return 0
        if any(c in name for c in COLUMN):
            return 0
        if any(name.endswith(r) for r in ROW):
            return 1
        return None

    def piece(self, g: torch.Tensor, dim: int, rank: int, n: int) -> torch.Tensor:
        a, b = rows_of(g.shape[dim], rank, n)
        return g.narrow(dim, a, b - a)

    def split(self, rank: int, n: int):
        """{name: (dim or None, this rank's piece)} of every gradient."""
        return {k: (d, g if d is None else self.piece(g, d, rank, n))
                for k, g in self.grads().items() for d in [self.placement(k)]}


def reference(case: ClipCase) -> tuple[float, dict[str, torch.Tensor]]:
    grads = case.grads()
    params = {k: nn.Parameter(torch.zeros_like(g)) for k, g in grads.items()}
    for k, p in params.items():
        p.grad = grads[k].clone()
    total = float(torch.nn.utils.clip_grad_norm_(list(params.values()), case.max_norm))
    return total, {k: p.grad for k, p in params.items()}


# ---------------------------------------------------------------- on the ranks
def run(fn, case: ClipCase, i: int, spy) -> dict:
    import torch.distributed as dist

    from ...launch.runtime import device

    rank, n = dist.get_rank(), dist.get_world_size()
    names, sharded, replicated = [], [], []
    for k, (dim, g) in case.split(rank, n).items():
        p = nn.Parameter(torch.zeros(g.shape, device=device()))
        p.grad = g.clone().to(device())
        (replicated if dim is None else sharded).append(p)
        names.append((k, dim is None))
    with spy.watch():
        norm = fn(sharded, replicated, case.max_norm)
    shards, reps = iter(sharded), iter(replicated)
    out = {k: (next(reps) if rep else next(shards)).grad for k, rep in names}
    return {"norm": plain(norm, tensors="number", containers=(), as_float=True), "grads": plain(out)}


def settle(result: dict, case: ClipCase, i: int, n: int) -> bool:
    import torch.distributed as dist

    return _wrong(result, case, dist.get_rank(), n, *reference(case)) is None


def _wrong(res: dict, case: ClipCase, rank: int, n: int, total: float, clipped: dict) -> str | None:
    """What is wrong with one rank's result: "norm", "grads" or None."""
    norm = res["norm"]
    if not isinstance(norm, float | int) or abs(norm - total) > 1e-4 * total + 1e-6:
        return "norm"
    for k, (dim, _) in case.split(rank, n).items():
        want = clipped[k] if dim is None else case.piece(clipped[k], dim, rank, n)
        got = res["grads"].get(k)
        if not (isinstance(got, torch.Tensor) and got.shape == want.shape and bool(check.close_mask(got, want).all())):
            return "grads"
    return None


# ---------------------------------------------------------------- in the grader
def _squares(case: ClipCase, n: int) -> tuple[list[float], float]:
    """Each rank's sum of squares over its pieces of the split gradients, and the replicated ones'."""
    per_rank = [sum(float(g.double().pow(2).sum()) for d, g in case.split(r, n).values() if d is not None)
                for r in range(n)]
    rep = sum(float(g.double().pow(2).sum()) for d, g in case.split(0, n).values() if d is None)
    return per_rank, rep


def _near(a, b) -> bool:
    return abs(a - b) <= 1e-4 * abs(b) + 1e-6


def grade(g: Graded) -> str | None:
    for i, case in enumerate(g.cases[:min(len(r) for r in g.results)]):
        total, clipped = reference(case)
        for r, res in enumerate(g.at(i)):
            what = _wrong(res, case, r, g.n, total, clipped)
            if what:
                return _explain(g, case, r, res, what, total)
    return None


#: The known mistakes in the norm, and what each tells the student.
_NORM_MISTAKES = {
    "replicated n times": "the replicated parameters were counted {n} times, once per rank. Every rank holds "
                          "the same replicated gradients; add their squares once (not inside the all-reduce), "
                          "the split ones' squares summed over the ranks.",
    "own only": "that is the norm of this rank's own gradients only. Sum the squares over the ranks "
                "(all-reduce) before the square root.",
    "norms added": "the ranks' norms were added. Norms do not add; their squares do: all-reduce the sums of "
                   "squares, then take the square root.",
    "clipped norm": "that is the norm after clipping. Return the norm before clipping, as clip_grad_norm_ does.",
}


def _signatures(own: list[float], rep: float, r: int, n: int, total: float, max_norm: float) -> dict:
    """``{mistake: the norms rank r could return with it}`` (none where it cannot show), from each
    rank's sum of squares ``own`` and the replicated ones' ``rep`` (``_squares``)."""
    return {"replicated n times": ((sum(own) + n * rep) ** 0.5,) if rep else (),
            "own only": ((own[r] + rep) ** 0.5,),
            "norms added": (sum((o + rep) ** 0.5 for o in own), sum(o ** 0.5 for o in own) + rep ** 0.5),
            "clipped norm": (max_norm,) if total > max_norm else ()}


def _norm_evidence(g: Graded) -> tuple[list, list]:
    """Every case and rank the check ran, as ``diagnose`` reads them: the known mistakes each wrong
    norm fits, and, for each right norm, the mistakes that would have got it wrong."""
    wrong, right = [], []
    for i, case in enumerate(g.cases[:min(len(r) for r in g.results)]):
        total, _ = reference(case)
        own, rep = _squares(case, g.n)
        for r, res in enumerate(g.at(i)):
            got, sig = res["norm"], _signatures(own, rep, r, g.n, total, case.max_norm)
            if not isinstance(got, float | int):
                wrong.append({})
            elif _near(got, total):
                right.append([k for k, values in sig.items() if values and not any(_near(v, total) for v in values)])
            else:
                wrong.append({k: _NORM_MISTAKES[k].format(n=g.n) for k, values in sig.items()
                              if any(_near(got, v) for v in values)})
    return wrong, right


def _explain(g: Graded, case: ClipCase, r: int, res: dict, what: str, total: float) -> str:
    head = f"{g.name} is wrong for {case.describe(g.n)}: on rank {r}"
    own, rep = _squares(case, g.n)
    got = res["norm"]
    if what == "norm":
        if not isinstance(got, float | int):
            return f"{head} it returned {got!r}; return the total norm (a number or a 0-d tensor)."
        named = diagnose(*_norm_evidence(g))
        return f"{head} the norm is {got:.6g}, expected {total:.6g}" + (f": {named}" if named else ".")
    coef = _coefficient(case, r, g.n, res)
    want = min(1.0, case.max_norm / (total + 1e-6))
    if coef is not None and coef > 1.0 + 1e-5:
        return (f"{head} the gradients were multiplied by {coef:.4g}, expected {want:.4g}: a norm "
                f"({total:.4g}) below max_norm ({case.max_norm:g}) leaves the gradients as they are; "
                "the factor is min(1, max_norm / (norm + 1e-6)).")
    own_factor = case.max_norm / ((own[r] + rep) ** 0.5 + 1e-6)
    if coef is not None and _near(coef, own_factor) and not _near(own_factor, want):
        return (f"{head} the gradients were multiplied by {coef:.4g}, expected {want:.4g}: {coef:.4g} is "
                "max_norm over this rank's own norm, not over the total returned. Every rank scales by the "
                "same factor.")
    return (f"{head} the returned norm is right but the clipped gradients differ from "
            f"clip_grad_norm_'s (multiplied by {want:.4g}"
            + (f"; yours by {coef:.4g})." if coef is not None else ")."))


def _coefficient(case: ClipCase, r: int, n: int, res: dict) -> float | None:
    num = den = 0.0
    for k, (_, g) in case.split(r, n).items():
        got = res["grads"].get(k)
        if not isinstance(got, torch.Tensor) or got.shape != g.shape:
            return None
        num += float((got.double() * g.double()).sum())
        den += float((g.double() * g.double()).sum())
    return num / den if den else None


# ---------------------------------------------------------------- the rule
def one_number_per_rank(records, case, n) -> str | None:
    for r, rec in enumerate(records):
        if problem := one_small_collective(rec, read.calls(rec), r, n, "", "this rank's sum of squares"):
            return problem
    return None


RULES = (Rule("Agree on the norm with a single collective, of at most one number per rank (a sum of "
              "squares): never send the gradients themselves.", one_number_per_rank),)


def gpt(**cfg) -> tuple:
    return tuple(sorted(cfg.items()))


SMALL = gpt(vocab_size=40, d_model=12, n_head=2, n_layer=2, seq_len=6)
ODD = gpt(vocab_size=37, d_model=10, n_head=2, n_layer=1, seq_len=5, bias=False, tie_weights=False)
VISIBLE = ((3, (ClipCase("tp", 0.5, SMALL), ClipCase("fsdp", 0.5, SMALL))),)
HIDDEN = ((2, (ClipCase("tp", 1e3, ODD, seed=6), ClipCase("fsdp", 0.1, ODD, seed=7),
               ClipCase("tp", 0.05, SMALL, seed=8))),)
