"""Choosing a parallel layout (planner v3): memory and step-time predictions for a plan.

One package.  This module is the model and the search (the plan's fields, its memory, its step
time, its feasibility rules and the search are one model whose parts read each other's terms; the
cluster presets and the lecture's scenarios at the end are data).  Beside it, each importing only
what is above it in this list:
  ``parlab.planner.frameworks``  which framework runs a plan and how (imports ``parlab.cost`` only);
  ``parlab.planner.published``   the published runs and the error band measured on them;
  ``parlab.planner.band``        the plans the model cannot tell from its best.
Their former names, ``parlab.planner_frameworks``, ``parlab.planner_published`` and
``parlab.planner_band``, are the same modules.  Ranks are placed on a ``parallel.mesh.Grid``
(``grid``, ``expert_grid``, ``axis_crosses``), the pipeline's warm-up is ``cost.pipeline_warmup``.

A *plan* places a model on a cluster: data-parallel ``dp``, context-parallel
``cp``, tensor ``tp`` and pipeline ``pp`` degrees (dp·cp·tp·pp = GPUs), a ZeRO
stage, a micro-batch size, the accumulation steps (micro-batches per step on
each replica), the recomputation ("none", "selective", "full", and under "full"
how many layers of each model chunk: ``recompute_layers``, Megatron-LM's block
method, or every k-th layer: ``recompute_every``, torchtitan's; 0 is every layer; or "op",
torchtitan's op-level selective checkpointing), Megatron sequence parallelism, interleaved 1F1B with ``v`` chunks per rank, the
precision recipe, and under ZeRO-3 HSDP's shard groups (``shard``).  Ranks are ordered as
Megatron orders them, tp fastest, then cp, dp, pp ("tp-cp-ep-dp-pp", Megatron-Core's RankGenerator;
``parlab.parallel.mesh`` puts TP innermost the same way).  Every formula lives in ``parlab.cost`` with its source.

Memory per GPU (decimal bytes), on every pipeline stage; ``memory_breakdown``
returns the busiest stage's:
  weights, grads, optimizer
        ``cost.model_state_bytes(shard, dp·cp, zero, precision)``.  The shard is
        the stage's layers × per-layer parameters plus, on the first stage, the
        embedding (V·h) and, on the last, the output layer (V·h; tied: both
        stages keep a copy), all ÷ tp.  Per-layer parameters = (Ψ − embedding −
        head)/L.  Layers need not divide by pp: the first L mod pp stages take
        one more (or ``Plan.stages`` lists them).  Precision "fp32_grads"
        (the default: Megatron-LM's bf16 with fp32 main grads, 18 B/param,
        6 + 12/d with the distributed optimizer) or "zero16" (ZeRO's 2 + 2 + 12;
        the lecture's and lab 05's accounting).  ZeRO shards over dp·cp, as
        Megatron's distributed optimizer does; HSDP (``Plan.shard``) over the shard·cp
        ranks of its group (``cost.hsdp_memory_per_gpu``).
  activations
        ``cost.activation_bytes_per_layer`` (Korthikanti et al. 2022, Table 2),
        with s/cp tokens per GPU; by default attention never stores its scores
        (FlashAttention/SDPA: 34·sbh per layer, ÷ t with Megatron-LM's SP; torchtitan's
        SP keeps the gathered attention and MLP inputs whole, 4·sbh more than ÷ t:
        ``planner_frameworks.sp_keeps_gathered``); ``ModelSpec(scores=True)``
        is attention that stores them (the 5as/h term); SwiGLU's three matrices,
        grouped-query K/V and no dropout counted as the model says (``ModelSpec.shape``).  × the stage's layers ×
        micro-batches in flight (``cost.activations_held``: 1F1B min(m, p − r);
        interleaved from Megatron's warm-up).  Under "full" with ``recompute_layers``
        K (block recomputation) a share min(1, K·v/n) of a stage's n layers keep
        their input only and the others all of their activations
        (``recomputed_share``; torchtitan's every k-th layer: floor(n/k) of them).
        Under "op" (torchtitan's op-level selective checkpointing) each layer keeps
        what torchtitan's policy saves (``cost.op_sac_saved``: its input, every matmul's
        output but every second one, SDPA's output and logsumexp, under TP the
        reduce-scatters' outputs).  Plus the transient working set of
        one layer being recomputed (its "none" activations) under "full", its
        "none" minus its "op" activations under "op", or of
        its scores under "selective"; plus, on the last stage, the logits of one
        micro-batch in fp32 for the loss (4·b·s·V/(tp·cp) bytes, vocab-parallel).
  Not counted: temporary communication buffers, FSDP's gathered bf16 layer,
  allocator fragmentation, the CUDA context (that is what ``Cluster.headroom``
  keeps free: plans must fit in headroom × HBM).

Time per step (seconds), the slowest stage's pace, as the sum of exposed parts:
  compute  the slowest stage's FLOPs per micro-batch (6 FLOPs per weight per
           token plus 12·h·s per layer per token for attention, PaLM app. B; the
           output layer's 6·V·h; + the recomputed forward: 2 FLOPs per weight and
           4·h·s per layer under "full", for the recomputed share of the layers,
           4·h·s under "selective" with stored scores, and under "op" the matmuls
           torchtitan recomputes, ``cost.op_sac_recomputed_flops``: wk, wo, w3) / (peak × efficiency(shape)),
           × m micro-batches.  The recomputed forward's TP, CP and EP collectives
           are counted for that share too.
           efficiency = ``Cluster.efficiency`` × M/(M + 128) × K/(K + 128), with
           M = b·s/cp tokens per micro-batch and K = h/tp the sharded width
           (small GEMMs do not fill the tensor cores; 128 is one tile).
  bubble   (p − 1)/v × the slowest stage's micro-batch time (Narayanan et al. 2021); DualPipe's
           (p/2 − 1)·2/3 (``bubble_stages``).
  tp       forward collectives exposed; backward input-gradient collectives
           overlap the weight-gradient GEMM (Megatron's async all-reduce,
           ``CUDA_DEVICE_MAX_CONNECTIONS=1``) up to that GEMM's time; with SP the
           backward re-all-gather overlaps the input-gradient GEMM; under "full"
           the recomputed forward's collectives are exposed again, under "op" its two
           all-gathers (the reduce-scatters' outputs are saved).
  cp       as the plan's framework runs it (``planner_frameworks.cp_method``):
           Megatron-LM's ring (TransformerEngine's, 6(c − 1)/c·s·b·h_kv per layer,
           ``cost.cp_comm_elems_per_layer`` reverse_backward=True), whose K/V hops
           overlap the attention compute of the current block (Liu et al. 2023);
           torchtitan's all-gather (torch 2.13's ``context_parallel`` default,
           (6c − 4)/c·s·b·h_kv: K/V gathered in forward and again in backward, dK/dV
           passed round the ring, ``cost.cp_allgather_elems_per_layer(implementation="torch")``),
           each all-gather hidden only behind the first local block, the dK/dV hops behind
           a block each but the last (``cp_time``).  Only what exceeds the overlap is exposed.
  pp       one hop per micro-batch each way on the slowest boundary, exposed
           (m·v + p − 1 hops each way); each TP rank sends b·s·h/(tp·cp)
           (Narayanan et al. 2021 §4.1 scatter/gather).  Boundaries are placed by
           rank on ``grid(plan)``: stages r and r+1 sit dp·cp·tp ranks apart, so a boundary
           crosses nodes when the two ranks fall in different nodes.
  dp       per micro-batch under ZeRO-2 (reduce-scatter after every backward) and
           ZeRO-3 (all-gather weights in forward and backward, reduce-scatter),
           once per step under ZeRO-0/1; gradient reductions overlap the
           backward bucket by bucket (``--overlap-grad-reduce``, DDP buckets),
           parameter all-gathers the next forward (ZeRO-1/2 ``--overlap-param-gather``,
           FSDP prefetch).  Gradients travel in fp32 under "fp32_grads" (Megatron
           reduces its fp32 grad buffer), weights in bf16.  A MoE model's routed experts
           reduce over their dp·cp/ep expert-data-parallel ranks only.  HSDP (Zhao et al. 2023,
           §3.2.2; ``Plan.shard``, ``hsdp_comm``): ZeRO-3 over the shard·cp ranks of a group and
           an all-reduce of each gradient shard over the dp/shard groups, every micro-batch
           (``cost.hsdp_comm_elems``), each axis at its own link's bandwidth (``hsdp_grid``:
           torchtitan's mesh, replicate outside shard); the all-reduces run on a stream of their
           own, so on different links the backward waits for the longer axis (``_hsdp_time``).
  ep       a MoE model under expert parallelism: per MoE layer and micro-batch the four
           all-to-alls of ``cost.ep_comm_elems_per_layer`` (dispatch and combine, forward and
           backward; again the forward's two under "full") for each TP rank's b·s/(cp·tp)
           tokens, × the busiest rank's load (``ModelSpec.imbalance``, capped by
           ``capacity``), exposed: Megatron-LM does not overlap them by default.  The
           group is ep ranks tp apart, Megatron-Core's expert grid "tp-ep-dp-pp" (``expert_grid``);
           across nodes when ep·tp exceeds a node.  Every axis's group is placed on a
           ``parallel.mesh.Grid`` (``grid``, ``axis_crosses``), the grid lab 07 uses.
           With ``Plan.ep_overlap`` they run beside another micro-batch's computation
           (DeepSeek-V3's DualPipe, DeepSeek-AI 2024 §3.2.1; Megatron-LM's
           ``--overlap-moe-expert-parallel-comm``): only what exceeds the stage's computation
           is exposed, and the computation runs on the SMs the all-to-all kernels leave it,
           1 − ``OVERLAP_SMS`` (20 of the H800's 132, §3.5.1).
Each collective costs a latency plus its per-rank ring bytes / busbw: the
link's busbw inside a node (``Cluster.nvlink_busbw``, 370 GB/s on NVLink 4,
nccl-tests issue #212) and ``network × network_efficiency`` across nodes.  The
latency is ``Cluster.latency`` (or ``network_latency``) for a group of up to one
node's GPUs and grows with the group as log2(n) (``group_latency``, an assumption);
point-to-point hops (PP, CP's ring) pay it once.  NCCL's Tree algorithm serves
all-reduce only: reduce-scatter and all-gather run as rings (PAT only with one GPU per
node in the group), whose latency grows linearly, so the log model fits the DP groups of
tp = 8 plans (one GPU per node) and is optimistic below that.  DP's
gradient buckets are Megatron-Core's default, max(40M, 1M·dp) parameters each
(``DistributedDataParallelConfig.bucket_size``).
In both time models, ``cap`` is what keeps a plan's MFU (``cost.mfu``, PaLM's convention) under
``Cluster.best_mfu``, the best published for its GPU generation, without changing the order of
plans (``capped_time``: above ``CAP_KNEE`` of that MFU the predicted share is bent towards it).
With ``Cluster(calibrated=True)`` (issue 30, item 3; not the default: docs/planner.md measures the
band both ways) two more terms:
  memory    the memory-bound kernels at ``Cluster.hbm_bandwidth`` (``_memory_bound_bytes``: norms,
            residual adds, the MLP's activation, dropout, stored scores' softmax; the loss over
            fp32 logits on the last stage), part of each micro-batch's stage time;
  optimizer the optimizer step, once per step: ``optimizer_bytes`` (18 read, 14 written) per
            parameter this GPU updates, at the HBM's bandwidth;
and fused causal attention timed at half the score FLOPs (``_attention_flops``).
Left out: NCCL's algorithm choice for bandwidth (ring assumed; tree, NVLS, PAT), congestion between axes sharing
a link, kernel launch gaps, stragglers, the optimizer step's own time (unless calibrated), the
data loader, FP8 GEMMs, async TP, zero-bubble schedules (DualPipe only for a plan given
``schedule="dualpipe"``); for MoE: the all-to-all's split over NVLink and the network, small experts'
less efficient GEMMs, and where the dense layers sit.
DeepSeek-V3's recipe (DeepSeek-AI 2024), priced for a plan that asks for it and never generated by the
search: ``Plan(schedule="dualpipe")`` (``DUALPIPE``: two parameter copies, PP + 1 micro-batches of
activations, the bubble (PP/2 − 1)·2/3 of a micro-batch, the pipeline's sends beside the computation),
``Plan(act_cache="fp8")`` (``cost.activation_bytes_per_layer(cache="fp8")``) and precision
"bf16_moments" (2 + 4 + 8 bytes per parameter); MLA's heads and latent in ``ModelSpec``.

    >>> from parlab import planner
    >>> best = planner.search(planner.SCENARIOS["7B on 8 H100s"])
    >>> best.plan.tp, best.fits
    (1, True)

One module, not split further: ``Plan``, ``Workload``, the memory and time models and the
search read the same fields and call one another both ways (the search scores plans with the
models; the models' checks are the search's filter), and lab 06 grades students against these
functions by name.  What stands apart already lives in ``frameworks``, ``published`` and ``band``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace  # noqa: F401  (replace is part of the API)

from .. import cost
from ..parallel.mesh import Grid
from . import frameworks

__all__ = ["ModelSpec", "Cluster", "Plan", "Workload", "Prediction", "Problem", "memory_breakdown", "optimizer_bytes",
           "memory_per_gpu", "stage_memory", "stage_layers", "step_time", "tp_time", "cp_time", "pp_time", "ep_time", "dp_time",
           "hsdp_comm", "hsdp_grid", "optimizer_time", "bubble_stages", "ep_comm", "layer_flops", "problems", "ep_problems", "predict",
           "search", "candidates", "simplicity", "grid", "expert_grid", "axis_crosses", "fewest_recomputed", "recomputed_share", "time_to_train", "explained", "SCENARIOS", "DGX_H100",
           "A100_40GB", "A100_80GB", "H100_SXM", "H200", "cpu_host", "PRECISIONS", "RECOMPUTE",
           "RECOMPUTE_MODES", "op_sac_priced"]

BF16 = 2  # bytes per element of weights and activations on the wire
FP8 = 1
PRECISIONS = tuple(cost.PRECISIONS)
RECOMPUTE = cost.RECOMPUTE  # Megatron-LM's modes: none, Korthikanti's selective, full
#: every mode a plan may ask for: ``RECOMPUTE`` and torchtitan's op-level selective checkpointing, "op"
#: (``cost.op_sac_saved``, ``cost.op_sac_recomputed_flops``), which only torchtitan runs
#: (``frameworks.RECOMPUTE_BY_FRAMEWORK``)
RECOMPUTE_MODES = cost.RECOMPUTE_MODES
TILE = 128  # GEMM dimension at which the efficiency factor is one half (one tensor-core tile)
LOGIT_BYTES = 4  # fp32 logits for the loss
CP_FROM = 16384  # the search tries context parallelism from this sequence length on
#: The share of the SMs the all-to-all kernels take while they overlap computation: DeepSeek-V3
#: allocates "20 out of the 132 SMs available in the H800 GPU" to them (DeepSeek-AI 2024, §3.5.1; §3.2.2:
#: "only 20 SMs are sufficient to fully utilize the bandwidths of IB and NVLink").
OVERLAP_SMS = 20 / 132
SCHEDULES = ("1f1b", "dualpipe")
#: DualPipe (DeepSeek-AI 2024, §3.2.1, Table 2), as ``Plan(schedule="dualpipe")`` prices it: micro-batches
#: enter from both ends of the pipeline, each rank holds two model chunks' parameters ("Parameter 2×";
#: their gradients too, each copy accumulating its own) and PP + 1 micro-batches of activations; its bubble
#: is (PP/2 − 1)(F&B + B − 3W), with B the whole backward, W its weight part and F&B a forward and a
#: backward chunk run together, here F + B (their computation does not shrink, only the communication
#: beside it hides): with B = 2F and W = F (2, 4 and 2 FLOPs per weight and token), (PP/2 − 1)·2F, i.e.
#: (PP/2 − 1)·2/3 of a micro-batch's stage time, against 1F1B's (PP − 1)·1.  The pipeline's sends run
#: beside the computation too ("both all-to-all and PP communication can be fully hidden").
DUALPIPE = {"parameter_copies": 2, "extra_microbatches": 1, "bubble_per_stage_pair": 2 / 3}


def _whole(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer: Ψ parameters, L layers, hidden h, a heads, sequence s.

    ``vocab`` V (embedding and output layer, V·h each unless ``tied``), ``ffn``
    the MLP width (default 4h), ``kv_heads`` (default = heads; fewer for
    grouped-query attention: K/V activations and the K/V that context parallelism
    passes around), ``scores``: True for attention that stores its s×s scores
    (Korthikanti's 5as/h term), False (default) for FlashAttention/SDPA;
    ``gated``: a SwiGLU MLP (three ffn-wide matrices, Llama), ``dropout``: False
    for models trained without it (Llama 2 and 3).  ``params`` is the whole count
    (SwiGLU's third matrix included), from which each layer's share is derived.

    A mixture of experts (``experts`` > 0): ``moe_layers`` of the layers (0: all) replace
    their MLP by ``experts`` routed experts of width ``expert_ffn`` (each token goes to
    ``top_k`` of them) plus ``shared_experts`` that every token goes through (DeepSeekMoE,
    Dai et al. 2024).  The routed experts' weights (``expert_params``) are sharded over
    expert parallelism (``Plan.ep``), the rest (attention, norms, router, shared experts,
    the dense layers' MLPs: ``dense_params``) over data parallelism as in a dense model.
    Both are spread evenly over the layers (a model whose first layers are dense, as
    DeepSeek-V3's first 3 of 61 are, is averaged).  A token's compute is that of the
    active parameters (``active_params``).  ``imbalance`` is the busiest expert-parallel
    rank's share of the assignments over the mean; default 1.0, balanced, the assumption
    ``cost.ep_comm_elems_per_layer`` makes, and what DeepSeek-V3's auxiliary-loss-free
    balancing aims at: it reports good balance and drops no token (DeepSeek-AI 2024, §2.1.2).
    Raise it for a model whose routing is less even: the busiest rank's expert compute and
    all-to-all grow with it.  ``capacity`` is the capacity factor; default 0, dropless,
    Megatron-Core's default (``moe_expert_capacity_factor=None``) and DeepSeek-V3's; GShard
    and Switch Transformer cap each expert at a factor of 1.0-2.0 of the mean (Fedus et al.
    2021, §2.1): no rank then processes more than capacity × the mean, the rest is dropped.

    ``qk_head_dim`` and ``v_head_dim`` give heads wider than h/a, as multi-head latent attention's
    (MLA, DeepSeek-V2 and V3: 128 + 64 for the queries and keys with their rotary part, 128 for the
    values, DeepSeek-AI 2024 §4.2): the score and value FLOPs grow with them (``attention_width``),
    and so do Q, K, V and the attention output in the activations.  ``latent`` is MLA's compressed
    width per token, q_lora_rank + kv_lora_rank + the shared rotary key (1,536 + 512 + 64 for
    DeepSeek-V3), which the up-projections read (``cost.activation_bytes_per_layer``).  MLA's
    low-rank projections are ordinary weights in ``params``.
    """

    name: str
    params: float
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int = 32000
    ffn: int = 0  # 0: 4·hidden
    kv_heads: int = 0  # 0: heads
    tied: bool = False
    scores: bool = False
    gated: bool = False
    dropout: bool = True
    experts: int = 0  # routed experts per MoE layer (0: a dense model)
    top_k: int = 0  # routed experts per token
    expert_ffn: int = 0  # each expert's MLP width
    shared_experts: int = 0  # experts every token goes through
    moe_layers: int = 0  # layers with experts (0: all, when experts > 0)
    imbalance: float = 1.0  # busiest EP rank's assignments ÷ the mean
    capacity: float = 0.0  # capacity factor (0: dropless)
    qk_head_dim: int = 0  # each head's query/key width (0: hidden // heads)
    v_head_dim: int = 0  # each head's value width (0: hidden // heads)
    latent: int = 0  # MLA: compressed values per token the up-projections read (0: no MLA)

    def __post_init__(self) -> None:
        if not self.params > 0:
            raise ValueError(f"params must be > 0, got {self.params!r}")
        for key in ("layers", "hidden", "heads", "seq", "vocab"):
            _whole(key, getattr(self, key))
        for key in ("experts", "top_k", "expert_ffn", "shared_experts", "moe_layers"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{key} must be a whole number >= 0, got {value!r}")
        if self.experts:
            if not 1 <= self.top_k <= self.experts or not self.expert_ffn:
                raise ValueError(f"a MoE model needs 1 <= top_k <= experts and expert_ffn >= 1, got "
                                 f"top_k={self.top_k}, experts={self.experts}, expert_ffn={self.expert_ffn}")
            if self.moe_layers > self.layers:
                raise ValueError(f"moe_layers={self.moe_layers} is more than the {self.layers} layers")
        elif self.top_k or self.expert_ffn or self.shared_experts or self.moe_layers:
            raise ValueError("top_k, expert_ffn, shared_experts and moe_layers describe experts: give experts too "
                             "(ModelSpec(experts=..., top_k=..., expert_ffn=...))")
        if not self.imbalance >= 1:
            raise ValueError(f"imbalance is the busiest rank's load over the mean, >= 1; got {self.imbalance!r}")
        if self.capacity != 0 and not self.capacity >= 1:
            raise ValueError(f"capacity must be 0 (dropless) or a factor >= 1, got {self.capacity!r}")
        for key in ("ffn", "kv_heads", "qk_head_dim", "v_head_dim", "latent"):
            value = getattr(self, key)
            if value != 0:
                _whole(key, value)
        if self.kv_heads and self.heads % self.kv_heads:
            raise ValueError(f"kv_heads={self.kv_heads} must divide heads={self.heads}")
        if self.layer_params <= 0:
            raise ValueError(f"params={self.params:.3g} is smaller than the embedding and output layer "
                             f"({self.embedding_params:.3g}): check vocab and hidden")
        if self.dense_params <= 0:
            raise ValueError(f"params={self.params:.3g} leaves nothing beside the embedding, output layer and the "
                             f"routed experts ({self.expert_params:.3g}): check experts, expert_ffn and moe_layers")

    @property
    def ffn_width(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def attention_width(self) -> float:
        """heads × (qk_head_dim + v_head_dim) / 2: the width that sets the score and value FLOPs (h
        for heads of width h/a)."""
        if not (self.qk_head_dim or self.v_head_dim):
            return self.hidden
        base = self.hidden / self.heads
        return self.heads * ((self.qk_head_dim or base) + (self.v_head_dim or base)) / 2

    @property
    def shape(self) -> dict:
        """The layer's shape as ``cost.activation_bytes_per_layer`` takes it (ffn, gated, kv_heads, dropout, MLA's
        head widths and latent)."""
        return dict(ffn=self.ffn_width, gated=self.gated, kv_heads=self.kv, dropout=self.dropout,
                    qk_dim=self.qk_head_dim or None, v_dim=self.v_head_dim or None, latent=self.latent)

    @property
    def embedding_params(self) -> float:
        """V·h for the embedding, plus V·h for an untied output layer."""
        return self.vocab * self.hidden * (1 if self.tied else 2)

    @property
    def layer_params(self) -> float:
        return (self.params - self.embedding_params) / self.layers

    @property
    def moe_layer_count(self) -> int:
        return (self.moe_layers or self.layers) if self.experts else 0

    @property
    def expert_params(self) -> float:
        """The routed experts' weights: MoE layers × experts × (3 if gated else 2)·h·expert_ffn."""
        return self.moe_layer_count * self.experts * (3 if self.gated else 2) * self.hidden * self.expert_ffn

    @property
    def dense_params(self) -> float:
        """Everything but the routed experts, the embedding and the output layer."""
        return self.params - self.embedding_params - self.expert_params

    @property
    def active_params(self) -> float:
        """Parameters a token goes through: all but the routed experts it is not sent to."""
        if not self.experts:
            return self.params
        return self.params - self.expert_params * (1 - self.top_k / self.experts)

    @property
    def load(self) -> float:
        """The busiest expert-parallel rank's assignments over the mean: the imbalance, capped by the capacity."""
        return min(self.imbalance, self.capacity) if self.capacity else self.imbalance


@dataclass(frozen=True)
class Cluster:
    """GPUs, their memory and links.  Defaults: H100 SXM nodes of 8 (DGX H100).

    ``nvlink`` is the bytes/s one GPU sends per direction inside a node (450 GB/s,
    NVLink 4) and ``nvlink_busbw`` what ring collectives reach there (about
    370 GB/s on a DGX H100, nccl-tests issue #212); ``network`` the bytes/s per
    GPU between nodes (one 400 Gb/s ConnectX-7 per GPU: 50 GB/s), of which
    ``network_efficiency`` is reached (0.8, an assumption: NCCL's ring over
    InfiniBand typically reports 40-45 GB/s busbw per 400 Gb/s NIC).
    ``latency`` and ``network_latency``: seconds per collective (about 6 µs for a
    small all-reduce on NVLink; 15 µs across nodes, an assumption).
    ``efficiency`` is the share of peak FLOP/s that large GEMMs reach in
    training (the shape factor is applied on top).  ``headroom``: the share of
    HBM a plan may use.  ``hbm_bandwidth``: the HBM's bytes/s (datasheet), at which the
    memory-bound kernels and the optimizer step are timed (a datasheet peak: real kernels
    reach less, so that time is a lower bound).  ``best_mfu``: the best model-FLOPs
    utilisation published for the GPU generation; no plan is predicted at or above it (Hopper:
    47 %, Megatron-Core's "up to 47 % MFU on H100", NVIDIA Megatron-LM README; Ampere:
    58.2 %, torchtitan's Llama 3 8B with FSDP on 64 A100s, docs/performance.md at 1d5815c).  Both are
    2024 software: the planner models that era, and is optimistic for older stacks (Megatron-LM's 2021
    runs reached 33-39 % MFU on A100s; docs/planner.md, "The software era the planner models").
    ``calibrated``: True times the memory-bound kernels and the optimizer step from
    ``hbm_bandwidth`` and fused causal attention at its real work (half the scores) (issue 30,
    item 3); False (the default) is planner v3's time model, which the labs and the deck quote.
    Both cap the MFU (``capped_time``).  docs/planner.md measures the band both ways and says
    why the calibrated model is not the default (its band is wider).
    """

    gpus: int
    gpus_per_node: int = 8
    memory: float = cost.H100_MEMORY
    peak_flops: float = cost.H100_BF16_PEAK
    nvlink: float = 450e9
    network: float = 50e9
    efficiency: float = 0.55
    nvlink_busbw: float = 370e9
    network_efficiency: float = 0.8
    latency: float = 6e-6
    network_latency: float = 15e-6
    headroom: float = 0.9
    hbm_bandwidth: float = cost.H100_HBM_BANDWIDTH
    name: str = "H100 SXM"
    best_mfu: float = 0.47
    calibrated: bool = False

    def __post_init__(self) -> None:
        _whole("gpus", self.gpus)
        _whole("gpus_per_node", self.gpus_per_node)
        for key in ("memory", "peak_flops", "nvlink", "network", "nvlink_busbw", "hbm_bandwidth"):
            if not getattr(self, key) > 0:
                raise ValueError(f"{key} must be > 0, got {getattr(self, key)!r}")
        for key in ("latency", "network_latency"):
            if not getattr(self, key) >= 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)!r}")
        for key in ("efficiency", "network_efficiency", "headroom", "best_mfu"):
            if not 0 < getattr(self, key) <= 1:
                raise ValueError(f"{key} must be in (0, 1], got {getattr(self, key)!r}")

    @property
    def usable_memory(self) -> float:
        return self.memory * self.headroom

    def with_gpus(self, gpus: int) -> "Cluster":
        return replace(self, gpus=gpus)

    def with_nodes(self, layout) -> "Cluster":
        """These GPUs laid out as a launch's real nodes: ``gpus`` and ``gpus_per_node`` from
        ``layout`` (a ``parlab.parallel.node_layout.NodeLayout``), so that the plans' TP and
        pipeline boundaries cross nodes where the launch's do."""
        return replace(self, gpus=layout.world_size, gpus_per_node=layout.per_node)

    @classmethod
    def from_launch(cls, env=None, **kw) -> "Cluster":
        """A cluster with the node count and GPUs per node of the launch this process runs in.

        Read by ``NodeLayout.from_env`` (torchrun's variables in a rank, Slurm's in
        an allocation); ``kw`` sets the other fields (default: an H100 SXM's).
        """
        from ..parallel.node_layout import NodeLayout

        layout = NodeLayout.from_env(env)
        if layout is None:
            raise ValueError("Cluster.from_launch: this process is not in a launch (no torchrun "
                             "GROUP_WORLD_SIZE/LOCAL_WORLD_SIZE, no Slurm SLURM_NNODES/SLURM_GPUS_ON_NODE). "
                             "Call it inside parlab.launch, or give the sizes: Cluster(gpus, gpus_per_node=...).")
        given = sorted({"gpus", "gpus_per_node"} & set(kw))
        if given:
            raise TypeError(f"Cluster.from_launch: {', '.join(given)} come(s) from the launch ({layout.source})")
        return cls(layout.world_size, **kw).with_nodes(layout)


