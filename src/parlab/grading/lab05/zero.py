"""Lab 05, Exercises 3-5: ZeRO-1, -2 and -3 written by hand, trained against one process.

The student writes a class, ``ZeRO1(params, make_optimizer)``,
``ZeRO2(params, make_optimizer)`` or ``ZeRO3(layers, make_optimizer)``, with
``.step()``.  On every rank the check builds a small MLP (``Case``), lets the
answer shard it, and trains it a few steps, each rank on its own rows of the
global batch.  Every rank's parameters before each forward pass are compared
with a single-process run on the whole batch (SGD with momentum, and AdamW).
The parameters are read in forward pre-hooks that the grader registers after
the student's, so under ZeRO-3 they are read right after the student's
all-gather.  What each rank holds is measured there and after each step
(``rules.held``): a ZeRO-3 that never frees a gathered layer gives the right
numbers and still fails.  For ZeRO-1/2 the last case freezes two parameters
(``requires_grad=False``): only the trainable ones are sharded, and the
frozen ones must stay bit-identical, as with a single-process AdamW, which
skips a parameter whose ``.grad`` is None.  When the parameters differ,
``hints`` says how, ``states`` which state of the answer's optimizers first
differs (gradient, momentum, variance, master values, at which step, on
which rank), and a cause is named only when every rank's parameters are
what one known mistake gives and no other's (``reference``'s variants,
``diagnosis.diagnose``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from ... import check
from ...launch.runtime import device
from ..diagnosis import diagnose
from ..harness import Graded
from ..plain import plain
from . import hints, rules, states

INIT_SEED, DATA_SEED = 3, 17
ADAMW_TOLS = (1e-4, 1e-5)  # rtol, atol: AdamW divides by sqrt(v), which magnifies reduction noise


@dataclass(frozen=True)
class Case:
    """An MLP with these layer widths (Linear + Tanh), trained ``steps`` steps with ``optim``."""

    dims: tuple[int, ...]
    optim: str = "sgd"          # "sgd" (momentum 0.9) or "adamw"
    steps: int = 2
    rows: int = 2               # rows of the global batch per rank
    frozen: tuple[int, ...] = ()  # indices in model.parameters() order built with requires_grad=False

    @property
    def numel(self) -> int:
        """Every parameter element, frozen ones included (what the flat comparison reads)."""
        return sum(a * b + b for a, b in zip(self.dims, self.dims[1:]))

    def sizes(self) -> list[int]:
        """Elements of each parameter tensor, in ``model.parameters()`` order."""
        return [s for a, b in zip(self.dims, self.dims[1:]) for s in (a * b, b)]

    def names(self) -> list[str]:
        """The parameters' names in the ``nn.Sequential`` (``0.weight``, ``0.bias``, ``2.weight``, ...)."""
        return [f"{2 * (k // 2)}.{'bias' if k % 2 else 'weight'}" for k in range(len(self.sizes()))]

    @property
    def trainable(self) -> int:
        """Ψ: the elements of the parameters that require grad (the ones ZeRO shards)."""
        return sum(s for k, s in enumerate(self.sizes()) if k not in self.frozen)

    def frozen_mask(self) -> torch.Tensor:
        """(numel,) bool: True at the elements of the frozen parameters."""
        return torch.cat([torch.full((s,), k in self.frozen) for k, s in enumerate(self.sizes())])

    def describe(self, n: int) -> str:
        psi = self.trainable
        uneven = f", not divisible by world_size {n}" if psi % n else ""
        if self.frozen:
            names = ", ".join(self.names()[k] for k in self.frozen)
            shape = (f"with {names} frozen (requires_grad=False; Ψ = {psi} trainable of {self.numel} "
                     f"parameters{uneven})")
        else:
            shape = f"(Ψ = {psi} parameters{uneven})"
        return f"an MLP of widths {self.dims} {shape}, {self.optim}, {self.steps} steps, world_size {n}"

    def build(self) -> nn.Sequential:
        g = torch.Generator().manual_seed(INIT_SEED)
        layers: list[nn.Module] = []
        for a, b in zip(self.dims, self.dims[1:]):
            lin = nn.Linear(a, b)
            with torch.no_grad():
                lin.weight.copy_(torch.randn(b, a, generator=g) / a**0.5)
                lin.bias.copy_(torch.randn(b, generator=g) * 0.1)
            layers += [lin, nn.Tanh()]
        model = nn.Sequential(*layers[:-1])
        for k, p in enumerate(model.parameters()):
            p.requires_grad_(k not in self.frozen)
        return model

    def optimizer(self, tensors) -> torch.optim.Optimizer:
        if self.optim == "sgd":
            return torch.optim.SGD(tensors, lr=0.2, momentum=0.9)
        return torch.optim.AdamW(tensors, lr=0.02, weight_decay=0.1)

    @property
    def decay(self) -> float:
        """What one step's weight decay multiplies a parameter by (AdamW: 1 - lr · weight_decay)."""
        return 1 - 0.02 * 0.1 if self.optim == "adamw" else 1.0

    def batch(self, step: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(DATA_SEED + 100 * step + self.numel)
        return (torch.randn(self.rows * n, self.dims[0], generator=g),
                torch.randn(self.rows * n, self.dims[-1], generator=g))


def layers_of(model: nn.Module) -> list[nn.Module]:
    """The modules that hold parameters, in forward order (ZeRO-3's units)."""
    return [m for m in model if any(True for _ in m.parameters(recurse=False))]


def reference(case: Case, n: int, variant: str = "", rank: int = 0) -> list[torch.Tensor]:
    """Flat parameters before step 0, 1, ..., steps of single-process training on the whole batch.

    A ``variant`` is the same training with one known mistake, to recognise it by its parameters
    (``_named``): "fresh", a new optimizer every step (its momentum and variance lost); "own rows",
    ``rank``'s rows of the batch only (its gradient never reduced over the ranks); "summed" and
    "twice", every gradient ``n`` times and 1/``n`` of the average.
    """
    return [t.clone() for t in _trained(case, n, variant, rank)[0]]


def reference_steps(case: Case, n: int) -> tuple[dict, ...]:
    """Per step, what single-process training's optimizer stepped with and held after it
    (``states.reference_step``)."""
    return _trained(case, n, "", 0)[1]


@functools.lru_cache(maxsize=256)
def _trained(case: Case, n: int, variant: str, rank: int) -> tuple[tuple[torch.Tensor, ...], tuple[dict, ...]]:
    model = case.build()
    trainable = [p for p in model.parameters() if p.requires_grad]  # frozen ones never move
    opt = case.optimizer(trainable)
    flats, stepped = [], []
    scale = {"summed": n, "twice": 1 / n}.get(variant, 1)
    for s in range(case.steps + 1):
        flats.append(torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()]))
        if s < case.steps:
            x, y = case.batch(s, n)
            if variant == "own rows":
                x, y = x[rank * case.rows:(rank + 1) * case.rows], y[rank * case.rows:(rank + 1) * case.rows]
            if variant == "fresh":
                opt = case.optimizer(trainable)
            model.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            if scale != 1:
                for p in trainable:
                    p.grad.mul_(scale)
            opt.step()
            stepped.append(states.reference_step(opt, trainable))
    return tuple(flats), tuple(stepped)


