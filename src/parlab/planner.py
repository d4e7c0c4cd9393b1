"""Choosing a parallel layout: memory and step-time predictions for a (dp, tp, pp) plan.

A *plan* places a model on a cluster: data-parallel degree ``dp``, tensor
``tp`` and pipeline ``pp`` degrees (dp·tp·pp = GPUs), a ZeRO stage for the
data-parallel axis, a micro-batch size, the accumulation steps (micro-batches
per step on each data-parallel replica) and whether activations are
recomputed.  This module predicts what a plan costs and searches for the best
one.  Every term comes from ``parlab.cost``:

Memory per GPU (decimal bytes), for the GPU holding pipeline stage 0:
  model states   ``zero_memory_per_gpu(Ψ/(tp·pp), dp, zero)``: 2 + 2 + 12 bytes
                 per parameter of the stage's shard (Rajbhandari et al. 2020)
  activations    ``activation_bytes_per_layer(s, b, h, a, t)`` per layer
                 (Korthikanti et al. 2022, Table 2; 2sbh with full
                 recomputation), times L/pp layers, times the micro-batches in
                 flight under 1F1B: ``activations_held(pp, accum)`` = min(accum, pp).
  Not counted: the embedding and output layer's extra weight on the first
  and last stage, the transient working set of a layer being recomputed,
  temporary communication buffers and allocator fragmentation.

Time per step (seconds), with nothing overlapped (a pessimistic bound; real
frameworks hide much of the data-parallel traffic behind the backward pass):
  compute   global tokens × ``model_flops_per_token`` / (GPUs × peak × efficiency),
            × 4/3 with full recomputation (the forward pass runs twice),
            × (1 + (pp-1)/accum) for the 1F1B pipeline bubble (Narayanan et al. 2021)
  tp        ``tp_comm_elems_per_layer`` × L/pp layers × accum micro-batches, 2 bytes each
  pp        2 (forward, backward) × accum × ``pp_comm_elems`` × 2 bytes, if pp > 1
  dp        ``zero_comm_elems(Ψ/(tp·pp), dp, zero)`` × 2 bytes
Each axis's bytes travel at NVLink speed when its group fits inside one node
and at the per-GPU InfiniBand speed when it spans nodes.  With TP innermost
(``parlab.parallel.mesh``) a TP group is tp consecutive ranks, a data-parallel
group spans dp·tp consecutive ranks and neighbouring pipeline stages sit
dp·tp ranks apart.

    >>> from parlab import planner
    >>> best = planner.search(planner.SCENARIOS["7B on 8 H100s"])
    >>> best.plan.tp, best.fits
    (2, True)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from . import cost

__all__ = ["ModelSpec", "Cluster", "Plan", "Workload", "Prediction", "memory_breakdown",
           "memory_per_gpu", "step_time", "problems", "predict", "search", "candidates",
           "time_to_train", "SCENARIOS", "DGX_H100"]

BF16 = 2  # bytes per element of weights, gradients and activations on the wire


def _whole(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer: Ψ parameters, L layers, hidden h, a heads, sequence s."""

    name: str
    params: float
    layers: int
    hidden: int
    heads: int
    seq: int

    def __post_init__(self) -> None:
        if not self.params > 0:
            raise ValueError(f"params must be > 0, got {self.params!r}")
        for key in ("layers", "hidden", "heads", "seq"):
            _whole(key, getattr(self, key))


@dataclass(frozen=True)
class Cluster:
    """GPUs, their memory and links.  Defaults: H100 SXM nodes of 8 (DGX H100).

    ``nvlink`` is the bytes/s one GPU sends to another inside a node (450 GB/s
    per direction, NVLink 4); ``network`` the bytes/s per GPU between nodes
    (one 400 Gb/s ConnectX-7 per GPU: 50 GB/s).  ``efficiency`` is the share
    of peak FLOP/s that the model's matrix multiplies reach.
    """

    gpus: int
    gpus_per_node: int = 8
    memory: float = cost.H100_MEMORY
    peak_flops: float = cost.H100_BF16_PEAK
    nvlink: float = 450e9
    network: float = 50e9
    efficiency: float = 0.5

    def __post_init__(self) -> None:
        _whole("gpus", self.gpus)
        _whole("gpus_per_node", self.gpus_per_node)
        for key in ("memory", "peak_flops", "nvlink", "network"):
            if not getattr(self, key) > 0:
                raise ValueError(f"{key} must be > 0, got {getattr(self, key)!r}")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"efficiency must be in (0, 1], got {self.efficiency!r}")


DGX_H100 = Cluster(gpus=8)


@dataclass(frozen=True)
class Workload:
    """A model to train on a cluster with ``global_batch`` sequences per optimizer step."""

    model: ModelSpec
    cluster: Cluster
    global_batch: int
    tokens: float = 0.0  # tokens to train on, for the time to train (0: not asked)

    def __post_init__(self) -> None:
        _whole("global_batch", self.global_batch)