# Presets (per GPU).  Peak dense BF16, HBM and NVLink from NVIDIA's A100 (2021), H100
# (2023) and H200 (2024) datasheets; network: DGX A100 has 8 × 200 Gb/s HDR (25 GB/s per
# GPU), DGX H100/H200 8 × 400 Gb/s NDR (50 GB/s per GPU).  nvlink_busbw: 370 GB/s measured
# on NVLink 4 (nccl-tests #212); for NVLink 3 (300 GB/s per direction) the same 0.82 share
# of the link, 246 GB/s, is assumed.  efficiency: the share of peak large training GEMMs
# reach, one value per GPU generation, set once against the runs in docs/planner.md
# (A100s reach a larger share of their lower peak than H100s do, as the published MFUs show).
AMPERE_BEST_MFU = 0.582  # torchtitan, Llama 3 8B, FSDP, 64 A100 80GB, selective op AC (docs/performance.md)


def A100_40GB(gpus: int = 8, **kw) -> Cluster:
    return Cluster(gpus, **{**dict(memory=40e9, peak_flops=312e12, nvlink=300e9, nvlink_busbw=246e9,
                                   network=25e9, efficiency=0.70, hbm_bandwidth=1.555e12,
                                   name="A100 40GB", best_mfu=AMPERE_BEST_MFU), **kw})


