"""Pipeline stages of parlab's GPT, and tools to time and weigh them.

Nothing here sends a message: these are the pieces a pipeline schedule runs
on each rank, so that Lab 04 can be about the schedule itself.

- ``split_layers(n_layer, p)``: which transformer blocks each of p stages
  holds (contiguous, as even as possible, earlier stages take the extra one).
- ``GPTStage`` / ``gpt_stage(model, p, rank)``: stage ``rank`` of a GPT cut
  into p stages.  Stage 0 also holds the embeddings, the last stage the final
  norm and the output head.  Parameter names are the full model's, so a
  stage's gradients compare directly with a single-process run.  Forward
  takes token ids on stage 0 and the previous stage's activation elsewhere;
  it returns the activation (b, T, d_model), or the logits on the last stage;
  ``stage.loss(logits, targets)`` is the mean cross-entropy.
- ``TimedStage(stage, forward_s, backward_s)``: the same stage, made to take
  at least a fixed time in forward and in backward (it sleeps), so that a
  measured pipeline bubble can be compared with the formula on a machine
  whose cores the ranks share.
- ``traced_passes(*modules)``: records a ``parlab.trace`` span named
  "forward" for every forward of the modules and "backward" for every
  backward pass started in the block (``Tensor.backward`` and
  ``torch.autograd.backward``, which ``torch.distributed.pipelining`` calls
  too), so that a schedule's timeline can be drawn and its bubble measured.
- ``held_activations()``: the bytes autograd keeps alive for backward right
  now, and their peak, counted exactly (distinct storages, parameters left
  out), to see how many micro-batches' activations a schedule holds.

A GPT whose output head is tied to its token embedding cannot be cut this
way (the one matrix would live on two stages); Megatron-LM keeps a copy on
each and all-reduces their gradients (Narayanan et al. 2021).  Build the
model with ``tie_weights=False``.
"""
from __future__ import annotations

import contextlib
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["split_layers", "GPTStage", "gpt_stage", "TimedStage", "traced_passes", "held_activations",
           "Held"]