@dataclass(frozen=True)
class Plan:
    """One layout.  ``why`` maps an axis ("dp", "tp", "pp", "zero") to one line of reasoning."""

    dp: int
    tp: int
    pp: int
    zero: int = 0
    micro_batch: int = 1
    accum: int = 1
    recompute: bool = False
    why: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for key in ("dp", "tp", "pp", "micro_batch", "accum"):
            _whole(key, getattr(self, key))
        if self.zero not in cost.ZERO_STAGES:
            raise ValueError(f"zero must be one of {cost.ZERO_STAGES}, got {self.zero!r}")

    def __str__(self) -> str:
        return (f"dp={self.dp} tp={self.tp} pp={self.pp} ZeRO-{self.zero} micro_batch={self.micro_batch} "
                f"accum={self.accum}" + (" recompute" if self.recompute else ""))


# ---------------------------------------------------------------- memory
def memory_breakdown(plan: Plan, model: ModelSpec) -> dict[str, float]:
    """Bytes per GPU on pipeline stage 0: weights, grads, optimizer, activations."""
    shard = model.params / (plan.tp * plan.pp)
    weights = cost.weights_bytes(shard) / (plan.dp if plan.zero >= 3 else 1)
    grads = 2 * shard / (plan.dp if plan.zero >= 2 else 1)
    optimizer = 12 * shard / (plan.dp if plan.zero >= 1 else 1)
    per_layer = cost.activation_bytes_per_layer(model.seq, plan.micro_batch, model.hidden, model.heads,
                                                t=plan.tp, recompute=plan.recompute)
    in_flight = cost.activations_held(plan.pp, plan.accum, "1f1b", rank=0)
    return {"weights": weights, "grads": grads, "optimizer": optimizer,
            "activations": per_layer * model.layers / plan.pp * in_flight}


def memory_per_gpu(plan: Plan, model: ModelSpec) -> float:
    """Total of ``memory_breakdown``: the bytes the busiest GPU holds."""
    return sum(memory_breakdown(plan, model).values())


# ---------------------------------------------------------------- time
def _link(span: int, cluster: Cluster) -> float:
    """Bytes/s for a group of ``span`` consecutive ranks: NVLink inside a node, else the network."""
    return cluster.nvlink if span <= cluster.gpus_per_node else cluster.network


def step_time(plan: Plan, work: Workload) -> dict[str, float]:
    """Seconds per optimizer step, by part: compute (with the bubble), tp, pp, dp; and total."""
    m, c = work.model, work.cluster
    tokens = work.global_batch * m.seq
    flops = tokens * cost.model_flops_per_token(m.params, m.layers, m.hidden, m.seq)
    compute = flops * (4 / 3 if plan.recompute else 1) / (c.gpus * c.peak_flops * c.efficiency)
    compute *= 1 + cost.bubble_fraction(plan.pp, plan.accum, "1f1b", definition="megatron")
    b, s, h = plan.micro_batch, m.seq, m.hidden
    tp = (cost.tp_comm_elems_per_layer(b, s, h, plan.tp) * m.layers / plan.pp * plan.accum * BF16
          / _link(plan.tp, c))
    pp = (2 * plan.accum * cost.pp_comm_elems(b, s, h) * BF16 / _link(plan.dp * plan.tp + 1, c)
          if plan.pp > 1 else 0.0)
    dp = (cost.zero_comm_elems(m.params / (plan.tp * plan.pp), plan.dp, plan.zero) * BF16
          / _link(plan.dp * plan.tp, c))
    parts = {"compute": compute, "tp": tp, "pp": pp, "dp": dp}
    parts["total"] = sum(parts.values())
    return parts


def time_to_train(plan: Plan, work: Workload, tokens: float | None = None) -> float:
    """Seconds to train on ``tokens`` (default ``work.tokens``) at the plan's predicted speed."""
    tokens = work.tokens if tokens is None else tokens
    if not tokens > 0:
        raise ValueError("give the number of tokens to train on (Workload(tokens=...) or tokens=)")
    per_step = work.global_batch * work.model.seq
    return tokens / per_step * step_time(plan, work)["total"]


# ---------------------------------------------------------------- rules
def problems(plan: Plan, work: Workload) -> list[str]:
    """Every reason ``plan`` cannot run ``work``, in words; empty when it can."""
    m, c = work.model, work.cluster
    out = []
    if plan.dp * plan.tp * plan.pp != c.gpus:
        out.append(f"dp·tp·pp = {plan.dp}·{plan.tp}·{plan.pp} = {plan.dp * plan.tp * plan.pp}, "
                   f"but the cluster has {c.gpus} GPUs")
    if plan.tp > c.gpus_per_node or c.gpus_per_node % plan.tp:
        out.append(f"tp={plan.tp} does not fit inside a node of {c.gpus_per_node} GPUs: TP's per-layer "
                   "all-reduces would cross the network")
    if m.heads % plan.tp:
        out.append(f"tp={plan.tp} does not divide the {m.heads} attention heads")
    if m.layers % plan.pp:
        out.append(f"pp={plan.pp} does not divide the {m.layers} layers")
    if plan.dp * plan.micro_batch * plan.accum != work.global_batch:
        out.append(f"dp·micro_batch·accum = {plan.dp}·{plan.micro_batch}·{plan.accum} = "
                   f"{plan.dp * plan.micro_batch * plan.accum}, but the global batch is {work.global_batch}")
    parts = memory_breakdown(plan, m)
    need = sum(parts.values())
    if need > c.memory:
        detail = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in parts.items())
        out.append(f"needs {need / 1e9:.1f} GB per GPU ({detail}), over the {c.memory / 1e9:.0f} GB "
                   "a GPU holds")
    return out


