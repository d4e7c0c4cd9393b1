"""Lab 05, Exercise 6: FSDP2's ``fully_shard`` on parlab's GPT, gradients checked against DDP.

The student writes ``shard_with_fsdp2(model, blocks)``: ``fully_shard`` on
each transformer block, then on the root.  On every rank the check builds the
same GPT (odd widths, so FSDP2 pads the shards), lets the answer shard it,
runs one forward and backward on the rank's own rows of a global batch, and
gathers every gradient with ``DTensor.full_tensor()``.  The reference is one
process on the whole batch, which is what DDP's averaged gradients equal.

The spy counts the all-gathers of the forward pass: FSDP2 gathers each
``fully_shard`` unit with one all-gather, so a model wrapped per block and at
the root makes ``len(blocks) + 1`` of them, one wrapped only at the root
makes 1, and blocks grouped into one ``fully_shard(list)`` call make 2.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ... import check
from ...launch.runtime import device
from .. import records as read
from ..harness import Graded, Rule
from ..plain import plain

DATA_SEED = 23


@dataclass(frozen=True)
class GPTCase:
    """parlab's GPT with these ``GPTConfig`` overrides; ``rows`` sequences per rank."""

    config: tuple = field(default_factory=tuple)   # ((key, value), ...): hashable
    rows: int = 2
    seed: int = 4

    @property
    def cfg(self) -> dict:
        return dict(self.config)

    def describe(self, n: int) -> str:
        c = self.cfg
        return (f"parlab's GPT with d_model {c['d_model']}, {c['n_layer']} blocks, vocab "
                f"{c['vocab_size']}, seq_len {c['seq_len']}"
                f"{'' if c.get('tie_weights', True) else ', untied output layer'}, "
                f"{self.rows} sequences per rank, world_size {n}")

    def build(self) -> nn.Module:
        from ...models import tiny_gpt

        return tiny_gpt(seed=self.seed, **self.cfg)

    def batch(self, n: int) -> torch.Tensor:
        """(rows·n, seq_len + 1) token ids: inputs are [:, :-1], targets [:, 1:]."""
        g = torch.Generator().manual_seed(DATA_SEED + n)
        return torch.randint(0, self.cfg["vocab_size"], (self.rows * n, self.cfg["seq_len"] + 1),
                             generator=g)


