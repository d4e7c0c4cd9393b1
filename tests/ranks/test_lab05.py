"""Lab 05's checks: they pass correct answers (written several ways) and reject
the wrong answers in tests/wrong_answers/lab05.py with a message that names
the mistake.

Every answer of every exercise is graded in one ``harness.grade_batch`` per
test set: one launch at 3 ranks for the visible cases, and for the hidden ones
one at 4 ranks (ZeRO) and one at 2 (FSDP2) (a launch costs 10-60 s on this
2-core machine).
"""
import pytest
import torch
import torch.distributed as dist

import parlab
from parlab.grading import harness, lab05
from grading_reports import short_keys as _short
from wrong_answers import lab05 as wrong
from wrong_answers.lab05 import _Flat, _Layers

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(600)]


# ---------------------------------------------------------------- correct answers
def memory(n_params, n, stage):
    w, g, o = 2 * n_params, 2 * n_params, 12 * n_params
    return [w + g + o, w + g + o / n, w + (g + o) / n, (w + g + o) / n][stage]


def memory_from_bytes_per_param(n_params, n, stage):
    """16 bytes per parameter, with the sharded ones divided by n."""
    per = {0: 16, 1: 4 + 12 / n, 2: 2 + 14 / n, 3: 16 / n}[stage]
    return per * n_params


def comm(n_params, n, stage, bytes_per_elem):
    k = 3 if stage == 3 else 2
    return k * (n - 1) * n_params * bytes_per_elem / n


class zero1_tensor_split:
    """Uneven shards from tensor_split, per-parameter all-reduce, list all_gather of padded pieces."""

    def __init__(self, params, make_optimizer):
        self.params = [p for p in params if p.requires_grad]
        self.n, self.rank = dist.get_world_size(), dist.get_rank()
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.sizes = [len(c) for c in flat.tensor_split(self.n)]
        self.lo = sum(self.sizes[: self.rank])
        self.hi = self.lo + self.sizes[self.rank]
        self.shard = flat[self.lo:self.hi].clone().requires_grad_()
        self.opt = make_optimizer([self.shard])

    def step(self):
        for p in self.params:
            dist.all_reduce(p.grad)
        g = torch.cat([p.grad.reshape(-1) for p in self.params]) / self.n
        self.shard.grad = g[self.lo:self.hi].clone()
        self.opt.step()
        big = max(self.sizes)
        mine = torch.zeros(big)
        mine[: self.hi - self.lo] = self.shard.detach()
        parts = [torch.empty(big) for _ in range(self.n)]
        dist.all_gather(parts, mine)
        flat = torch.cat([part[:s] for part, s in zip(parts, self.sizes)])
        off = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(flat[off:off + p.numel()].view_as(p))
                off += p.numel()


class zero1_flat(_Flat):
    """The shared flat-shard design: reduce-scatter is allowed in ZeRO-1 too."""