@dataclass(frozen=True)
class Prediction:
    """What a plan costs: its problems, memory, step time and throughput."""

    plan: Plan
    problems: tuple
    memory: dict
    time: dict
    tokens_per_second: float

    @property
    def fits(self) -> bool:
        return not self.problems


def predict(plan: Plan, work: Workload) -> Prediction:
    time = step_time(plan, work)
    return Prediction(plan, tuple(problems(plan, work)), memory_breakdown(plan, work.model), time,
                      work.global_batch * work.model.seq / time["total"])


# ---------------------------------------------------------------- search
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(work: Workload):
    """Every plan with dp·tp·pp = GPUs and dp·micro_batch·accum = global batch."""
    g = work.cluster.gpus
    for tp in _divisors(g):
        for pp in _divisors(g // tp):
            dp = g // (tp * pp)
            if work.global_batch % dp:
                continue
            for mb in _divisors(work.global_batch // dp):
                for zero in (cost.ZERO_STAGES if dp > 1 else (0,)):
                    for recompute in (False, True):
                        yield Plan(dp=dp, tp=tp, pp=pp, zero=zero, micro_batch=mb,
                                   accum=work.global_batch // (dp * mb), recompute=recompute)


def _simplicity(p: Plan) -> tuple:
    # Among equally fast plans: no recomputation, the lowest ZeRO stage, less TP and PP.
    return (p.recompute, p.zero, p.tp, p.pp, -p.micro_batch)


def search(work: Workload) -> Prediction | None:
    """The fastest plan that fits (the simplest among ties), or None when none fits."""
    best = None
    for plan in candidates(work):
        if problems(plan, work):
            continue
        guess = predict(plan, work)
        if best is None or guess.tokens_per_second > best.tokens_per_second * (1 + 1e-12) or (
                math.isclose(guess.tokens_per_second, best.tokens_per_second, rel_tol=1e-12)
                and _simplicity(plan) < _simplicity(best.plan)):
            best = guess
    return best if best is None else replace(best, plan=explained(best.plan, work))


def explained(plan: Plan, work: Workload) -> Plan:
    """``plan`` with one line of reasoning per axis, from the predictions."""
    m, c = work.model, work.cluster
    states = cost.training_bytes(m.params).total
    why = {
        "tp": (f"tp={plan.tp}: " + ("no tensor parallelism needed" if plan.tp == 1 else
               f"splits each layer's weights and activations {plan.tp} ways inside a node (NVLink)")),
        "pp": (f"pp={plan.pp}: " + ("one stage holds every layer" if plan.pp == 1 else
               f"{m.layers // plan.pp} layers per stage; bubble (pp-1)/accum = "
               f"{(plan.pp - 1) / plan.accum:.2f}")),
        "dp": f"dp={plan.dp}: the remaining GPUs each take {plan.micro_batch * plan.accum} sequences per step",
        "zero": (f"ZeRO-{plan.zero}: model states {states / 1e9:.0f} GB in all, "
                 f"{sum(list(memory_breakdown(plan, m).values())[:3]) / 1e9:.1f} GB per GPU"
                 + (" with recomputed activations" if plan.recompute else "")),
    }
    if c.gpus_per_node < plan.tp:
        why["tp"] += " (crosses nodes!)"
    return replace(plan, why=why)


def _spec(name, params, layers, hidden, heads, seq):
    return ModelSpec(name, params, layers, hidden, heads, seq)


#: The lecture's scenarios.  Shapes follow the published Llama 2/3 configurations
#: (Touvron et al. 2023; Dubey et al. 2024) and GPT-3 XL (Brown et al. 2020).
SCENARIOS = {
    "1.3B fits one GPU (8 H100s)": Workload(_spec("1.3B", 1.3e9, 24, 2048, 16, 2048), Cluster(8), 512),
    "7B on 8 H100s": Workload(_spec("7B", 7e9, 32, 4096, 32, 4096), Cluster(8), 256),
    "70B on 8 H100s": Workload(_spec("70B", 70e9, 80, 8192, 64, 4096), Cluster(8), 256),
    "70B on 64 H100s": Workload(_spec("70B", 70e9, 80, 8192, 64, 4096), Cluster(64), 1024),
    "7B, 32k-token sequences (64 H100s)": Workload(_spec("7B", 7e9, 32, 4096, 32, 32768), Cluster(64), 64),
    "70B on 15T tokens (2048 H100s)": Workload(_spec("70B", 70e9, 80, 8192, 64, 8192), Cluster(2048),
                                               2048, tokens=15e12),
}