# ---------------------------------------------------------------- on the ranks
def runner(stage: int):
    """The on-rank run of stage ``stage``'s answer: ZeRO-3 takes the layers, ZeRO-1/2 the parameters."""
    def run(cls, case: Case, i: int, spy) -> dict:
        import torch.distributed as dist

        rank, n = dist.get_rank(), dist.get_world_size()
        model = case.build().to(device())
        made: list[torch.optim.Optimizer] = []
        record = states.Recorder()  # what the optimizers were handed and stepped with

        def make_optimizer(tensors):
            tensors = list(tensors)
            opt = case.optimizer(tensors)
            made.append(opt)
            record.optimizer(opt, tensors)
            return opt

        with spy.watch():
            obj = cls(layers_of(model) if stage == 3 else list(model.parameters()), make_optimizer)
        flats: list[list] = []

        def look(mod, args, k):  # after the student's own pre-hooks: the gathered parameters
            flats[-1].append(flat(mod))  # (numel of layer k,): this layer, gathered or not
            spy.note("held", **rules.held(model, made, f"forward of layer {k}"))

        for k, layer in enumerate(layers_of(model)):
            layer.register_forward_pre_hook(lambda mod, args, k=k: look(mod, args, k))
        for s in range(case.steps + 1):
            record.phase = s
            # (rows, dims[0]) and (rows, dims[-1]): this rank's rows of the (rows·n, ...) global batch
            x, y = (t[rank * case.rows:(rank + 1) * case.rows].to(device()) for t in case.batch(s, n))
            flats.append([])
            with spy.watch():
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
            spy.note("held", **rules.held(model, made, f"backward {s}", obj))
            if s < case.steps:
                with spy.watch():
                    obj.step()
                spy.note("held", **rules.held(model, made, f"step {s}", obj))
            for p in model.parameters():
                p.grad = None
        spy.note("optimizers", optimizers=[rules.optimizer_facts(o) for o in made])
        # per step (numel,): every layer's parameters as the forward saw them, flat
        return {"flats": [plain(torch.cat(f)) if f else None for f in flats], "optimizers": record.result()}
    return run


def flat(mod: nn.Module) -> torch.Tensor:
    """(numel of ``mod``,): a copy of its parameters, flat."""
    return torch.cat([p.detach().reshape(-1).clone() for p in mod.parameters()])


def settle(result: dict, case: Case, i: int, n: int) -> bool:
    ref, frozen = reference(case, n), case.frozen_mask()
    return all(f is not None and f.shape == r.shape and bool(check.close_mask(f, r, *tols(case)).all())
               and torch.equal(f[frozen], r[frozen]) for f, r in zip(result["flats"], ref))


def tols(case: Case) -> tuple[float, float]:
    return ADAMW_TOLS if case.optim == "adamw" else (1e-5, 1e-6)