def A100_80GB(gpus: int = 8, **kw) -> Cluster:
    return Cluster(gpus, **{**dict(memory=80e9, peak_flops=312e12, nvlink=300e9, nvlink_busbw=246e9,
                                   network=25e9, efficiency=0.70, hbm_bandwidth=2.039e12,
                                   name="A100 80GB", best_mfu=AMPERE_BEST_MFU), **kw})


def H100_SXM(gpus: int = 8, **kw) -> Cluster:
    return Cluster(gpus, **kw)


def H200(gpus: int = 8, **kw) -> Cluster:
    return Cluster(gpus, **{**dict(memory=141e9, hbm_bandwidth=4.8e12, name="H200"), **kw})


def cpu_host(cores: int, ranks: int, flops_per_core: float, gloo_busbw: float = 1.5e9,
             gloo_latency: float = 2e-4, memory: float = 8e9, efficiency: float = 1.0,
             hbm_bandwidth: float = 20e9) -> Cluster:
    """A CPU machine running ``ranks`` gloo ranks: one "node" whose links are gloo over loopback.

    ``flops_per_core`` should be measured (a matmul timed on one thread);
    ``gloo_busbw`` and ``gloo_latency`` too (lab 01's sweep measures them; the
    defaults are of the order gloo reaches over loopback on a small machine).
    Each rank gets cores // ranks cores, or a share cores / ranks of one core
    when there are more ranks than cores (they then take turns on the cores).
    """
    _whole("cores", cores)
    _whole("ranks", ranks)
    per_rank = (cores // ranks if cores >= ranks else cores / ranks) * flops_per_core
    return Cluster(ranks, gpus_per_node=ranks, memory=memory, peak_flops=per_rank, nvlink=gloo_busbw,
                   nvlink_busbw=gloo_busbw, network=gloo_busbw, efficiency=efficiency,
                   latency=gloo_latency, network_latency=gloo_latency, headroom=1.0,
                   hbm_bandwidth=hbm_bandwidth, best_mfu=1.0, name=f"CPU host ({cores} cores, gloo)")


DGX_H100 = Cluster(gpus=8)


@dataclass(frozen=True)
class Workload:
    """A model to train on a cluster with ``global_batch`` sequences per optimizer step.

    ``precision`` is the recipe the search uses for its plans ("fp32_grads" by default).  ``hsdp``: True
    lets the search (``candidates``, ``search``, ``band``) try HSDP too (``Plan.shard``, every shard
    dividing dp); False, the default, keeps it to the plans lab 06's exercise searches (docs/planner.md,
    "HSDP", says where HSDP would win).  ``predict`` prices an HSDP plan either way.  ``op_sac``: True lets
    the search try torchtitan's op-level selective checkpointing (``Plan(recompute="op")``) on the layouts
    torchtitan runs, for models it prices (``op_sac_priced``); False, the default, keeps the search to the
    modes lab 06 and the lecture's bands were drawn with (docs/planner.md, "torchtitan's checkpointing").
    """

    model: ModelSpec
    cluster: Cluster
    global_batch: int
    tokens: float = 0.0  # tokens to train on, for the time to train (0: not asked)
    precision: str = "fp32_grads"
    hsdp: bool = False
    op_sac: bool = False

    def __post_init__(self) -> None:
        _whole("global_batch", self.global_batch)
        if self.precision not in cost.PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {self.tokens!r}")
        if not isinstance(self.hsdp, bool):
            raise ValueError(f"hsdp must be True or False, got {self.hsdp!r}")
        if not isinstance(self.op_sac, bool):
            raise ValueError(f"op_sac must be True or False, got {self.op_sac!r}")


@dataclass(frozen=True)
class Plan:
    """One layout, frozen (change one with ``dataclasses.replace``).

    Fields: dp, tp, pp, zero, micro_batch, accum, recompute ("none",
    "selective" (Korthikanti's, Megatron-LM's), "full"; a bool still works: False -> "none", True -> "full";
    or "op", torchtitan's op-level selective checkpointing: ``cost.op_sac_saved``),
    cp (context parallel), sp (Megatron sequence parallelism; None: on when
    tp > 1), v (interleaved 1F1B chunks per rank; 1 = plain 1F1B), stages
    (layers per pipeline stage, or () for the default split), precision
    ("fp32_grads" or "zero16"), ep (expert parallelism: a MoE model's routed experts split
    over ep ranks of the dp·cp data-parallel ones, as Megatron-LM's
    ``--expert-model-parallel-size``; their states are then sharded over the dp·cp/ep
    expert-data-parallel ranks), recompute_layers (with recompute "full": recompute only this many
    layers of each model chunk, a stage's when v = 1, and keep the others' activations whole:
    Megatron-LM's ``--recompute-method block --recompute-num-layers K``; 0, the default, recomputes
    every layer, ``--recompute-method uniform --recompute-num-layers 1``), recompute_every (with recompute
    "full": torchtitan's layer-level selective checkpointing, ``selective_ac_option = "k"``, which wraps every
    k-th block of the model in a full checkpoint: floor(L/k) of the L layers recomputed, the others keep all
    of their activations; 0, the default, is every layer or Megatron-LM's block), ep_overlap (with ep > 1: the
    expert-parallel all-to-alls run beside another micro-batch's computation, as DeepSeek-V3's DualPipe
    and Megatron-LM's ``--overlap-moe-expert-parallel-comm`` run them; see ``step_time``), schedule
    ("1f1b", interleaved when v > 1; or "dualpipe", DeepSeek-V3's bidirectional schedule: see
    ``DUALPIPE``), act_cache ("bf16"; or "fp8", DeepSeek-V3's cached activations:
    ``cost.activation_bytes_per_layer``), shard (HSDP, hybrid sharded data parallelism, with zero=3:
    ZeRO-3 inside groups of ``shard`` data-parallel ranks, × cp, and those groups ``replicate`` =
    dp/shard copies of each other, Zhao et al. 2023 §3.2.2; torchtitan's ``data_parallel_shard_degree``
    and ``data_parallel_replicate_degree``; 0, the default, or dp: plain ZeRO over every dp·cp rank),
    why (axis -> one line of reasoning, not compared).
    ``micro_batch × accum`` is one replica's rows: dp·micro_batch·accum must
    equal the global batch.
    """

    dp: int
    tp: int
    pp: int
    zero: int = 0
    micro_batch: int = 1
    accum: int = 1
    recompute: str = "none"
    cp: int = 1
    sp: bool | None = None
    v: int = 1
    stages: tuple = ()
    precision: str = "fp32_grads"
    ep: int = 1
    recompute_layers: int = 0
    ep_overlap: bool = False
    schedule: str = "1f1b"
    act_cache: str = "bf16"
    shard: int = 0
    recompute_every: int = 0
    why: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for key in ("dp", "tp", "pp", "micro_batch", "accum", "cp", "v", "ep"):
            _whole(key, getattr(self, key))
        if self.zero not in cost.ZERO_STAGES:
            raise ValueError(f"zero must be one of {cost.ZERO_STAGES}, got {self.zero!r}")
        if self.recompute is True or self.recompute is False:
            object.__setattr__(self, "recompute", cost.recompute_mode(self.recompute))
        if self.recompute not in RECOMPUTE_MODES:
            raise ValueError(f"recompute must be one of {RECOMPUTE_MODES} (or a bool), got {self.recompute!r}")
        if self.sp is None:
            object.__setattr__(self, "sp", self.tp > 1)
        if not isinstance(self.sp, bool):
            raise ValueError(f"sp must be True, False or None, got {self.sp!r}")
        if self.precision not in cost.PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        stages = tuple(self.stages)
        object.__setattr__(self, "stages", stages)
        if stages:
            for n in stages:
                _whole("stages[i]", n)
            if len(stages) != self.pp:
                raise ValueError(f"stages lists {len(stages)} stages, but pp={self.pp}")
        if self.v > 1 and self.pp == 1:
            raise ValueError(f"v={self.v} (interleaved 1F1B) needs pp > 1")
        if isinstance(self.recompute_layers, bool) or not isinstance(self.recompute_layers, int) \
                or self.recompute_layers < 0:
            raise ValueError(f"recompute_layers must be a whole number >= 0, got {self.recompute_layers!r}")
        if not isinstance(self.ep_overlap, bool):
            raise ValueError(f"ep_overlap must be True or False, got {self.ep_overlap!r}")
        if self.ep_overlap and self.ep == 1:
            raise ValueError("ep_overlap overlaps expert parallelism's all-to-alls: it needs ep > 1")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.act_cache not in cost.ACTIVATION_CACHES:
            raise ValueError(f"act_cache must be one of {cost.ACTIVATION_CACHES}, got {self.act_cache!r}")
        if self.schedule == "dualpipe" and (self.pp < 2 or self.pp % 2 or self.accum % 2 or self.v > 1):
            raise ValueError(f"schedule=\"dualpipe\" needs an even pp >= 2 and an even number of micro-batches "
                             f"(DeepSeek-AI 2024, §3.2.1) and no interleaving (v=1); got pp={self.pp}, "
                             f"accum={self.accum}, v={self.v}")
        if self.recompute_layers and self.recompute != "full":
            raise ValueError(f"recompute_layers={self.recompute_layers} (Megatron-LM's block recomputation) "
                             f"needs recompute=\"full\", got {self.recompute!r}")
        if isinstance(self.recompute_every, bool) or not isinstance(self.recompute_every, int) \
                or self.recompute_every < 0:
            raise ValueError(f"recompute_every must be a whole number >= 0, got {self.recompute_every!r}")
        if self.recompute_every and (self.recompute != "full" or self.recompute_layers):
            raise ValueError(f"recompute_every={self.recompute_every} (torchtitan's every k-th layer) needs "
                             f"recompute=\"full\" and no recompute_layers, got {self.recompute!r} and "
                             f"recompute_layers={self.recompute_layers}")
        if isinstance(self.shard, bool) or not isinstance(self.shard, int) or self.shard < 0:
            raise ValueError(f"shard must be a whole number >= 0 (0: plain ZeRO over every rank), "
                             f"got {self.shard!r}")
        if self.shard and self.dp % self.shard:
            raise ValueError(f"shard={self.shard} (HSDP's group of data-parallel ranks) must divide dp={self.dp}")
        if self.shard == self.dp:  # one group of every rank: plain ZeRO-3, one way to write it
            object.__setattr__(self, "shard", 0)
        if self.shard and self.zero != 3:
            raise ValueError(f"shard={self.shard} is HSDP, ZeRO-3 inside groups of shard ranks: it needs zero=3, "
                             f"got zero={self.zero} (shard=0 for plain ZeRO-{self.zero})")

    @property
    def gpus(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def replicate(self) -> int:
        """HSDP's replicate degree, dp/shard: how many copies of each shard group (1: plain ZeRO)."""
        return self.dp // self.shard if self.shard else 1

    @property
    def sharded_over(self) -> int:
        """The ranks the model states are sharded over under ZeRO: HSDP's shard·cp, otherwise dp·cp."""
        return (self.shard or self.dp) * self.cp

    def __str__(self) -> str:
        extra = "".join([f" cp={self.cp}" if self.cp > 1 else "", f" ep={self.ep}" if self.ep > 1 else "",
                         " (all-to-all overlapped)" if self.ep_overlap else "",
                         f" v={self.v}" if self.v > 1 else "",
                         " DualPipe" if self.schedule == "dualpipe" else "",
                         " FP8-cached activations" if self.act_cache == "fp8" else "",
                         " Adam moments in bf16" if self.precision == "bf16_moments" else "",
                         " SP" if self.sp and self.tp > 1 else "",
                         f" HSDP shard={self.shard} replicate={self.replicate}" if self.shard else "",
                         " op-level selective recompute (torchtitan)" if self.recompute == "op" else
                         f" {self.recompute} recompute" if self.recompute != "none" else "",
                         f" of {self.recompute_layers} layer(s) per {'chunk' if self.v > 1 else 'stage'}"
                         if self.recompute_layers else "",
                         f" of 1 layer in {self.recompute_every} (torchtitan)" if self.recompute_every else ""])
        return (f"dp={self.dp} tp={self.tp} pp={self.pp} ZeRO-{self.zero} micro_batch={self.micro_batch} "
                f"accum={self.accum}" + extra)


# ---------------------------------------------------------------- memory
def stage_layers(plan: Plan, model: ModelSpec) -> tuple:
    """Layers per pipeline stage: ``plan.stages``, or the first L mod pp stages take one more."""
    return plan.stages or cost.stage_sizes(model.layers, plan.pp)


def recomputed_share(plan: Plan, layers: int) -> float:
    """The share of a stage's ``layers`` whose forward is recomputed: 0 without "full", 1 under "full"
    of every layer, and min(1, K·v/layers) under Megatron-LM's block recomputation of K =
    ``plan.recompute_layers`` layers in each of the stage's v model chunks (Megatron-Core's
    ``recompute_num_layers`` counts a chunk's layers: transformer_block.py sets
    ``num_layers_per_pipeline_rank = len(self.layers)``, one chunk's, and recompute.py checkpoints the
    first K of them).  Under torchtitan's every k-th layer (``plan.recompute_every``), floor(layers/k)/layers:
    torchtitan counts the blocks it wraps and checkpoints those whose count is a multiple of k
    (``_apply_ac_to_transformer_block``, parallelize_llama.py at 9dec370; torchtitan runs it with pp = 1
    here, so the stage is the model).  Which layers are recomputed does not change the planner's count, so
    K = floor(L/k) block-recomputed layers price the same; ``recompute_every`` says which framework runs it
    and prints its k."""
    if plan.recompute != "full":
        return 0.0
    if plan.recompute_every:
        return (layers // plan.recompute_every) / layers
    if not plan.recompute_layers:
        return 1.0
    return min(1.0, plan.recompute_layers * plan.v / layers)


def _load(plan: Plan, model: ModelSpec) -> float:
    """The busiest rank's expert load over the mean: ``model.load`` under EP; 1 when every rank holds
    every expert (ep = 1: its own tokens' assignments, whatever the routing)."""
    return model.load if plan.ep > 1 else 1.0


def _act_layer(plan: Plan, model: ModelSpec, mode: str) -> float:
    """Activation bytes of one layer (averaged over dense and MoE layers).  A MoE layer's MLP is counted as
    one of width (top_k·load + shared)·expert_ffn per token (the rows its experts process), plus the
    top_k·load dispatched copies of its input (bf16, or FP8 with ``act_cache="fp8"``; h wide, split by TP
    with SP)."""
    def one(ffn: int, extra: float) -> float:
        shape = {**model.shape, "ffn": ffn}
        gathered = frameworks.sp_keeps_gathered(plan)  # torchtitan's SP keeps the gathered inputs
        return cost.activation_bytes_per_layer(model.seq / plan.cp, plan.micro_batch, model.hidden, model.heads,
                                               t=plan.tp, sp=plan.sp, recompute=mode, scores=model.scores,
                                               cache=plan.act_cache, sp_gathered=gathered, **shape) + extra
    dense = one(model.ffn_width, 0.0)
    if not model.experts:
        return dense
    rows = model.top_k * _load(plan, model)
    width = max(1, round((rows + model.shared_experts) * model.expert_ffn))
    dispatched = FP8 if plan.act_cache == "fp8" else BF16  # dispatched in FP8 (DeepSeek-AI 2024, §3.3.2)
    copies = 0.0 if mode == "full" else dispatched * rows * model.seq / plan.cp * plan.micro_batch * model.hidden / plan.tp
    share = model.moe_layer_count / model.layers
    return share * one(width, copies) + (1 - share) * dense


def _stage_split(plan: Plan, model: ModelSpec, rank: int) -> tuple[float, float]:
    """(dense, routed-expert) parameters of stage ``rank``, all TP and EP ranks together."""
    n = stage_layers(plan, model)[rank]
    experts = n * model.expert_params / model.layers
    dense = n * model.dense_params / model.layers
    if rank == 0:
        dense += model.vocab * model.hidden
    if rank == plan.pp - 1 and (not model.tied or plan.pp > 1):
        dense += model.vocab * model.hidden
    return dense, experts


def _stage_params(plan: Plan, model: ModelSpec, rank: int) -> float:
    """Parameters of stage ``rank`` (all TP ranks together): its layers, embedding, output layer."""
    return sum(_stage_split(plan, model, rank))


def stage_memory(plan: Plan, model: ModelSpec, rank: int) -> dict[str, float]:
    """Bytes per GPU on pipeline stage ``rank``: weights, grads, optimizer, activations."""
    n = stage_layers(plan, model)[rank]
    dense, experts = _stage_split(plan, model, rank)
    dense, experts = dense / plan.tp, experts / (plan.tp * plan.ep)  # each GPU's shard
    w, g, o = cost.PRECISIONS[plan.precision]
    d = plan.dp * plan.cp
    e = max(1, d // plan.ep)  # expert-data-parallel ranks

    def held(per_param: float, from_stage: int) -> float:
        sharded = plan.zero >= from_stage
        return per_param * (dense / (d if sharded else 1) + experts / (e if sharded else 1))
    weights, grads, optimizer = held(w, 3), held(g, 2), held(o, 1)
    if plan.shard:  # HSDP: ZeRO-3 inside each group of shard·cp ranks, whatever the replicate degree
        s, r = plan.sharded_over, plan.replicate

        def hsdp(b: tuple) -> float:
            return (cost.hsdp_memory_per_gpu(dense, r, s, *b)
                    + cost.hsdp_memory_per_gpu(experts, r, max(1, s // plan.ep), *b))
        weights, grads, optimizer = hsdp((w, 0, 0)), hsdp((0, g, 0)), hsdp((0, 0, o))
    m = plan.accum
    if plan.schedule == "dualpipe":
        copies = DUALPIPE["parameter_copies"]
        weights, grads = copies * weights, copies * grads
        held = min(m, plan.pp + DUALPIPE["extra_microbatches"])
    elif plan.v > 1:
        held = cost.activations_held(plan.pp, m, "interleaved", rank=rank, v=plan.v)
    else:
        held = cost.activations_held(plan.pp, m, "1f1b", rank=rank)
    if plan.recompute == "full":  # recomputed layers keep their input only, the others (block) all of it
        share = recomputed_share(plan, n)
        per_layer = share * _act_layer(plan, model, "full") + (1 - share) * _act_layer(plan, model, "none")
        acts = per_layer * n * held + _act_layer(plan, model, "none")  # + the layer being recomputed
    else:
        acts = _act_layer(plan, model, plan.recompute) * n * held
        if plan.recompute == "selective" and model.scores:  # its recomputed scores
            acts += _act_layer(plan, model, "none") - _act_layer(plan, model, "selective")
        if plan.recompute == "op":  # the layer being recomputed: what it did not save, again
            acts += max(0.0, _act_layer(plan, model, "none") - _act_layer(plan, model, "op"))
    if rank == plan.pp - 1:
        acts += LOGIT_BYTES * plan.micro_batch * model.seq / plan.cp * model.vocab / plan.tp
    return {"weights": weights, "grads": grads, "optimizer": optimizer, "activations": acts}


def _busiest(plan: Plan, model: ModelSpec) -> int:
    if plan.pp == 1:
        return 0
    ranks = range(plan.pp) if plan.stages else (0, plan.pp - 1)
    return max(ranks, key=lambda r: sum(stage_memory(plan, model, r).values()))


def memory_breakdown(plan: Plan, model: ModelSpec) -> dict[str, float]:
    """Bytes per GPU on the busiest pipeline stage: weights, grads, optimizer, activations."""
    return stage_memory(plan, model, _busiest(plan, model))


def memory_per_gpu(plan: Plan, model: ModelSpec) -> float:
    """Total of ``memory_breakdown``: the bytes the busiest GPU holds."""
    return sum(memory_breakdown(plan, model).values())


# ---------------------------------------------------------------- time
def grid(plan: Plan) -> Grid:
    """The plan's ranks on a ``parallel.mesh.Grid``, Megatron-Core's order "tp-cp-dp-pp" (tp fastest):
    ``Grid.of(pp=, dp=, cp=, tp=)``, the rank order ``parallel.mesh`` and ``init_device_mesh`` use."""
    return Grid.of(pp=plan.pp, dp=plan.dp, cp=plan.cp, tp=plan.tp)


def expert_grid(plan: Plan) -> Grid:
    """The expert layers' ranks: Megatron-Core lays them out "tp-ep-dp-pp" with the expert tensor
    parallelism of the plan's tp and no CP (megatron/core/parallel_state.py,
    ``expert_decoder_rank_generator``), the expert-data-parallel ranks what is left of dp·cp."""
    return Grid.of(pp=plan.pp, edp=max(1, plan.dp * plan.cp // plan.ep), ep=plan.ep, tp=plan.tp)


def hsdp_grid(plan: Plan) -> Grid:
    """The plan's ranks with dp split as HSDP splits it, torchtitan's mesh order ("pp", "dp_replicate",
    "dp_shard", "cp", "tp"; torchtitan/distributed/parallel_dims.py, ``build_mesh``): a shard group is
    ``plan.shard`` consecutive dp coordinates × cp (torchtitan's "fsdp" = dp_shard·cp), the replicate
    groups are shard·cp·tp ranks apart.  The same ranks as ``grid(plan)``; for a plan without HSDP,
    replicate = 1 and the shard axis is dp."""
    return Grid.of(pp=plan.pp, replicate=plan.replicate, shard=plan.shard or plan.dp, cp=plan.cp, tp=plan.tp)


#: The axes whose collectives the planner prices, as groups of ``grid`` (``expert_grid`` for "ep",
#: ``hsdp_grid`` for HSDP's "shard" and "replicate"): DP's (ZeRO's) group is the dp·cp ranks that share
#: a TP and a pipeline coordinate.
AXIS_GROUPS = {"tp": ("tp",), "cp": ("cp",), "dp": ("dp", "cp"), "ep": ("ep",), "shard": ("shard", "cp"),
               "replicate": ("replicate",)}


def axis_crosses(plan: Plan, c: Cluster, axis: str) -> bool:
    """Whether a group of ``axis`` ("tp", "cp", "dp", "ep", or HSDP's "shard" and "replicate") leaves its
    node on ``c``: whether the consecutive ranks it runs over (``Grid.span``) are more than a node's GPUs.
    Exact when a node's GPUs are a multiple of the span or the span a multiple of them (every
    power-of-two layout); with nodes of 6 a group of 4 is taken as inside a node, though one of the
    groups straddles two."""
    g = expert_grid(plan) if axis == "ep" else hsdp_grid(plan) if axis in ("shard", "replicate") else grid(plan)
    return g.span(AXIS_GROUPS[axis]) > c.gpus_per_node


def group_latency(n: int, c: Cluster, cross: bool) -> float:
    """Seconds of latency for one collective over ``n`` ranks: the link's latency for groups up
    to one node's size, times log2(n)/log2(node) beyond (an assumption).  NCCL's Tree serves
    all-reduce only; its reduce-scatter and all-gather run as rings, whose 2(n − 1) or n − 1 steps
    grow linearly, with PAT (logarithmic) only for one GPU per node in the group: so this fits
    the DP groups of plans with tp = 8 and is optimistic for smaller tp."""
    base = c.network_latency if cross else c.latency
    node = max(2, c.gpus_per_node)
    return base * max(1.0, math.log2(max(n, 1)) / math.log2(node))


def megatron_bucket_params(dp: int) -> float:
    """Parameters per gradient bucket in Megatron-Core: max(40M, 1M × the data-parallel size)
    (megatron/core/distributed/distributed_data_parallel_config.py, ``bucket_size``)."""
    return max(40e6, 1e6 * dp)


def _bw(cross: bool, c: Cluster) -> tuple[float, float]:
    """(busbw, latency) for a link inside a node or across nodes."""
    if cross:
        return c.network * c.network_efficiency, c.network_latency
    return c.nvlink_busbw, c.latency


def boundary_crosses(plan: Plan, c: Cluster) -> list[bool]:
    """For each pipeline boundary r -> r+1, whether it leaves the node: whether the first ranks of
    stages r and r + 1 on ``grid(plan)`` sit on different nodes."""
    g, n = grid(plan), c.gpus_per_node
    first = [g.rank_of(pp=r, dp=0, cp=0, tp=0) for r in range(plan.pp)]
    return [first[r] // n != first[r + 1] // n for r in range(plan.pp - 1)]


def efficiency(plan: Plan, work: Workload) -> float:
    """Share of peak the GEMMs reach: ``Cluster.efficiency`` × M/(M + 128) × K/(K + 128)."""
    rows = plan.micro_batch * work.model.seq / plan.cp
    width = work.model.hidden / plan.tp
    return work.cluster.efficiency * rows / (rows + TILE) * width / (width + TILE)


def _attention_flops(m: ModelSpec, causal: bool = True) -> float:
    """Forward FLOPs of QK^T and AV per token per layer, as run: 4·h·s (h: ``ModelSpec.attention_width``)
    for attention that stores its
    scores (the masked half is computed and masked), 2·h·s for a fused causal kernel, which skips the
    blocks above the diagonal (FlashAttention, Dao 2023 §3.1; SDPA's is_causal).  Reporting keeps
    PaLM's 12·h·s for forward and backward (``cost.model_flops_per_token``, the MFU convention)."""
    return 4 * m.attention_width * m.seq * (1 if m.scores or not causal else 1 / 2)


def layer_flops(plan: Plan, m: ModelSpec, mode: str, causal: bool = True) -> tuple[float, float, float]:
    """(forward, backward, recomputed) FLOPs of one layer per token on one GPU (``causal``: a fused
    kernel skips the masked half; False: timed as full attention, planner v3's default)."""
    attn = _attention_flops(m, causal)
    # the weights a token goes through; the busiest EP rank's experts take load × their share
    routed = m.expert_params * _load(plan, m) * m.top_k / m.experts if m.experts else 0.0
    fwd = (2 * (m.dense_params + routed) / m.layers + attn) / plan.tp
    if mode == "op":  # torchtitan's op-level selective: the matmuls it does not save (wk, wo, w3)
        return fwd, 2 * fwd, cost.op_sac_recomputed_flops(m.hidden, m.heads, plan.tp, m.ffn_width, m.gated, m.kv)
    extra = {"none": 0.0, "selective": attn / plan.tp if m.scores else 0.0, "full": fwd}[mode]
    return fwd, 2 * fwd, extra


def _memory_bound_bytes(plan: Plan, m: ModelSpec) -> float:
    """HBM bytes the memory-bound kernels of one layer move per token in forward, on one GPU.

    Each kernel reads its inputs and writes its output once (bf16): the two norms (read h, write h),
    the two residual adds (read 2h, write h), the MLP's activation (SwiGLU: read 2·ffn, write ffn;
    GeLU: read ffn, write ffn; a MoE layer's over its (top_k·load + shared)·expert_ffn rows), the
    dropouts where the model has them (read h, write h, a 1-byte mask) and, for attention that stores
    its scores, the softmax and its dropout over a·s scores (read, write, mask).  TP splits the MLP and
    the scores, and the rest only with sequence parallelism.  Fused causal attention keeps its scores
    on chip (FlashAttention): none.  Left out: rotary embeddings, biases, the router's softmax."""
    h, t = m.hidden, plan.tp
    act = (3 if m.gated else 2)
    if m.experts:
        moe = m.moe_layer_count / m.layers
        width = moe * (m.top_k * _load(plan, m) + m.shared_experts) * m.expert_ffn + (1 - moe) * m.ffn_width
    else:
        width = m.ffn_width
    unsplit = 2 * 2 * h + 2 * 3 * h + (2 * 2.5 * h if m.dropout else 0.0)
    split = act * width + ((2 + (2.5 if m.dropout else 0.0)) * m.heads * m.seq if m.scores else 0.0)
    return BF16 * ((unsplit / t if plan.sp else unsplit) + split / t)


#: Bytes of the loss per token on the last stage: fp32 logits written, read by the softmax, its gradient
#: written (3 × 4 bytes per vocabulary entry, ÷ tp: vocab-parallel).
LOSS_BYTES = 3 * LOGIT_BYTES


def optimizer_bytes(plan: Plan) -> float:
    """HBM bytes the optimizer step moves per parameter it updates: it reads the model states (18 bytes
    under "fp32_grads", 16 under "zero16": weights, gradient, fp32 master, Adam's m and v) and writes
    back the weights, master, m and v (2 + 12)."""
    w, g, o = cost.PRECISIONS[plan.precision]
    return w + g + o + w + o


@dataclass(frozen=True)
class _Slowest:
    """What every axis's time reads of one micro-batch on the slowest pipeline stage."""

    tokens: float  # tokens per micro-batch on one GPU: b·s/cp
    rate: float  # FLOP/s this GPU sustains on the plan's GEMMs
    fwd: float  # forward FLOPs per token of one layer on this GPU
    bwd: float  # backward FLOPs per token of one layer
    extra: float  # the recomputed forward's FLOPs per token of one layer, were every layer recomputed
    layers: int  # the stage's layers
    redo: float  # the share of ``extra`` the stage runs (1 but under block recomputation)
    again: float  # the share of the stage's layers whose forward runs twice
    compute: float  # seconds of GEMMs in the step: accum micro-batches


def tp_time(plan: Plan, work: Workload, st: _Slowest) -> float:
    """Exposed tensor-parallel seconds per step: units of (t-1)/t·b·(s/cp)·h elements per layer per
    micro-batch, the backward's all-reduces (or SP's reduce-scatters) behind its weight-gradient GEMMs."""
    m, c, t = work.model, work.cluster, plan.tp
    if t == 1:
        return 0.0
    h = m.hidden
    cross = axis_crosses(plan, c, "tp")
    bw, lat = _bw(cross, c)[0], group_latency(t, c, cross)
    unit = (t - 1) / t * st.tokens * h * BF16 / bw  # seconds per unit
    fwd_units, fwd_calls = 4, 4
    if plan.sp:
        hidden_units, hidden_calls, open_units, open_calls = 4, 4, 2, 2
        window = 4 * 7 * h * h / t * st.tokens / st.rate  # dgrad + wgrad GEMMs of QKV and FC1 (3h² + 4h²)
    else:
        hidden_units, hidden_calls, open_units, open_calls = 4, 2, 0, 0
        window = 2 * 7 * h * h / t * st.tokens / st.rate  # wgrad GEMMs of QKV and FC1
    exposed = (fwd_units + open_units) * unit + (fwd_calls + open_calls) * lat \
        + max(0.0, hidden_units * unit + hidden_calls * lat - window)
    exposed += st.again * (fwd_units * unit + fwd_calls * lat)  # the recomputed forward's
    if plan.recompute == "op":  # torchtitan's op-level recomputation gathers the norms' outputs again (its
        exposed += 2 * unit + 2 * lat  # reduce-scatters' outputs are saved: cost.op_sac_saved)
    return exposed * st.layers * plan.accum


def cp_time(plan: Plan, work: Workload, st: _Slowest) -> float:
    """Exposed context-parallel seconds per step, as the plan's framework runs it
    (``planner_frameworks.cp_method``).

    Megatron-LM's ring (TransformerEngine's ``AttnFuncWithCPAndKVP2P``, 6(c − 1)/c chunks): each hop
    hidden behind one block's attention, what the blocks do not hide exposed.
    torchtitan's all-gather (torch 2.13's ``context_parallel``, (6c − 4)/c chunks,
    ``cost.cp_allgather_elems_per_layer(implementation="torch")``): the forward's all-gather of K/V is
    issued before the first (local) block and hidden behind it only; backward gathers K/V again, behind
    its first block, and passes dK/dV c hops round the ring, each issued after a block and waited for
    after the next, so c − 1 hide behind a block and the last is exposed
    (torch/distributed/tensor/experimental/_context_parallel/_attention.py, ``_AllGatherRotater`` and
    ``_templated_ring_attention_backward``).  Under "full" the recomputed forward's share runs again."""
    if plan.cp == 1:
        return 0.0
    m, c = work.model, work.cluster
    b, s, h, t, n = plan.micro_batch, m.seq, m.hidden, plan.tp, plan.cp
    cross = axis_crosses(plan, c, "cp")
    bw, lat = _bw(cross, c)
    h_kv = h * m.kv / m.heads / t
    fwd_attn = _attention_flops(m, c.calibrated) / t * st.tokens / st.rate  # this GPU's forward attention
    if frameworks.cp_method(plan) == "ring":  # c − 1 hops each way, each behind a block
        comm = (cost.cp_comm_elems_per_layer(b, s, h_kv, n, reverse_backward=True) * BF16 / bw + 3 * (n - 1) * lat)
        fwd_share = 1 / 3  # the forward's 2 of the ring's 6 chunks
        return max(0.0, comm * (1 + fwd_share * st.again) - 3 * fwd_attn) * st.layers * plan.accum
    chunk = b * s / n * h_kv * BF16 / bw  # one rank's K (or V, dK, dV) on the wire
    block_f, block_b = fwd_attn / n, 2 * fwd_attn / n  # one block's forward and backward attention
    gather = 2 * (n - 1) * chunk + group_latency(n, c, cross)  # K and V, all-gathered
    hop = 2 * chunk + lat  # dK and dV, one hop
    forward = max(0.0, gather - block_f)
    backward = max(0.0, gather - block_b) + (n - 1) * max(0.0, hop - block_b) + hop
    return (forward * (1 + st.again) + backward) * st.layers * plan.accum


def bubble_stages(plan: Plan) -> float:
    """The pipeline bubble in micro-batches of the slowest stage's time: (p − 1)/v for 1F1B and its
    interleaved form (Narayanan et al. 2021), (p/2 − 1)·2/3 for DualPipe (``DUALPIPE``)."""
    if plan.schedule == "dualpipe":
        return (plan.pp / 2 - 1) * DUALPIPE["bubble_per_stage_pair"]
    return (plan.pp - 1) / plan.v


def pp_time(plan: Plan, work: Workload, st: _Slowest) -> float:
    """Pipeline seconds per step: a forward and a backward hop per micro-batch and chunk, on the slowest
    boundary (a boundary that crosses nodes runs at the network's bandwidth); under DualPipe only what
    exceeds the computation."""
    if plan.pp == 1:
        return 0.0
    m, c = work.model, work.cluster
    bw, lat = _bw(any(boundary_crosses(plan, c)), c)
    hop = lat + plan.micro_batch * (m.seq / plan.cp) * m.hidden / plan.tp * BF16 / bw
    hops = 2 * (plan.accum * plan.v + plan.pp - 1) * hop
    if plan.schedule == "dualpipe":  # beside the computation the overlapped all-to-alls leave free
        free = st.compute - (ep_comm(plan, work, st) if plan.ep_overlap else 0.0)
        return max(0.0, hops - max(0.0, free))
    return hops


def ep_comm(plan: Plan, work: Workload, st: _Slowest) -> float:
    """Seconds per step of the MoE layers' four all-to-alls (again the forward's two when recomputed),
    before any overlap."""
    if plan.ep == 1:
        return 0.0
    m, c, t = work.model, work.cluster, plan.tp
    cross = axis_crosses(plan, c, "ep")  # EP ranks are tp apart (Megatron-Core's expert grid)
    bw, lat = _bw(cross, c)[0], group_latency(plan.ep, c, cross)
    rows = st.tokens / t  # each TP rank dispatches its sequence shard (Megatron needs SP with TP and EP)
    per_layer = (cost.ep_comm_elems_per_layer(rows, m.hidden, m.top_k, plan.ep) * _load(plan, m) * BF16 / bw
                 + 4 * lat)
    # the recomputed forward dispatches and combines again: half the four all-to-alls
    return per_layer * (1 + st.again / 2) * st.layers * m.moe_layer_count / m.layers * plan.accum


def ep_time(plan: Plan, work: Workload, st: _Slowest) -> float:
    """Expert-parallel seconds per step: the all-to-alls (``ep_comm``) exposed (Megatron-LM's default),
    or with ``ep_overlap`` only what exceeds the computation."""
    comm = ep_comm(plan, work, st)
    return max(0.0, comm - st.compute) if plan.ep_overlap else comm


def dp_time(plan: Plan, work: Workload, st: _Slowest, stage: int) -> float:
    """Exposed data-parallel seconds per step over dp·cp ranks (routed experts over the dp·cp/ep
    expert-data-parallel ones), as the plan's ZeRO stage and framework run it."""
    d = plan.dp * plan.cp
    if d == 1:
        return 0.0
    m, c, t = work.model, work.cluster, plan.tp
    cross = axis_crosses(plan, c, "dp")
    bw, lat = _bw(cross, c)[0], group_latency(d, c, cross)
    dense, experts = _stage_split(plan, m, stage)
    n_params = (dense + experts / plan.ep) / t
    g_bytes = cost.PRECISIONS[plan.precision][1]  # gradients reduce in their own precision
    e = d // plan.ep
    ring = (d - 1) / d * dense / t + (e - 1) / e * experts / (plan.ep * t)  # elements per rank per ring pass
    buckets = max(1, math.ceil(n_params / megatron_bucket_params(d)))
    n_slow, accum = st.layers, plan.accum
    fwd_mb = n_slow * st.fwd * st.tokens / st.rate
    bwd_mb = n_slow * (st.bwd + st.extra * st.redo) * st.tokens / st.rate
    if plan.zero == 0:  # all-reduce, overlapped with the last micro-batch's backward
        return max(0.0, 2 * ring * g_bytes / bw + buckets * lat - bwd_mb)
    if plan.zero == 1:  # reduce-scatter in backward, bf16 all-gather in the next forward
        return (max(0.0, ring * g_bytes / bw + buckets * lat - bwd_mb)
                + max(0.0, ring * BF16 / bw + buckets * lat - fwd_mb))
    if plan.zero == 2 and plan.tp == plan.cp == 1:  # DeepSpeed: reduce-scatter after every backward
        return (accum * max(0.0, ring * g_bytes / bw + buckets * lat - bwd_mb)
                + max(0.0, ring * BF16 / bw + buckets * lat - fwd_mb))
    if plan.zero == 2:  # torchtitan's FSDP without resharding after forward: gather + reduce-scatter
        return accum * (max(0.0, ring * BF16 / bw + n_slow * lat - fwd_mb)
                        + max(0.0, ring * g_bytes / bw + n_slow * lat - bwd_mb))
    if plan.shard:
        return _hsdp_time(plan, work, n_params, n_slow, fwd_mb, bwd_mb)
    # ZeRO-3/FSDP: per micro-batch, gather (prefetched) in forward and backward, reduce-scatter
    ag, rs = ring * BF16 / bw, ring * g_bytes / bw
    return accum * (max(0.0, ag + n_slow * lat - fwd_mb) + max(0.0, ag + rs + 2 * n_slow * lat - bwd_mb))


def _hsdp_passes(plan: Plan, n_params: float) -> dict[str, float]:
    """Bytes each GPU sends per micro-batch under HSDP for ``n_params`` parameters on it, by pass:
    ``cost.hsdp_comm_elems`` over the shard·cp ranks of a group and the dp/shard groups; its shard axis
    is three equal ring passes, two all-gathers of the weights in bf16 (forward, backward) and a
    reduce-scatter of the gradients in their own precision, and its replicate axis an all-reduce of
    the gradient shard in that precision."""
    elems = cost.hsdp_comm_elems(n_params, plan.replicate, plan.sharded_over)
    g_bytes = cost.PRECISIONS[plan.precision][1]
    return {"gather": elems["shard"] / 3 * BF16, "reduce_scatter": elems["shard"] / 3 * g_bytes,
            "all_reduce": elems["replicate"] * g_bytes}


def hsdp_comm(plan: Plan, work: Workload, stage: int = 0) -> dict[str, float]:
    """Bytes each GPU of pipeline stage ``stage`` sends per micro-batch under HSDP (``plan.shard``), by mesh
    axis: {"shard": two gathers and a reduce-scatter, "replicate": the all-reduce across groups}."""
    if not plan.shard:
        raise ValueError(f"hsdp_comm prices HSDP: give the plan a shard (it has dp={plan.dp}, shard=0)")
    dense, experts = _stage_split(plan, work.model, stage)
    b = _hsdp_passes(plan, (dense + experts / plan.ep) / plan.tp)
    return {"shard": 2 * b["gather"] + b["reduce_scatter"], "replicate": b["all_reduce"]}


def _hsdp_time(plan: Plan, work: Workload, n_params: float, n_slow: int, fwd_mb: float, bwd_mb: float) -> float:
    """HSDP's exposed seconds per step for ``n_params`` parameters on this GPU (torch's ``fully_shard`` on a
    2-D mesh, as torchtitan runs it with gradient accumulation: both axes every micro-batch).  The shard
    axis is ZeRO-3 over shard·cp ranks: a gather (prefetched) behind each micro-batch's forward, a gather
    and a reduce-scatter behind its backward, a latency per layer each.  The replicate axis all-reduces
    each layer's gradient shard after its reduce-scatter, on a stream of its own ("Run the HSDP
    all-reduces concurrently with all-gather/reduce-scatter since collectives use different network
    resources", torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py): where the two axes run on
    different links (the shard group inside a node, the replicate groups across nodes) the backward
    waits for the longer of the two; on one link, for both."""
    c, b = work.cluster, _hsdp_passes(plan, n_params)
    s_cross, r_cross = axis_crosses(plan, c, "shard"), axis_crosses(plan, c, "replicate")
    s_bw, r_bw = _bw(s_cross, c)[0], _bw(r_cross, c)[0]
    s_lat = n_slow * group_latency(plan.sharded_over, c, s_cross)
    gather, reduce_scatter = b["gather"] / s_bw + s_lat, b["reduce_scatter"] / s_bw + s_lat
    all_reduce = b["all_reduce"] / r_bw + n_slow * group_latency(plan.replicate, c, r_cross)
    shard_axis = gather + reduce_scatter
    backward = max(shard_axis, all_reduce) if s_cross != r_cross else shard_axis + all_reduce
    return plan.accum * (max(0.0, gather - fwd_mb) + max(0.0, backward - bwd_mb))


def optimizer_time(plan: Plan, work: Workload, stage: int) -> float:
    """The optimizer step's seconds (calibrated model only): once per step, memory-bound, over the
    parameters this GPU updates."""
    c = work.cluster
    if not c.calibrated:
        return 0.0
    dense, experts = _stage_split(plan, work.model, stage)
    d, t = plan.sharded_over, plan.tp
    updated = (dense / t / (d if plan.zero >= 1 else 1)
               + experts / (t * plan.ep) / (max(1, d // plan.ep) if plan.zero >= 1 else 1))
    return updated * optimizer_bytes(plan) / c.hbm_bandwidth


CAP_KNEE = 0.8  # where the MFU cap starts to bend, as a share of Cluster.best_mfu: an assumption (docs/planner.md)


def capped_time(uncapped: float, floor: float) -> float:
    """A step's seconds with the MFU cap applied, keeping the order of plans.

    ``floor`` is the step at ``Cluster.best_mfu``, the best MFU published for the GPU generation.
    With x = floor / uncapped (the plan's MFU as a share of that best), a plan at or below
    ``CAP_KNEE`` keeps its time; above it the share is bent to
    y = k + (1 − k)·(1 − exp(−(x − k)/(1 − k))), which meets x at the knee with the same slope,
    rises with x and never reaches 1.  Every plan stays under the best published MFU, and a
    plan faster than another before the cap is still faster after it (a clamp would tie them).
    """
    x = floor / uncapped
    k = CAP_KNEE
    if x <= k:
        return uncapped
    return floor / (k + (1 - k) * (1 - math.exp(-(x - k) / (1 - k))))


def step_time(plan: Plan, work: Workload) -> dict[str, float]:
    """Seconds per optimizer step, by part (exposed time): compute, memory (memory-bound kernels), bubble,
    tp, cp, pp, ep, dp, optimizer, cap (what the MFU cap adds); and total.  Each parallel axis's time is
    a function of its own (``tp_time``, ``cp_time``, ``pp_time``, ``ep_time``, ``dp_time``), reading
    the slowest stage's micro-batch."""
    m, c = work.model, work.cluster
    s, h, t = m.seq, m.hidden, plan.tp
    tokens = plan.micro_batch * s / plan.cp  # tokens per micro-batch on one GPU
    rate = c.peak_flops * efficiency(plan, work)
    fwd, bwd, extra = layer_flops(plan, m, plan.recompute, causal=c.calibrated)
    layers = stage_layers(plan, m)
    head = 6 * m.vocab * h / t  # output layer, fwd + bwd, per token
    redo = [recomputed_share(plan, n) if plan.recompute == "full" else 1.0 for n in layers]  # of ``extra``
    if plan.ep_overlap:  # the all-to-all kernels take OVERLAP_SMS of the SMs from the computation
        rate *= 1 - OVERLAP_SMS
    flops_mb = [n * (fwd + bwd + extra * r) * tokens / rate for n, r in zip(layers, redo)]
    flops_mb[-1] += head * tokens / rate
    # memory-bound kernels at the HBM's bandwidth: forward, backward (twice the bytes: it reads the saved
    # input and the incoming gradient and writes a gradient), and the recomputed forward under "full"
    mem_mb = [n * (3 + (1.0 if plan.recompute == "op" else recomputed_share(plan, n))) * _memory_bound_bytes(plan, m)
              * tokens / c.hbm_bandwidth for n in layers]  # op: its cheap ops all run again (the last add aside)
    mem_mb[-1] += LOSS_BYTES * m.vocab / t * tokens / c.hbm_bandwidth
    if not c.calibrated:
        mem_mb = [0.0] * plan.pp
    stage_mb = [a + b_ for a, b_ in zip(flops_mb, mem_mb)]
    slowest = max(range(plan.pp), key=lambda r: stage_mb[r])
    st = _Slowest(tokens=tokens, rate=rate, fwd=fwd, bwd=bwd, extra=extra, layers=layers[slowest],
                  redo=redo[slowest], again=recomputed_share(plan, layers[slowest]),
                  compute=plan.accum * flops_mb[slowest])
    parts = {"compute": st.compute, "memory": plan.accum * mem_mb[slowest],
             "bubble": bubble_stages(plan) * stage_mb[slowest],
             "tp": tp_time(plan, work, st), "cp": cp_time(plan, work, st), "pp": pp_time(plan, work, st),
             "ep": ep_time(plan, work, st), "dp": dp_time(plan, work, st, slowest),
             "optimizer": optimizer_time(plan, work, slowest)}
    # ---- no plan faster than the best MFU published for its GPU generation (Cluster.best_mfu)
    floor = (cost.model_flops_per_token(m.active_params, m.layers, h, s) * work.global_batch * s
             / (plan.gpus * c.peak_flops * c.best_mfu))
    uncapped = sum(parts.values())
    parts["cap"] = capped_time(uncapped, floor) - uncapped
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
class Problem(str):
    """One reason a plan cannot run, in words, with its ``kind``: "gpus" (the product of the degrees),
    "node" (TP across nodes), "heads", "layers", "stages", "interleaving", "cp", "batch", "zero",
    "ep" (expert parallelism), "framework" (``planner_frameworks``) or "memory".  It is the text itself
    (a ``str``), so it prints and compares as the sentence; code asks ``.kind`` instead of searching
    the words."""

    kind: str

    def __new__(cls, kind: str, text: str) -> "Problem":
        self = super().__new__(cls, text)
        self.kind = kind
        return self

    def __reduce__(self):
        return (Problem, (self.kind, str(self)))


#: Kinds that make a plan impossible to set up at all (``predict`` refuses them).
IMPOSSIBLE = ("gpus", "batch", "recompute")


def op_sac_priced(m: ModelSpec) -> bool:
    """Whether the planner prices torchtitan's op-level selective checkpointing (``Plan(recompute="op")``) for
    ``m``: a dense Llama-shaped model with SDPA (``cost.op_sac_saved``).  Not a MoE model (torchtitan's
    rule there counts grouped matmuls and the router apart), not MLA, not attention that stores its scores
    (torchtitan runs SDPA)."""
    return not (m.experts or m.scores or m.latent or m.qk_head_dim or m.v_head_dim)


def problems(plan: Plan, work: Workload) -> list[Problem]:
    """Every reason ``plan`` cannot run ``work``, as ``Problem``s (words with a kind); empty when it can."""
    m, c = work.model, work.cluster
    out: list[Problem] = []

    def add(kind: str, text: str) -> None:
        out.append(Problem(kind, text))

    if plan.gpus != c.gpus:
        add("gpus", f"dp·cp·tp·pp = {plan.dp}·{plan.cp}·{plan.tp}·{plan.pp} = {plan.gpus}, "
                    f"but the cluster has {c.gpus} GPUs" if plan.cp > 1 else
                    f"dp·tp·pp = {plan.dp}·{plan.tp}·{plan.pp} = {plan.gpus}, but the cluster has {c.gpus} GPUs")
    if plan.tp > c.gpus_per_node or c.gpus_per_node % plan.tp:
        add("node", f"tp={plan.tp} does not fit inside a node of {c.gpus_per_node} GPUs: TP's per-layer "
                    "all-reduces would cross the network")
    if m.heads % plan.tp:
        add("heads", f"tp={plan.tp} does not divide the {m.heads} attention heads")
    elif m.kv % plan.tp and plan.tp % m.kv:
        add("heads", f"tp={plan.tp} and the {m.kv} K/V heads do not divide one another")
    if plan.pp > m.layers:
        add("layers", f"pp={plan.pp} is more stages than the {m.layers} layers")
    if plan.stages and sum(plan.stages) != m.layers:
        add("stages", f"stages={plan.stages} add up to {sum(plan.stages)} layers, but the model has {m.layers}")
    if plan.v > 1:
        if min(stage_layers(plan, m)) < plan.v:
            add("interleaving", f"interleaving v={plan.v} needs at least v layers on every stage "
                                f"(stages: {stage_layers(plan, m)})")
        if plan.accum % plan.pp:
            add("interleaving", f"interleaved 1F1B needs the micro-batches per replica (accum={plan.accum}) to be a "
                                f"multiple of pp={plan.pp} (Megatron-LM)")
    if plan.cp > 1 and m.seq % (2 * plan.cp):
        add("cp", f"cp={plan.cp} needs the sequence ({m.seq}) to split into 2·cp = {2 * plan.cp} equal "
                  "chunks (load-balanced causal ring attention)")
    if plan.recompute == "op" and not op_sac_priced(m):
        add("recompute", f"recompute=\"op\" (torchtitan's op-level selective checkpointing) is priced for a dense "
                         f"Llama-shaped model with SDPA; {m.name} has "
                         + ("experts" if m.experts else "stored attention scores" if m.scores else "MLA"))
    if plan.recompute == "op" and plan.tp > 1 and not plan.sp:
        add("recompute", f"recompute=\"op\" with tp={plan.tp} is priced as torchtitan runs it, with sequence "
                         "parallelism on the norms (its TP plan always has it): set sp=True")
    if plan.dp * plan.micro_batch * plan.accum != work.global_batch:
        add("batch", f"dp·micro_batch·accum = {plan.dp}·{plan.micro_batch}·{plan.accum} = "
                     f"{plan.dp * plan.micro_batch * plan.accum}, but the global batch is {work.global_batch}")
    out.extend(ep_problems(plan, m))
    if plan.zero and plan.dp * plan.cp == 1:
        add("zero", f"ZeRO-{plan.zero} needs more than one data-parallel rank (dp·cp = 1)")
    elif plan.shard and plan.sharded_over == 1:
        add("zero", f"HSDP with shard={plan.shard} and cp={plan.cp} shards over one rank: that is plain data "
                    "parallelism (torchtitan runs DDP when data_parallel_shard_degree = 1): use zero=0, or a "
                    "larger shard")
    for text in frameworks.unrunnable(plan):
        add("framework", text)
    if not any(p.kind in ("gpus", "recompute") for p in out):
        parts = memory_breakdown(plan, m)
        need = sum(parts.values())
        if need > c.usable_memory:
            detail = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in parts.items())
            add("memory", f"needs {need / 1e9:.1f} GB per GPU ({detail}), over the {c.usable_memory / 1e9:.0f} GB "
                          f"a plan may use ({c.headroom:.0%} of the {c.memory / 1e9:.0f} GB a GPU holds)")
    return out


def ep_problems(plan: Plan, m: ModelSpec) -> list[Problem]:
    """Why ``plan``'s expert parallelism cannot run ``m`` as the planner prices it (kind "ep"), or []."""
    if plan.ep == 1:
        return []
    out = []
    if not m.experts:
        return [Problem("ep", f"ep={plan.ep} needs a mixture of experts (ModelSpec(experts=..., top_k=..., "
                              f"expert_ffn=...)): {m.name} has none")]
    if m.experts % plan.ep:
        out.append(Problem("ep", f"ep={plan.ep} does not divide the {m.experts} experts"))
    if (plan.dp * plan.cp) % plan.ep:
        out.append(Problem("ep", f"ep={plan.ep} must divide dp·cp = {plan.dp * plan.cp}: the expert-parallel "
                                 "ranks are data-parallel ones (Megatron-LM, expert tensor parallelism = tp)"))
    return out


def check(plan: Plan, work: Workload) -> None:
    """Raise ValueError naming each field that makes ``plan`` impossible for ``work`` (memory aside)."""
    found = [p for p in problems(plan, work) if p.kind != "memory"]
    if found:
        raise ValueError("impossible plan: " + "; ".join(found))


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

    @property
    def tokens_per_second_per_gpu(self) -> float:
        return self.tokens_per_second / self.plan.gpus


def predict(plan: Plan, work: Workload) -> Prediction:
    """Memory, time and throughput of ``plan``; raises ValueError for a plan that cannot exist
    (GPU count, TP across nodes, heads, layers, batch), lists memory in ``problems``."""
    found = tuple(problems(plan, work))
    impossible = [p for p in found if p.kind in IMPOSSIBLE]
    if impossible:
        raise ValueError("impossible plan: " + "; ".join(impossible))
    time = step_time(plan, work)
    return Prediction(plan, found, memory_breakdown(plan, work.model), time,
                      work.global_batch * work.model.seq / time["total"])


# ---------------------------------------------------------------- search
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(work: Workload):
    """Plans with dp·cp·tp·pp = GPUs and dp·micro_batch·accum = global batch.

    tp inside a node and dividing the heads; pp up to the layers (uneven stages
    allowed); cp only for long sequences (s >= CP_FROM = 16k tokens, as
    published runs use it: Llama 3 at 131k, torchtitan from 32k), with s/cp >= 2048 and cp <= 16; for a MoE
    model every ep dividing both dp·cp and the experts (ZeRO-0/1 only under EP); v in (1, 2, 4) where the
    layers split evenly; ZeRO 0-3 where a framework runs it (``planner_frameworks.unrunnable``:
    not ZeRO-2/3 with pp > 1); with ``Workload(hsdp=True)``, under ZeRO-3 also HSDP over every shard
    that divides dp (shard·cp > 1); recompute "none" and "full", plus
    "selective" when attention stores its scores (otherwise it equals "none"), plus torchtitan's "op" with
    ``Workload(op_sac=True)`` on the layouts torchtitan runs (``frameworks.unrunnable``).
    """
    m, c = work.model, work.cluster
    g = c.gpus
    modes = RECOMPUTE if m.scores else ("none", "full")
    if work.op_sac and op_sac_priced(m):  # torchtitan's op-level selective, where torchtitan runs the layout
        modes += ("op",)
    for tp in _divisors(g):
        if tp > c.gpus_per_node or c.gpus_per_node % tp or m.heads % tp or (m.kv % tp and tp % m.kv):
            continue
        for cp in _divisors(g // tp):
            if cp > 1 and (m.seq < CP_FROM or cp > 16 or m.seq // cp < 2048 or m.seq % (2 * cp)):
                continue
            for pp in _divisors(g // (tp * cp)):
                if pp > m.layers:
                    continue
                dp = g // (tp * cp * pp)
                if work.global_batch % dp:
                    continue
                eps = [e for e in _divisors(dp * cp) if m.experts % e == 0] if m.experts else [1]
                for mb in _divisors(work.global_batch // dp):
                    accum = work.global_batch // (dp * mb)
                    vs = [1] + [v for v in (2, 4) if pp > 1 and m.layers % (pp * v) == 0 and accum % pp == 0]
                    for v, ep in ((v, ep) for v in vs for ep in eps):
                        for zero in (cost.ZERO_STAGES if dp * cp > 1 else (0,)):
                            if ep > 1 and zero >= 2:
                                continue
                            shards = [0] + ([s for s in _divisors(dp)[:-1] if s * cp > 1]
                                            if zero == 3 and work.hsdp else [])
                            for rc, shard in ((rc, shard) for rc in modes for shard in shards):
                                plan = Plan(dp=dp, tp=tp, pp=pp, zero=zero, micro_batch=mb, accum=accum,
                                            recompute=rc, cp=cp, v=v, precision=work.precision, ep=ep,
                                            shard=shard)
                                if not frameworks.unrunnable(plan):
                                    yield plan


_ZERO_ORDER = {1: 0, 0: 1, 2: 2, 3: 3}  # ZeRO-1 first: it moves no more bytes than ZeRO-0
_RC_ORDER = {"none": 0, "selective": 1, "op": 2, "full": 3}


def simplicity(p: Plan) -> tuple:
    # Among equally fast plans: the least recomputation, ZeRO-1, plain ZeRO-3 before HSDP (fewer replicas
    # first), less TP, PP, CP, interleaving.
    return (_RC_ORDER[p.recompute], _ZERO_ORDER[p.zero], p.replicate, p.tp, p.pp, p.cp, p.v, -p.micro_batch)


def fewest_recomputed(plan: Plan, work: Workload) -> Plan | None:
    """``plan`` (under "full" recomputation of every layer) with Megatron-LM's block recomputation of the
    fewest layers per model chunk that fits, or None: where no framework runs it, where recomputing no
    layer fits already (that plan is faster), or where only recomputing every layer fits.  Memory falls
    as K grows, so K is found by bisection."""
    if plan.recompute != "full" or plan.recompute_layers:
        return None
    m, room = work.model, work.cluster.usable_memory

    def fits(p: Plan) -> bool:
        return memory_per_gpu(p, m) <= room
    widest = max(math.ceil(n / plan.v) for n in stage_layers(plan, m))  # layers of the largest chunk
    low, high = 1, widest - 1  # K = widest recomputes every layer: the plan itself
    if high < low or frameworks.unrunnable(replace(plan, recompute_layers=1)):
        return None
    if fits(replace(plan, recompute="none")) or not fits(replace(plan, recompute_layers=high)):
        return None
    while low < high:
        mid = (low + high) // 2
        if fits(replace(plan, recompute_layers=mid)):
            high = mid
        else:
            low = mid + 1
    return replace(plan, recompute_layers=low)


def search(work: Workload) -> Prediction | None:
    """The fastest plan that fits (the simplest among ties), or None when none fits.

    Block recomputation (``Plan.recompute_layers``) is priced by ``predict`` for a plan given to it, and
    ``fewest_recomputed`` finds its smallest K, but the search does not try it: adding each "full" plan's
    ``fewest_recomputed`` to the candidates made the search of the six scenarios and the published runs
    1.6-1.8 times slower (about 3 -> 5 s of CPU, docs/planner.md) and changes the plans the lecture's bands
    hold (16 -> 20 layouts for 70B on 64 H100s) and one scenario's best plan (70B on 15T tokens)."""
    best = None
    m = work.model
    for plan in candidates(work):
        # memory first (cheap), then time
        if sum(memory_breakdown(plan, m).values()) > work.cluster.usable_memory or problems(plan, work):
            continue
        guess = predict(plan, work)
        if best is None or guess.tokens_per_second > best.tokens_per_second * (1 + 1e-12) or (
                math.isclose(guess.tokens_per_second, best.tokens_per_second, rel_tol=1e-12)
                and simplicity(plan) < simplicity(best.plan)):
            best = guess
    return best if best is None else replace(best, plan=explained(best.plan, work))


def infeasible(work: Workload) -> dict[str, int]:
    """When nothing fits: each reason (grouped by its kind) and how many candidates it ruled out."""
    out: dict[str, int] = {}
    for plan in candidates(work):
        for p in problems(plan, work):
            key = "needs more memory per GPU than a plan may use" if p.kind == "memory" else str(p)
            out[key] = out.get(key, 0) + 1
    return out


def explained(plan: Plan, work: Workload) -> Plan:
    """``plan`` with one line of reasoning per axis, from the predictions."""
    m, c = work.model, work.cluster
    parts = memory_breakdown(plan, m)
    layers = stage_layers(plan, m)
    crosses = sum(boundary_crosses(plan, c))
    why = {
        "tp": (f"tp={plan.tp}: " + ("no tensor parallelism needed" if plan.tp == 1 else
               f"splits each layer's weights and activations {plan.tp} ways inside a node (NVLink)"
               + (", with sequence parallelism" if plan.sp else ""))),
        "pp": (f"pp={plan.pp}: " + ("one stage holds every layer" if plan.pp == 1 else
               f"{max(layers)} layers on the busiest stage, {crosses} of {plan.pp - 1} boundaries cross "
               f"nodes; bubble (pp-1)/(v·accum) = {(plan.pp - 1) / (plan.v * plan.accum):.2f}")),
        "dp": (f"dp={plan.dp}: the remaining GPUs each take {plan.micro_batch * plan.accum} sequences per step"
               + (f"; cp={plan.cp} splits each sequence" if plan.cp > 1 else "")
               + (f"; ep={plan.ep} of them split the {m.experts} experts ({m.experts // plan.ep} each)"
                  if plan.ep > 1 else "")
               + (f"; HSDP: ZeRO-3 inside groups of {plan.sharded_over} ranks ("
                  + ("inside a node" if not axis_crosses(plan, c, "shard") else "across nodes")
                  + f"), {plan.replicate} replicas of each all-reducing its gradient shard ("
                  + ("across nodes" if axis_crosses(plan, c, "replicate") else "inside a node") + ")"
                  if plan.shard else "")),
        "zero": (f"ZeRO-{plan.zero} ({plan.precision}): model states "
                 f"{(parts['weights'] + parts['grads'] + parts['optimizer']) / 1e9:.1f} GB per GPU, "
                 f"activations {parts['activations'] / 1e9:.1f} GB"
                 + (f" with {plan.recompute} recomputation" if plan.recompute != "none" else "")),
    }
    if c.gpus_per_node < plan.tp:
        why["tp"] += " (crosses nodes!)"
    if not frameworks.unrunnable(plan):
        why["framework"] = (f"runs on {frameworks.runs_on(plan)} "
                            "(planner_frameworks.configuration prints its configuration)")
    return replace(plan, why=why)


def _spec(name, params, layers, hidden, heads, seq, **kw):
    return ModelSpec(name, params, layers, hidden, heads, seq, **kw)


#: The lecture's scenarios.  Shapes follow the published Llama 2/3 configurations
#: (Touvron et al. 2023; Dubey et al. 2024) and GPT-3 XL (Brown et al. 2020).  The 7B and the 70B on 8 and
#: 64 GPUs are Llama 2-shaped (V = 32,000, 4,096 tokens): Llama 3 70B's V = 128,256 has 2.1B embedding and
#: output-layer parameters against 0.5B and fp32 logits 4× larger, so the Llama 3 recipes the lecture
#: compares them with (NeMo's, torchtitan's) are compared by their layout only.  The 15T-token scenario,
#: compared with Meta's GPU-hours for Llama 3 70B, has Llama 3 70B's shape (70.6B, V = 128,256, 8,192 tokens).
_7B = dict(vocab=32000, ffn=11008, gated=True, dropout=False)  # SwiGLU, no dropout (Touvron et al. 2023)
_70B = dict(vocab=32000, ffn=28672, kv_heads=8, gated=True, dropout=False)
_L3_70B = dict(vocab=128256, ffn=28672, kv_heads=8, gated=True, dropout=False)  # Dubey et al. 2024, Table 3
SCENARIOS = {
    "1.3B fits one GPU (8 H100s)": Workload(_spec("1.3B", 1.3e9, 24, 2048, 16, 2048, vocab=50257),
                                            Cluster(8), 512),
    "7B on 8 H100s": Workload(_spec("7B", 7e9, 32, 4096, 32, 4096, **_7B), Cluster(8), 256),
    "70B on 8 H100s": Workload(_spec("70B", 70e9, 80, 8192, 64, 4096, **_70B), Cluster(8), 256),
    "70B on 64 H100s": Workload(_spec("70B", 70e9, 80, 8192, 64, 4096, **_70B), Cluster(64), 1024),
    "7B, 32k-token sequences (64 H100s)": Workload(_spec("7B", 7e9, 32, 4096, 32, 32768, **_7B),
                                                   Cluster(64), 64),
    "70B on 15T tokens (2048 H100s)": Workload(_spec("Llama 3 70B", 70.6e9, 80, 8192, 64, 8192, **_L3_70B),
                                               Cluster(2048), 2048, tokens=15e12),
}