class zero1_per_tensor:
    """A padded shard of each trainable tensor; frozen ones skipped at step time by their None grad."""

    def __init__(self, params, make_optimizer):
        self.params = list(params)  # frozen ones too: they are recognised by p.grad is None
        self.n, self.rank = dist.get_world_size(), dist.get_rank()
        self.shards = {}
        for k, p in enumerate(self.params):
            if p.requires_grad:
                c = -(-p.numel() // self.n)
                flat = torch.zeros(c * self.n)
                flat[: p.numel()] = p.detach().reshape(-1)
                self.shards[k] = flat[self.rank * c:(self.rank + 1) * c].clone().requires_grad_()
        self.opt = make_optimizer(list(self.shards.values()))

    def step(self):
        for k, p in enumerate(self.params):
            if p.grad is None:
                continue
            shard = self.shards[k]
            c = shard.numel()
            g = torch.zeros(c * self.n)
            g[: p.numel()] = p.grad.reshape(-1)
            dist.all_reduce(g)
            shard.grad = g[self.rank * c:(self.rank + 1) * c] / self.n
        self.opt.step()
        for k, shard in self.shards.items():
            p = self.params[k]
            full = torch.empty(shard.numel() * self.n)
            dist.all_gather_into_tensor(full, shard.detach())
            with torch.no_grad():
                p.copy_(full[: p.numel()].view_as(p))


class zero2_flat(_Flat):
    def step(self):
        self.shard.grad = self.scatter_grads()
        for p in self.params:
            p.grad = None
        self.opt.step()
        self.gather()


class zero2_list_api(zero2_flat):
    """dist.reduce_scatter and dist.all_gather with lists of chunks."""

    def scatter_grads(self):
        chunks = list(self.grads().split(self.chunk))
        mine = torch.empty(self.chunk)
        dist.reduce_scatter(mine, chunks)
        return mine / self.n

    def gather(self):
        parts = [torch.empty(self.chunk) for _ in range(self.n)]
        dist.all_gather(parts, self.shard.detach())
        self.write(torch.cat(parts))


class zero3_layers(_Layers):
    """Per-layer padded buffers, storage resized to 0 when freed."""


class zero3_prefetch(_Layers):
    """Also gathers the next layer in forward before it is needed (two layers gathered at most)."""

    def __init__(self, layers, make_optimizer):
        super().__init__(layers, make_optimizer)
        for u, nxt in zip(self.units, self.units[1:] + [None]):
            u["next"] = nxt

    def gather(self, u):
        if u["full"].untyped_storage().nbytes() == 0:
            super().gather(u)
        nxt = u.get("next")
        if torch.is_grad_enabled() and nxt is not None and nxt["full"].untyped_storage().nbytes() == 0:
            super().gather(nxt)


def fsdp2_loop(model, blocks):
    from torch.distributed.fsdp import fully_shard

    for block in blocks:
        fully_shard(block)
    fully_shard(model)


def fsdp2_mesh_explicit_defaults(model, blocks):
    """An explicit 1-D mesh, the default resharding spelled out, the blocks found by type, returns the model."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from parlab.models.gpt import Block

    mesh = init_device_mesh(parlab.device().type, (dist.get_world_size(),))
    for m in model.modules():
        if isinstance(m, Block):
            fully_shard(m, mesh=mesh, reshard_after_forward=True)
    return fully_shard(model, mesh=mesh, reshard_after_forward=False)


class zero2_keeps_buffers(zero2_flat):
    """Keeps a shard-sized gradient buffer and a full-size parameter buffer between steps."""

    def scatter_grads(self):
        g = self.grads()
        if not hasattr(self, "mine"):
            self.mine = torch.empty(self.chunk)
        dist.reduce_scatter_tensor(self.mine, g)
        return self.mine / self.n

    def gather(self):
        if not hasattr(self, "full"):
            self.full = torch.empty(self.chunk * self.n)
        dist.all_gather_into_tensor(self.full, self.shard.detach())
        self.write(self.full)


def comm_fraction(n_params, n, stage, bytes_per_elem):
    """Per collective: (N - 1)/N of Ψ each, two of them, a third (the backward's gather) in stage 3."""
    from fractions import Fraction

    collectives = 3 if stage == 3 else 2
    return float(collectives * Fraction(n - 1, n) * Fraction(n_params) * Fraction(bytes_per_elem))


CORRECT = {
    "memory": {"memory": memory, "memory_from_bytes_per_param": memory_from_bytes_per_param},
    "comm": {"comm": comm, "comm_fraction": comm_fraction},
    "zero1": {"zero1_tensor_split": zero1_tensor_split, "zero1_flat": zero1_flat,
              "zero1_per_tensor": zero1_per_tensor},
    "zero2": {"zero2_flat": zero2_flat, "zero2_list_api": zero2_list_api,
              "zero2_keeps_buffers": zero2_keeps_buffers},
    "zero3": {"zero3_layers": zero3_layers, "zero3_prefetch": zero3_prefetch},
    "fsdp2": {"fsdp2_loop": fsdp2_loop, "fsdp2_mesh_explicit_defaults": fsdp2_mesh_explicit_defaults},
}


def _batch(with_wrong: bool) -> dict:
    batch = {lab05.EXERCISES[ex]: dict(answers) for ex, answers in CORRECT.items()}
    if with_wrong:
        for ex, fixtures in wrong.WRONG.items():
            batch[lab05.EXERCISES[ex]].update({f.__name__: f for f, _ in fixtures})
    return batch


@pytest.fixture(scope="module")
def visible():
    return _short(harness.grade_batch(_batch(True)))


@pytest.fixture(scope="module")
def hidden():
    return _short(harness.grade_batch(_batch(False), hidden=True))


@pytest.mark.parametrize("ex,name", [(ex, n) for ex in CORRECT for n in CORRECT[ex]])
def test_correct_answers_pass_visible_and_hidden(visible, hidden, ex, name):
    assert visible[(ex, name)] is None, visible[(ex, name)]
    assert hidden[(ex, name)] is None, hidden[(ex, name)]


@pytest.mark.parametrize("ex,fixture,words", [(ex, f, w) for ex, fs in wrong.WRONG.items() for f, w in fs])
def test_wrong_answers_fail_visible(visible, ex, fixture, words):
    msg = visible[(ex, fixture.__name__)]
    assert msg is not None, f"{fixture.__name__} passed the visible {ex} check"
    assert words in msg, msg


def test_not_a_class():
    with pytest.raises(AssertionError, match="expected your ZeRO1"):
        lab05.check_zero1(None)


def test_uneven_shard_hint_fires_on_gloo_wording():
    """gloo's own size check (an unpadded all-gather) gets the padding hint, as torch's does."""
    from parlab.grading.lab05 import hints

    gloo = "RuntimeError: Check failed: outputShape[0] * worldSize == inputShape[0] (84 vs. 83)"
    for text in (gloo, "ValueError: output tensor size must be equal to world_size times input"):
        assert "pad the flat vector" in hints.frozen_hint(text)
        assert "pad the flat vector" in hints.error_hint(text)
    assert hints.error_hint("RuntimeError: something else") == ""