# ---------------------------------------------------------------- in the grader
def grade(g: Graded) -> str | None:
    for i, case in enumerate(g.cases[:min(len(r) for r in g.results)]):
        ref, frozen = reference(case, g.n), case.frozen_mask()
        for r, res in enumerate(g.at(i)):
            for s, (got, want) in enumerate(zip(res["flats"], ref)):
                where = f"{g.name} is wrong for {case.describe(g.n)}: on rank {r}"
                if got is None or got.shape != want.shape:
                    return f"{where}, the model's parameters could not be read before forward {s}."
                if not torch.equal(got[frozen], want[frozen]):
                    return hints.frozen_moved(where, s, got, want, case)
                bad = ~check.close_mask(got, want, *tols(case))
                if bool(bad.any()):
                    every = [other["flats"][s] for other in g.at(i)]
                    state = states.first_difference(case, g.n, s, g.at(i), ref, reference_steps(case, g.n))
                    return hints.wrong_params(where, s, got, want, ref, bad, case, g.n, every,
                                              _named(case, g.n, s, every), state)
    return None


def _mistakes(n: int) -> dict[str, str]:
    """The training mistakes recognised by the parameters they leave (``reference``'s variants,
    and "unreduced"), each with its sentence."""
    return {
        "fresh": "They are what training gives when the optimizer's state starts over at every step "
                 "(a new optimizer, or its state emptied): the momentum, and Adam's moments, are lost "
                 "between steps. Build each shard's optimizer once, in __init__, and keep stepping it.",
        "unreduced": "Each element is what training on the rows of the rank whose shard holds it gives: "
                     "each rank stepped its shard with its own gradient, never reduced over the ranks "
                     "(reduce-scatter the gradients, then average).",
        "summed": f"They are what training gives with every gradient {n}x the average, and {n} is "
                  "world_size: the gradients were summed over the ranks, not averaged (divide the "
                  "reduced sum by world_size).",
        "twice": f"They are what training gives with every gradient 1/{n} of the average, and {n} is "
                 "world_size: the gradients were divided by world_size twice.",
    }


def _unreduced(case: Case, n: int, s: int) -> torch.Tensor:
    """The parameters before forward ``s`` when each rank steps its shard (ceil(Ψ / N) trainable
    elements, in order) with the gradient of its own rows alone: every optimizer here is elementwise."""
    out = reference(case, n)[s]
    trainable = (~case.frozen_mask()).nonzero().flatten()
    chunk = -(-case.trainable // n)
    for r in range(n):
        mine = trainable[r * chunk:(r + 1) * chunk]
        out[mine] = reference(case, n, "own rows", r)[s][mine]
    return out


def _named(case: Case, n: int, s: int, every: list) -> str:
    """The one known mistake whose parameters every rank holds before forward ``s``, or "": each
    rank is a piece, and a mistake is named when its parameters match on every rank and no other
    mistake's do (with n = 1 "summed" and "twice" are the reference, and never match)."""
    expected = {"fresh": reference(case, n, "fresh")[s], "unreduced": _unreduced(case, n, s),
                "summed": reference(case, n, "summed")[s], "twice": reference(case, n, "twice")[s]}
    pieces = []
    for got in every:
        fits = {}
        for variant, sentence in _mistakes(n).items():
            want = expected[variant]
            if (isinstance(got, torch.Tensor) and got.shape == want.shape
                    and bool(check.close_mask(got, want, *tols(case)).all())):
                fits[variant] = sentence
        pieces.append(fits)
    return diagnose(pieces)


# ---------------------------------------------------------------- the cases
LAYERS_VISIBLE = ((3, (Case((4, 6, 5, 3)), Case((5, 4, 4, 2), "adamw"), Case((3, 4, 3, 4, 2)))),)
LAYERS_HIDDEN = ((4, (Case((4, 6, 5, 3), steps=3), Case((2, 3, 5, 1), "adamw"), Case((4, 4, 4, 4)))),)
# ZeRO-1/2 take the model's parameters, frozen ones included (as CS336's sharded-optimizer test
# does): a last case with two of them frozen, under AdamW, whose weight decay would move a frozen
# parameter whose gradient was filled with zeros.  (ZeRO-3 takes layers; its cases have none.)
FROZEN_VISIBLE = Case((5, 4, 4, 2), "adamw", frozen=(1, 2))
FROZEN_HIDDEN = Case((3, 5, 4, 2), "adamw", frozen=(1, 4))
PARAMS_VISIBLE = tuple((n, cases + (FROZEN_VISIBLE,)) for n, cases in LAYERS_VISIBLE)
PARAMS_HIDDEN = tuple((n, cases + (FROZEN_HIDDEN,)) for n, cases in LAYERS_HIDDEN)

ON_HANG = ("every rank must call the same collectives in the same order with the same sizes: pad "
           "the flat vector to a multiple of world_size so that every shard has ceil(Ψ / N) elements.")
ON_MISMATCH = ("all_gather_single/reduce_scatter_single need an output of exactly world_size × the "
               "input's elements: pad the flat vector to ceil(Ψ / N) · N elements.")
