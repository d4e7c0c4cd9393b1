"""Checks for Lab 05: sharding (ZeRO-1/2/3 by hand), on the grading harness.

    lab05.check_memory(zero_bytes_per_rank)       # Exercise 1: model-state bytes per rank
    lab05.check_comm(zero_comm_bytes_per_rank)    # Exercise 2: bytes each rank sends per step
    lab05.check_zero1(ZeRO1)                      # Exercise 3: optimizer states sharded
    lab05.check_zero2(ZeRO2)                      # Exercise 4: gradients sharded too
    lab05.check_zero3(ZeRO3)                      # Exercise 5: parameters sharded too
    lab05.check_fsdp2(shard_with_fsdp2)           # Exercise 6: FSDP2, gradients match DDP

The ZeRO exercises train a small MLP (``Case``) for a few steps, each rank on
its own rows of the global batch, and compare every rank's parameters before
each forward pass with a single-process run on the whole batch (SGD with
momentum, and AdamW).  The parameters are read in forward pre-hooks that the
grader registers after the student's, so under ZeRO-3 they are read right
after the student's all-gather.  What each rank holds is measured there and
after each step, in storage bytes (``rules``): a ZeRO-3 that never
frees a gathered layer gives the right numbers and still fails.
For ZeRO-1/2 the last case freezes two parameters (``requires_grad=False``):
only the trainable ones are sharded, and the frozen ones must stay bit-identical,
as with a single-process AdamW, which skips a parameter whose ``.grad`` is None.
Exercise 6 (``fsdp``) applies FSDP2's ``fully_shard`` to parlab's GPT
and compares the full gradients with DDP's.
References: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models" (SC20), §5 and §7.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ... import check
from ...cost import zero_comm_elems, zero_memory_per_gpu
from ...launch.runtime import device
from . import fsdp
from . import rules
from ..calls import NO_COST_SAYS, no_cost_calls, watched_cost_call
from ..harness import Exercise, Graded, Rule, checker
from ..numbers import assert_number, plain_number

__all__ = ["check_memory", "check_comm", "check_zero1", "check_zero2", "check_zero3",
           "check_fsdp2", "Case", "EXERCISES"]

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


def reference(case: Case, n: int) -> list[torch.Tensor]:
    """Flat parameters before step 0, 1, ..., steps of single-process training on the whole batch."""
    model = case.build()
    opt = case.optimizer([p for p in model.parameters() if p.requires_grad])  # frozen ones never move
    flats = []
    for s in range(case.steps + 1):
        flats.append(torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()]))
        if s < case.steps:
            x, y = case.batch(s, n)
            model.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    return flats


# ---------------------------------------------------------------- on the ranks
#: Collectives newer than the spy's list: recorded the same way while the answer runs.
_NEW_NAMES = ("all_gather_single", "reduce_scatter_single")


def _watch(spy):
    """``spy.watch()``, also recording the ``*_single`` collectives torch 2.13 prefers."""
    import contextlib

    import torch.distributed as dist

    @contextlib.contextmanager
    def watching():
        with spy.watch():
            saved = {op: getattr(dist, op) for op in _NEW_NAMES if hasattr(dist, op)}
            for op, fn in saved.items():
                setattr(dist, op, spy._wrap_dist(op.replace("_single", "_tensor")
                                                 .replace("all_gather_tensor", "all_gather_into_tensor"), fn))
            try:
                yield
            finally:
                for op, fn in saved.items():
                    setattr(dist, op, fn)
    return watching()


def _run(stage: int):
    def run(cls, case: Case, i: int, spy) -> dict:
        import torch.distributed as dist

        rank, n = dist.get_rank(), dist.get_world_size()
        model = case.build().to(device())
        made: list[torch.optim.Optimizer] = []

        def make_optimizer(tensors):
            opt = case.optimizer(list(tensors))
            made.append(opt)
            return opt

        with _watch(spy):
            obj = cls(layers_of(model) if stage == 3 else list(model.parameters()), make_optimizer)
        flats: list[list] = []

        def look(mod, args, k):  # after the student's own pre-hooks: the gathered parameters
            flats[-1].append(_flat(mod))
            spy.note("held", **rules.held(model, made, f"forward of layer {k}"))

        for k, layer in enumerate(layers_of(model)):
            layer.register_forward_pre_hook(lambda mod, args, k=k: look(mod, args, k))
        for s in range(case.steps + 1):
            x, y = (t[rank * case.rows:(rank + 1) * case.rows].to(device()) for t in case.batch(s, n))
            flats.append([])
            with _watch(spy):
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
            spy.note("held", **rules.held(model, made, f"backward {s}", obj))
            if s < case.steps:
                with _watch(spy):
                    obj.step()
                spy.note("held", **rules.held(model, made, f"step {s}", obj))
            for p in model.parameters():
                p.grad = None
        spy.note("optimizers", optimizers=[rules.optimizer_facts(o) for o in made])
        return {"flats": [torch.cat(f).cpu() if f else None for f in flats]}
    return run


def _flat(mod: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in mod.parameters()]).cpu()


def _settle(result: dict, case: Case, i: int, n: int) -> bool:
    ref, frozen = reference(case, n), case.frozen_mask()
    return all(f is not None and f.shape == r.shape and bool(check.close_mask(f, r, *_tols(case)).all())
               and torch.equal(f[frozen], r[frozen]) for f, r in zip(result["flats"], ref))


def _tols(case: Case) -> tuple[float, float]:
    return ADAMW_TOLS if case.optim == "adamw" else (1e-5, 1e-6)


# ---------------------------------------------------------------- graders
def _grade_training(g: Graded) -> str | None:
    for i, case in enumerate(g.cases[:min(len(r) for r in g.results)]):
        ref, frozen = reference(case, g.n), case.frozen_mask()
        for r, res in enumerate(g.at(i)):
            for s, (got, want) in enumerate(zip(res["flats"], ref)):
                where = f"{g.name} is wrong for {case.describe(g.n)}: on rank {r}"
                if got is None or got.shape != want.shape:
                    return f"{where}, the model's parameters could not be read before forward {s}."
                if not torch.equal(got[frozen], want[frozen]):
                    return rules.frozen_moved(where, s, got, want, case)
                bad = ~check.close_mask(got, want, *_tols(case))
                if bool(bad.any()):
                    return rules.wrong_params(where, s, got, want, ref, bad, case, g.n,
                                              [other["flats"][s] for other in g.at(i)])
    return None


def _prediction_grader(call: str, want, mistakes, unit: str):
    def grade(g: Graded) -> str | None:
        for i, args in enumerate(g.cases[:len(g.results[0])]):
            shown = call.format(*args)
            try:
                assert_number(g.results[0][i], want(*args), shown, mistakes(*args), unit=unit)
            except AssertionError as err:
                return str(err)
        return None
    return grade


def _run_prediction(fn, args, i, spy):
    return plain_number(watched_cost_call(spy, fn, *args))


def _memory_mistakes(psi, n, stage):
    s = (stage + 1) % 4
    return [(zero_memory_per_gpu(psi, n, s), f"That is stage {s}'s memory, not stage {stage}'s."),
            (zero_memory_per_gpu(psi, n, stage, optim_bytes=8),
             "Adam's 12 bytes are the fp32 master weights (4) plus momentum and variance (4 + 4): "
             "the master copy is missing."),
            (zero_memory_per_gpu(psi, n, stage) / 1e9, "Return bytes, not GB."),
            (zero_memory_per_gpu(psi, 1, stage), "Nothing is divided by the number of ranks N.")]


def _comm_mistakes(psi, n, stage, b):
    k = 3 if stage == 3 else 2
    right = zero_comm_elems(psi, n, stage) * b
    first = []
    if stage in (1, 2):
        first = [(zero_comm_elems(psi, n, 3) * b,
                  f"That is 3(N − 1)/N·Ψ, ZeRO-{stage} as Exercise 3's ZeRO1 runs it (an all-reduce, "
                  "2(N − 1)/N·Ψ, then the all-gather of the updated shards, (N − 1)/N·Ψ). This "
                  "exercise counts stages 1 and 2 as ZeRO does: a reduce-scatter of the gradients "
                  "and an all-gather of the parameters, 2(N − 1)/N·Ψ, the same as DP.")]
    elif stage == 3:
        first = [(zero_comm_elems(psi, n, 0) * b,
                  "That is 2(N − 1)/N·Ψ, DP's traffic: stage 3 gathers the weights twice (forward "
                  "and backward) and reduce-scatters the gradients, 3(N − 1)/N·Ψ.")]
    else:
        first = [(zero_comm_elems(psi, n, 3) * b,
                  "That is 3(N − 1)/N·Ψ, stage 3's traffic: stage 0 (DP) all-reduces the gradients, "
                  "2(N − 1)/N·Ψ.")]
    if n > 1:
        first.append((right * n, f"That is N = {n} times too much: a ring collective sends "
                                 "(N − 1)/N of the tensor per rank, not (N − 1) times it."))
    limit = [] if any(abs(v - k * psi * b) <= 1e-9 * abs(v) for v, _ in first) else [
        (k * psi * b, f"That is the large-N limit {k}Ψ: each rank sends (N − 1)/N of it.")]
    return [m for m in first + limit + [(right / b, "That is elements: multiply by the bytes per "
                                                    "element.")] if abs(m[0] - right) > 1e-9 * abs(right)]


_NO_COST = Rule(NO_COST_SAYS, no_cost_calls)

MEMORY = Exercise(
    key="lab05.memory", answer="zero_bytes_per_rank", run=_run_prediction,
    grade=_prediction_grader("zero_bytes_per_rank(n_params={}, n={}, stage={})",
                             lambda psi, n, st: zero_memory_per_gpu(psi, n, st), _memory_mistakes,
                             "bytes"),
    visible=((1, ((7.5e9, 64, 0), (7.5e9, 64, 1), (7.5e9, 64, 2), (7.5e9, 64, 3))),),
    hidden=((1, ((1e6, 4, 1), (70e9, 8, 2), (70e9, 8, 3), (1000, 3, 1), (12345, 1, 3))),),
    rules=(_NO_COST,), solo=True)

COMM = Exercise(
    key="lab05.comm", answer="zero_comm_bytes_per_rank", run=_run_prediction,
    grade=_prediction_grader("zero_comm_bytes_per_rank(n_params={}, n={}, stage={}, "
                             "bytes_per_elem={})",
                             lambda psi, n, st, b: zero_comm_elems(psi, n, st) * b, _comm_mistakes,
                             "bytes"),
    # Stage 1 at N = 2 and 4 (and 5 hidden), where 3(N − 1)/N differs from 2(N − 1)/N and from 2.
    visible=((1, ((1000, 4, 0, 4), (1000, 2, 1, 4), (1000, 4, 1, 2), (1000, 4, 2, 4), (1000, 4, 3, 4),
                  (7.5e9, 64, 3, 2))),),
    hidden=((1, ((999, 3, 1, 2), (1000, 5, 1, 4), (70e9, 8, 3, 2), (12, 2, 0, 4), (5, 1, 3, 2))),),
    rules=(_NO_COST,), solo=True)

_TRAIN_VISIBLE = ((3, (Case((4, 6, 5, 3)), Case((5, 4, 4, 2), "adamw"), Case((3, 4, 3, 4, 2)))),)
_TRAIN_HIDDEN = ((4, (Case((4, 6, 5, 3), steps=3), Case((2, 3, 5, 1), "adamw"),
                      Case((4, 4, 4, 4)))),)
# ZeRO-1/2 take the model's parameters, frozen ones included (as CS336's sharded-optimizer test
# does): a last case with two of them frozen, under AdamW, whose weight decay would move a frozen
# parameter whose gradient was filled with zeros.  (ZeRO-3 takes layers; its cases have none.)
_FROZEN_VISIBLE = Case((5, 4, 4, 2), "adamw", frozen=(1, 2))
_FROZEN_HIDDEN = Case((3, 5, 4, 2), "adamw", frozen=(1, 4))
_PARAMS_VISIBLE = tuple((n, cases + (_FROZEN_VISIBLE,)) for n, cases in _TRAIN_VISIBLE)
_PARAMS_HIDDEN = tuple((n, cases + (_FROZEN_HIDDEN,)) for n, cases in _TRAIN_HIDDEN)
_HANG = ("every rank must call the same collectives in the same order with the same sizes: pad "
         "the flat vector to a multiple of world_size so that every shard has ceil(Ψ / N) elements.")
_MISMATCH = ("all_gather_single/reduce_scatter_single need an output of exactly world_size × the "
             "input's elements: pad the flat vector to ceil(Ψ / N) · N elements.")

_OWN_SHARD = Rule("Hand `make_optimizer` only this rank's shard: at most the sum over the parameter "
                  "tensors of ceil(numel / N) elements (ceil(Ψ / N) for one flat shard), so the "
                  "optimizer state is sharded too.", rules.optimizer_sharded)

ZERO1 = Exercise(
    key="lab05.zero1", answer="ZeRO1", run=_run(1), grade=_grade_training, kind="class",
    visible=_PARAMS_VISIBLE, hidden=_PARAMS_HIDDEN, settle=_settle, timeout=120,
    rules=(_OWN_SHARD,), on_hang=_HANG, on_mismatch=_MISMATCH, on_error=rules.frozen_hint)

ZERO2 = Exercise(
    key="lab05.zero2", answer="ZeRO2", run=_run(2), grade=_grade_training, kind="class",
    visible=_PARAMS_VISIBLE, hidden=_PARAMS_HIDDEN, settle=_settle, timeout=120,
    rules=(_OWN_SHARD,
           Rule("Reduce-scatter the gradients: no `dist.all_reduce`.", rules.no_all_reduce),
           Rule("After `step()` no parameter of the model keeps its `.grad`, and your object keeps "
                "no full-size gradient buffer (at most two shards' worth of tensors besides the "
                "parameters and the optimizer's state): the only gradient a rank holds is its "
                "shard's.", rules.grads_freed)),
    on_hang=_HANG, on_mismatch=_MISMATCH, on_error=rules.frozen_hint)

ZERO3 = Exercise(
    key="lab05.zero3", answer="ZeRO3", run=_run(3), grade=_grade_training, kind="class",
    visible=_TRAIN_VISIBLE, hidden=_TRAIN_HIDDEN, settle=_settle, timeout=120,
    rules=(_OWN_SHARD,
           Rule("Free each layer's gathered parameters after its forward: at most two layers are "
                "gathered at any time in forward.", rules.layers_freed_in_forward),
           Rule("Between steps a rank holds only shards: the model's parameters take no memory "
                "outside a layer's forward and backward.", rules.params_freed_between_steps),
           Rule("All-gather each layer's parameters again in backward, and reduce-scatter its "
                "gradients there: no `dist.all_reduce`.", rules.regathered_in_backward),
           Rule("After `backward()` the only gradients a rank holds are its shards': no `p.grad` "
                "on the model's parameters, and no full-size gradient buffer kept (at most two "
                "shards' worth of tensors besides the parameters and the optimizer's state).",
                rules.full_grads_freed)),
    on_hang=_HANG, on_mismatch=_MISMATCH,
    on_error=rules.error_hint)

def _gpt(**cfg) -> fsdp.GPTCase:
    return fsdp.GPTCase(tuple(sorted(cfg.items())))


FSDP2 = Exercise(
    key="lab05.fsdp2", answer="shard_with_fsdp2", run=fsdp.run, grade=fsdp.grade,
    visible=((3, (_gpt(vocab_size=50, d_model=20, n_head=2, n_layer=3, seq_len=7),)),),
    hidden=((2, (_gpt(vocab_size=50, d_model=20, n_head=2, n_layer=3, seq_len=7),
                 _gpt(vocab_size=37, d_model=12, n_head=3, n_layer=2, seq_len=5, bias=False,
                      tie_weights=False))),),
    rules=(Rule("Call `fully_shard` on each block, then on the root model: the forward makes one "
                "all-gather per block and one for the root.", fsdp.sharded_per_block),
           Rule("Use the default options: each block is freed after its forward and gathered again "
                "in backward (one all-gather per block in backward), while the root stays gathered.",
                fsdp.default_resharding)),
    settle=fsdp.settle, timeout=120, on_error=fsdp.error_hint)

EXERCISES = {"memory": MEMORY, "comm": COMM, "zero1": ZERO1, "zero2": ZERO2, "zero3": ZERO3,
             "fsdp2": FSDP2}

check_memory = checker(MEMORY, """Exercise 1: ``fn(n_params, n, stage)`` -> model-state bytes per
rank under ZeRO stage 0-3 with mixed-precision Adam (2 + 2 + 12 bytes per parameter).""")
check_comm = checker(COMM, """Exercise 2: ``fn(n_params, n, stage, bytes_per_elem)`` -> bytes each
rank sends per training step under ZeRO stage 0-3 (ring collectives).""")
check_zero1 = checker(ZERO1, """Exercise 3: ``ZeRO1(params, make_optimizer)`` with ``.step()``:
gradients all-reduced, each rank steps its own shard, then all-gathers.  Only the parameters
that require grad are sharded; frozen ones must stay bit-identical.""")
check_zero2 = checker(ZERO2, """Exercise 4: ``ZeRO2(params, make_optimizer)``: gradients
reduce-scattered into the owned shard, the rest freed; frozen parameters as in ``ZeRO1``.""")
check_zero3 = checker(ZERO3, """Exercise 5: ``ZeRO3(layers, make_optimizer)``: parameters
sharded, each layer gathered before its forward and backward and freed after.""")
check_fsdp2 = checker(FSDP2, """Exercise 6: ``fn(model, blocks)`` applies FSDP2's ``fully_shard``
to each block, then to the root; the gradients must equal DDP's.""")