def loss_of(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    return model(idx[:, :-1], idx[:, 1:])[1]


def grads_of(case: GPTCase, idx: torch.Tensor) -> dict[str, torch.Tensor]:
    """Single-process gradients of the mean loss over ``idx``, by parameter name."""
    model = case.build()
    loss_of(model, idx).backward()
    return {k: p.grad.detach().clone() for k, p in model.named_parameters()}


# ---------------------------------------------------------------- on the ranks
def run(fn, case: GPTCase, i: int, spy) -> dict:
    """Shard with the answer, one forward and backward on this rank's rows, every full gradient."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    rank, n = dist.get_rank(), dist.get_world_size()
    # every parameter whole here; the answer's fully_shard makes each a DTensor sharded on dim 0,
    # its local part (at most ceil(dim0 / n), ...): this rank's rows
    model = case.build().to(device())
    blocks = list(model.blocks)
    with spy.watch():
        returned = fn(model, blocks)
    if isinstance(returned, nn.Module):
        model = returned
    spy.note("wrapped", root=isinstance(model, FSDPModule), blocks=len(blocks),
             wrapped_blocks=sum(isinstance(b, FSDPModule) for b in blocks))
    # (rows, seq_len + 1): this rank's sequences of the (rows·n, seq_len + 1) global batch
    idx = case.batch(n)[rank * case.rows:(rank + 1) * case.rows].to(device())
    with spy.watch():
        spy.note("forward")
        loss = loss_of(model, idx)
        spy.note("backward")
        loss.backward()
    grads = {}
    for k, p in model.named_parameters():  # full_tensor() is a collective: outside the spy
        g = p.grad
        g = g.full_tensor() if hasattr(g, "full_tensor") else g  # the parameter's full shape
        grads[k] = g
    return {"grads": plain(grads)}


def settle(result: dict, case: GPTCase, i: int, n: int) -> bool:
    want = grads_of(case, case.batch(n))
    return all(result["grads"].get(k) is not None and result["grads"][k].shape == w.shape
               and bool(check.close_mask(result["grads"][k], w).all()) for k, w in want.items())


# ---------------------------------------------------------------- in the grader
def grade(g: Graded) -> str | None:
    for i, case in enumerate(g.cases[:min(len(r) for r in g.results)]):
        idx = case.batch(g.n)
        want = grads_of(case, idx)
        for r, res in enumerate(g.at(i)):
            where = f"{g.name} is wrong for {case.describe(g.n)}: on rank {r}"
            got = res["grads"]
            missing = [k for k, w in want.items() if got.get(k) is None or got[k].shape != w.shape]
            if missing:
                return (f"{where}, parameter(s) {missing} have no gradient of the model's shape "
                        "after backward. Shard the model in place and keep its parameters.")
            bad = [k for k, w in want.items() if not bool(check.close_mask(got[k], w).all())]
            if bad:
                return _wrong_grads(where, bad, got, want, case, idx, r, g.n)
    return None


def _wrong_grads(where, bad, got, want, case, idx, r, n) -> str:
    head = (f"{where}, the gradients of {len(bad)} of {len(want)} parameters differ from DDP's "
            f"(one process on the whole batch), the first {bad[0]!r}.")
    scale = [float((got[k] * want[k]).sum() / (want[k] * want[k]).sum()) for k in bad
             if bool(want[k].any())]
    if n > 1 and scale and all(abs(s - n) < 1e-3 * n for s in scale):
        return (head + f" They are {n} = world_size times too large: summed over the ranks, not "
                "averaged. Leave FSDP2's default gradient division alone (it divides by the "
                "world size, as DDP does).")
    own = grads_of(case, idx[r * case.rows:(r + 1) * case.rows])
    local = [k for k in bad if bool(check.close_mask(got[k], own[k]).all())]
    outside = {k for k in want if not k.startswith("blocks.")}
    # a parameter whose own gradient equals the average (attention's key bias: always zero) shows nothing
    telling = {k for k in want if not bool(check.close_mask(own[k], want[k]).all())}
    if local and set(local) == set(bad) and set(bad) >= telling:
        return (head + f" All {len(local)} hold this rank's own gradient, never averaged over the ranks, "
                "blocks and the rest alike: nothing of the model the check trains was sharded. Call "
                "fully_shard on the model and blocks you are given (it shards them in place), or return "
                "the module you sharded.")
    if local and set(local) == set(bad) == outside:
        return (head + f" {local} hold this rank's own gradient, never averaged over the ranks, and every "
                "block's gradients are right: the parameters outside the blocks (embeddings, final norm, "
                "output layer) are sharded and reduced only when you also call fully_shard on the root "
                "model, after the blocks.")
    if local:
        return head + f" {local} hold this rank's own gradient, never averaged over the ranks."
    k = bad[0]
    i = int((~check.close_mask(got[k], want[k])).flatten().nonzero()[0])
    return head + (f" Element {i} of it: got {float(got[k].flatten()[i]):.6g}, expected "
                   f"{float(want[k].flatten()[i]):.6g}.")


def sharded_per_block(records, case, n) -> str | None:
    layers = case.cfg["n_layer"]
    for r, rec in enumerate(records):
        forward = read.between(rec, "forward", "backward")["calls"]
        gathers = [c for c in forward if c["op"].startswith("all_gather")]
        wrapped = read.event(rec, "wrapped") or {}
        if len(gathers) != layers + 1:
            if len(gathers) > layers + 1:
                what = ("too many units: fully_shard was called on modules inside the blocks too "
                        "(every Linear?), so each block is gathered in pieces, one all-gather each")
            elif wrapped.get("wrapped_blocks") == 0 and wrapped.get("root"):
                what = ("only the root is wrapped: the whole model is one unit, gathered at once, so "
                        "no memory is saved")
            else:
                what = "the blocks are not each their own unit"
            return (f"rank {r}'s forward made {len(gathers)} all-gather(s) for a GPT of {layers} "
                    f"blocks; one fully_shard per block and one on the root make {layers + 1}: "
                    f"{what}. Call fully_shard(block) for each block, then fully_shard(model).")
    return None


def default_resharding(records, case, n) -> str | None:
    """FSDP2's default: every block resharded after forward (so gathered again in backward), the root not."""
    layers = case.cfg["n_layer"]
    for r, rec in enumerate(records):
        gathers = [c for c in read.between(rec, "backward")["calls"] if c["op"].startswith("all_gather")]
        if len(gathers) < layers:
            return (f"rank {r}'s backward made {len(gathers)} all-gather(s) for {layers} blocks: the "
                    "blocks stayed gathered from forward to backward (reshard_after_forward=False?), "
                    "which keeps the whole gathered model in memory at the end of forward. With the "
                    "default options each block is freed after its forward and gathered again in "
                    "backward.")
        if len(gathers) > layers:
            return (f"rank {r}'s backward made {len(gathers)} all-gathers for {layers} blocks: the root "
                    "was freed after forward too (reshard_after_forward=True on the root?). The "
                    "default keeps the root gathered, since backward needs its output layer first.")
    return None


def error_hint(text: str) -> str:
    # torch 2.13: fully_shard of a block whose parameters the root already made DTensors fails in
    # FSDPParam's sharding spec (an "Invariant" on the mesh) or, in other versions, says so outright
    inside = "_fully_shard" in text and ("_init_sharding_spec" in text or "Invariant encountered" in text)
    if inside or "already managed by another FSDP" in text:
        return ("fully_shard failed on parameters another fully_shard call had already sharded. Shard "
                "the blocks first and the root last: fully_shard(model) takes every "
                "parameter not yet sharded, the blocks' too, so a block wrapped after the root "
                "finds its parameters already sharded.")
    return ""


# ---------------------------------------------------------------- the cases and the rules
def gpt_case(**cfg) -> GPTCase:
    return GPTCase(tuple(sorted(cfg.items())))


VISIBLE = ((3, (gpt_case(vocab_size=50, d_model=20, n_head=2, n_layer=3, seq_len=7),)),)
HIDDEN = ((2, (gpt_case(vocab_size=50, d_model=20, n_head=2, n_layer=3, seq_len=7),
               gpt_case(vocab_size=37, d_model=12, n_head=3, n_layer=2, seq_len=5, bias=False,
                        tie_weights=False))),)

RULES = (Rule("Call `fully_shard` on each block, then on the root model: the forward makes one "
              "all-gather per block and one for the root.", sharded_per_block),
         Rule("Use the default options: each block is freed after its forward and gathered again "
              "in backward (one all-gather per block in backward), while the root stays gathered.",
              default_resharding))