def split_layers(n_layer: int, p: int) -> list[range]:
    """The blocks of each of ``p`` stages: contiguous ranges covering 0..n_layer-1."""
    if int(p) != p or p < 1:
        raise ValueError(f"p must be an integer >= 1, got {p!r}")
    if n_layer < p:
        raise ValueError(f"{n_layer} layers cannot fill {p} stages: build the model with "
                         f"n_layer >= {p}")
    base, extra = divmod(n_layer, p)
    out, start = [], 0
    for r in range(p):
        size = base + (1 if r < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


class GPTStage(nn.Module):
    """Stage ``rank`` of ``p`` of a parlab GPT (see the module docstring)."""

    def __init__(self, model: nn.Module, p: int, rank: int):
        super().__init__()
        cfg = model.config
        if cfg.tie_weights:
            raise ValueError("this GPT ties lm_head to tok_emb, which would sit on two stages: "
                             "build it with tie_weights=False")
        if not 0 <= rank < p:
            raise ValueError(f"rank must be in 0..{p - 1}, got {rank!r}")
        self.p, self.rank = p, rank
        self.is_first, self.is_last = rank == 0, rank == p - 1
        self.layers = split_layers(cfg.n_layer, p)[rank]
        self.d_model, self.vocab_size = cfg.d_model, cfg.vocab_size
        if self.is_first:
            self.tok_emb, self.pos_emb, self.drop = model.tok_emb, model.pos_emb, model.drop
        # A ModuleDict keyed by the block's index keeps the full model's names: blocks.2.ln1.weight
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in self.layers})
        if self.is_last:
            self.ln_f, self.lm_head = model.ln_f, model.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_first:
            pos = torch.arange(x.size(1), device=x.device)
            x = self.drop(self.tok_emb(x) + self.pos_emb(pos))
        for block in self.blocks.values():
            x = block(x)
        if self.is_last:
            x = self.lm_head(self.ln_f(x))
        return x

    @staticmethod
    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy, as ``parlab.models.lm_loss`` computes it."""
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))  # (b·T, V) against (b·T,), b a micro-batch

    def extra_repr(self) -> str:
        return f"stage {self.rank} of {self.p}, blocks {list(self.layers)}"


def gpt_stage(model: nn.Module, p: int, rank: int) -> GPTStage:
    """Stage ``rank`` of ``model`` cut into ``p`` stages (shares the model's parameters)."""
    return GPTStage(model, p, rank)


class _Sleep(torch.autograd.Function):
    """Identity whose forward and backward each take at least a given time."""

    @staticmethod
    def forward(ctx, x, forward_s: float, backward_s: float, started: float):
        ctx.backward_s = backward_s
        _sleep_until(started + forward_s)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        _sleep_until(time.perf_counter() + ctx.backward_s)
        return grad, None, None, None


def _sleep_until(deadline: float) -> None:
    left = deadline - time.perf_counter()
    if left > 0:
        time.sleep(left)


class TimedStage(nn.Module):
    """``stage`` whose forward takes ``forward_s`` and backward about ``backward_s`` seconds.

    Forward runs the real stage and then sleeps until ``forward_s`` has passed
    since it began; backward sleeps ``backward_s`` and then runs the real
    backward (a few milliseconds for the lab's tiny models).  Sleeping does
    not use a core, so four ranks on two cores keep to these times; it is a
    controlled stand-in for compute, not compute.
    """

    def __init__(self, stage: nn.Module, forward_s: float, backward_s: float):
        super().__init__()
        if forward_s < 0 or backward_s < 0:
            raise ValueError(f"durations must be >= 0, got {forward_s!r}, {backward_s!r}")
        self.stage, self.forward_s, self.backward_s = stage, float(forward_s), float(backward_s)
        for name in ("p", "rank", "is_first", "is_last", "d_model", "vocab_size", "loss"):
            if hasattr(stage, name):
                setattr(self, name, getattr(stage, name))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        started = time.perf_counter()
        return _Sleep.apply(self.stage(x), self.forward_s, self.backward_s, started)


@contextlib.contextmanager
def traced_passes(*modules: nn.Module):
    """Spans "forward" (each forward of ``modules``) and "backward" (each backward pass) in the block."""
    from .. import trace

    starts: list[float] = []

    def began(*_):
        starts.append(trace.now())

    def ended(*_):  # a forward hook that returned something would replace the output
        trace.record("forward", starts.pop(), trace.now())

    handles = []
    for mod in modules:
        handles.append(mod.register_forward_pre_hook(began))
        handles.append(mod.register_forward_hook(ended))
    originals = {(torch.Tensor, "backward"): torch.Tensor.backward,
                 (torch.autograd, "backward"): torch.autograd.backward}
    depth = [0]

    def timed(original):
        def backward(*args, **kwargs):
            depth[0] += 1
            start = trace.now()
            try:
                return original(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:  # Tensor.backward calls torch.autograd.backward: one span
                    trace.record("backward", start, trace.now())
        return backward

    try:
        for (owner, name), fn in originals.items():
            setattr(owner, name, timed(fn))
        yield
    finally:
        for (owner, name), fn in originals.items():
            setattr(owner, name, fn)
        for h in handles:
            h.remove()


class Held:
    """What ``held_activations`` counts: ``bytes`` alive now and their ``peak``."""

    def __init__(self, exclude: set):
        self.bytes = 0
        self.peak = 0
        self._exclude = exclude
        self._live: dict[tuple, list[int]] = {}  # storage -> [references, bytes]

    def _key(self, t: torch.Tensor) -> tuple:
        st = t.untyped_storage()
        return (str(t.device), st.data_ptr()) if st.data_ptr() else ("id", id(t))

    def _take(self, t: torch.Tensor) -> tuple | None:
        key = self._key(t)
        if key in self._exclude:
            return None
        entry = self._live.setdefault(key, [0, t.untyped_storage().nbytes()])
        if entry[0] == 0:
            self.bytes += entry[1]
            self.peak = max(self.peak, self.bytes)
        entry[0] += 1
        return key

    def _drop(self, key: tuple) -> None:
        entry = self._live[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.bytes -= entry[1]
            del self._live[key]


class _Saved:
    """A tensor autograd saved, counted while this object lives (autograd frees it after backward)."""

    __slots__ = ("tensor", "_held", "_key")

    def __init__(self, t: torch.Tensor, held: Held, key: tuple):
        # detached: a saved output would otherwise hold its own grad_fn (a cycle that only the
        # garbage collector frees); unpacking a detached tensor is what autograd expects
        self.tensor, self._held, self._key = t.detach(), held, key

    def __del__(self):
        self._held._drop(self._key)


@contextlib.contextmanager
def held_activations(*not_counted: torch.Tensor):
    """Count the bytes autograd holds for backward, for graphs built inside the block.

    Every tensor a forward pass saves for backward is counted once per
    distinct storage, from the moment it is saved until autograd frees it
    (after the backward through it).  Tensors in ``not_counted`` (pass the
    parameters) are left out, so what remains is activation memory::

        with held_activations(*stage.parameters()) as held:
            ...                           # a whole pipeline step
        held.peak                         # bytes of the most activations held at once
    """
    held = Held(set())
    held._exclude = {held._key(t) for t in not_counted if isinstance(t, torch.Tensor)}

    def pack(t):
        key = held._take(t)
        return t if key is None else _Saved(t, held, key)

    def unpack(obj):
        return obj.tensor if isinstance(obj, _Saved) else obj

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield held
