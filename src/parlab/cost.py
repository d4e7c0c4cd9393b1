"""Back-of-the-envelope cost models: memory, communication, bubbles, time.

(Over 450 lines, about 770 now: one short function per published formula, each with its source; the
length is the docstrings, not shared state.)

Every function is one formula from the literature; the docstring names the
source.  Units are plain numbers: parameters
and elements are counts, memory is bytes (decimal: 1 GB = 1e9 B), time is
seconds, compute is FLOPs.  Divide by 1e9 yourself when you want GB.

Symbols used throughout:  Ψ = number of parameters, Nd = data-parallel degree,
s = sequence length, b = micro-batch size, h = hidden size, a = attention
heads, L = layers, V = vocabulary size, t = tensor-parallel degree,
p = pipeline stages, m = micro-batches, v = virtual stages per rank,
c = context-parallel degree, n = ranks of a group.

This module imports nothing heavy (no torch at import time), so a notebook
can use it for quick sums.

One module, not split: students and notebooks import it as ``parlab.cost`` and call its
formulas by name (the labs' text cites them so); every function is one formula with its
source, and the symbols above are shared by all of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

# ---------------------------------------------------------------- constants
H100_BF16_PEAK = 989e12  # dense BF16 FLOP/s, H100 SXM
H100_MEMORY = 80e9  # bytes of HBM3
H100_HBM_BANDWIDTH = 3.35e12  # bytes/s
SECONDS_PER_DAY = 86_400

DTYPE_BYTES = {
    "fp32": 4, "float32": 4, "float": 4,
    "bf16": 2, "bfloat16": 2,
    "fp16": 2, "float16": 2, "half": 2,
    "fp8": 1, "int8": 1,
    "fp64": 8, "float64": 8, "double": 8,
}


# ---------------------------------------------------------------- validation
def _nonneg(name: str, value: float) -> None:
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")


def _at_least_one(name: str, value: int) -> None:
    if int(value) != value or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _choice(name: str, value: str, allowed) -> str:
    if value not in allowed:
        raise ValueError(f"unknown {name} {value!r}; allowed: {', '.join(map(repr, allowed))}")
    return value


def dtype_bytes(dtype) -> int:
    """Bytes per element for a dtype name ("bf16", "fp32", ...) or a torch.dtype."""
    if hasattr(dtype, "itemsize"):  # torch.dtype
        return int(dtype.itemsize)
    key = str(dtype).lower().removeprefix("torch.")
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; allowed: {', '.join(DTYPE_BYTES)} or a torch.dtype")
    return DTYPE_BYTES[key]


# ---------------------------------------------------------------- parameters
def gpt_params(vocab: int, hidden: int, layers: int) -> int:
    """Approximate parameter count of a GPT-style decoder.

    Ψ ≈ h·V + L·(12h² + 13h) + 2h   (Ultra-Scale Playbook).
    h·V is the (tied) embedding, 12h² + 13h one block (attention 4h² + 4h,
    MLP 8h² + 5h, two LayerNorms 4h), 2h the final LayerNorm.  Position
    embeddings and biases that a given model lacks are not modelled.
    """
    for name, x in (("vocab", vocab), ("hidden", hidden), ("layers", layers)):
        _nonneg(name, x)
    h = hidden
    return h * vocab + layers * (12 * h * h + 13 * h) + 2 * h


def count_params(model, trainable_only: bool = False) -> int:
    """Exact number of parameters of a torch module.

    ``model.parameters()`` yields each Parameter object once, so a tied
    weight (the same Parameter used in two places) counts once.
    """
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


# ---------------------------------------------------------------- memory
@dataclass(frozen=True)
class TrainingBytes:
    """Bytes held for training, split by kind."""

    weights: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer


def weights_bytes(n_params: float, bytes_per_param: float = 2) -> float:
    """Memory of the weights alone: Ψ × bytes per parameter (2 for fp16/bf16).

    Example: 70e9 parameters in bf16 need 140 GB.
    """
    _nonneg("n_params", n_params)
    _nonneg("bytes_per_param", bytes_per_param)
    return n_params * bytes_per_param


def training_bytes(n_params: float, weight_bytes: float = 2, grad_bytes: float = 2,
                   optim_bytes: float = 12) -> TrainingBytes:
    """Weights, gradients and optimizer state under mixed-precision Adam.

    Defaults follow ZeRO (Rajbhandari et al. 2019, §3.1): 2Ψ fp16 weights,
    2Ψ fp16 grads and KΨ optimizer state with K = 12 (fp32 master weights,
    momentum, variance): 16 bytes per parameter in total.
    Activations are not included.
    """
    for name, x in (("n_params", n_params), ("weight_bytes", weight_bytes),
                    ("grad_bytes", grad_bytes), ("optim_bytes", optim_bytes)):
        _nonneg(name, x)
    return TrainingBytes(n_params * weight_bytes, n_params * grad_bytes, n_params * optim_bytes)


ZERO_STAGES = (0, 1, 2, 3)

#: Bytes per parameter (weights, gradients, optimizer states) by precision recipe.
#:   "zero16"      2 + 2 + 12 = 16: bf16/fp16 weights and gradients, fp32 master, momentum and
#:                 variance (ZeRO, Rajbhandari et al. 2019, §3.1)
#:   "fp32_grads"  2 + 4 + 12 = 18: Megatron-LM's bf16 training keeps fp32 main gradients
#:                 (Megatron-LM docs, distributed optimizer: 6 + 12/d bytes with ZeRO-1 over d)
#:   "bf16_moments" 2 + 4 + 8 = 14: as "fp32_grads", with Adam's two moments in bf16 and the master
#:                 weights in fp32 (DeepSeek-AI 2024, arXiv 2412.19437, §3.3.3; Megatron-LM's
#:                 precision-aware optimizer, --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16)
PRECISIONS = {"zero16": (2, 2, 12), "fp32_grads": (2, 4, 12), "bf16_moments": (2, 4, 8)}

#: How activations are cached for the backward pass (``activation_bytes_per_layer``'s ``cache``).
ACTIVATION_CACHES = ("bf16", "fp8")


def model_state_bytes(n_params: float, dp: int, stage: int, precision: str = "zero16") -> float:
    """``zero_memory_per_gpu`` with the bytes of a precision recipe (``PRECISIONS``).

    "fp32_grads" gives 18Ψ, 6Ψ + 12Ψ/d (ZeRO-1, Megatron's distributed optimizer),
    2Ψ + 16Ψ/d (ZeRO-2) and 18Ψ/d (ZeRO-3).
    """
    _choice("precision", precision, PRECISIONS)
    w, g, o = PRECISIONS[precision]
    return zero_memory_per_gpu(n_params, dp, stage, w, g, o)


def zero_memory_per_gpu(n_params: float, dp: int, stage: int, weight_bytes: float = 2,
                        grad_bytes: float = 2, optim_bytes: float = 12) -> float:
    """Model-state bytes per GPU under ZeRO (Rajbhandari et al. 2019, §5, Fig. 1).

    With the defaults (2 + 2 + 12 bytes per parameter):
      stage 0 (plain DP)                      16Ψ
      stage 1 (optimizer states sharded)      4Ψ + 12Ψ/Nd
      stage 2 (+ gradients sharded)           2Ψ + 14Ψ/Nd
      stage 3 (+ weights sharded, like FSDP)  16Ψ/Nd
    Paper example, Ψ = 7.5e9 and Nd = 64: 120, 31.4, 16.6 and 1.9 GB
    (exact: 120, 31.41, 16.64, 1.875).  Activations are not included.
    """
    _choice("stage", stage, ZERO_STAGES)
    _at_least_one("dp", dp)
    b = training_bytes(n_params, weight_bytes, grad_bytes, optim_bytes)
    if stage == 0:
        return b.total
    if stage == 1:
        return b.weights + b.grads + b.optimizer / dp
    if stage == 2:
        return b.weights + (b.grads + b.optimizer) / dp
    return b.total / dp


RECOMPUTE = ("none", "selective", "full")
#: Every mode priced: ``RECOMPUTE`` (Megatron-LM's: none, Korthikanti's selective, full) and torchtitan's
#: op-level selective checkpointing, "op" (``op_sac_saved``), which only torchtitan runs.
RECOMPUTE_MODES = RECOMPUTE + ("op",)


def recompute_mode(recompute) -> str:
    """``"none"``, ``"selective"``, ``"full"`` or ``"op"``; the old bool still works (False -> "none", True -> "full")."""
    if recompute is True or recompute is False:
        return "full" if recompute else "none"
    return _choice("recompute", recompute, RECOMPUTE_MODES)


def op_sac_matmuls(h: int, a: int, ffn: int | None = None, gated: bool = True,
                   kv_heads: int | None = None) -> list[tuple[str, float, float, bool, bool]]:
    """One Llama block's matmuls in the order its forward runs them, as torchtitan's op-level selective
    checkpointing counts them: (name, input width, output width, rowwise under TP, saved).

    torchtitan's policy (``_custom_policy`` in ``_apply_ac_to_transformer_block``,
    torchtitan/parallelisms/parallelize_llama.py at 9dec370, the commit its Llama 3.1 8B table was run
    with; torchtitan/models/llama3/infra/parallelize.py later) counts every ``aten.mm`` of a block's
    forward and saves the output of the odd ones (1st, 3rd, ...), recomputing "every second mm".  A
    Llama block runs wq, wk, wv (attention), wo, then w1, w3, w2 (``w2(silu(w1(x)) * w3(x))``,
    torchtitan/models/llama/model.py): wq, wv, w1 and w2 are saved, wk, wo and w3 recomputed.  A
    GeLU MLP (not gated) runs up then down: wq, wv and up saved, wk, wo and down recomputed.  Widths
    are full (before TP): wq's h, wk's and wv's h·kv_heads/a, the MLP's ffn.  wo and the MLP's last
    are rowwise under TP."""
    kv = h * (kv_heads or a) / a
    f = ffn or 4 * h
    mlp = [("w1", h, f, False), ("w3", h, f, False), ("w2", f, h, True)] if gated else \
        [("up", h, f, False), ("down", f, h, True)]
    order = [("wq", h, h, False), ("wk", h, kv, False), ("wv", h, kv, False), ("wo", h, h, True)] + mlp
    return [(name, k, n, row, i % 2 == 1) for i, (name, k, n, row) in enumerate(order, start=1)]


def op_sac_saved(s: int, b: int, h: int, a: int, t: int = 1, ffn: int | None = None, gated: bool = True,
                 kv_heads: int | None = None) -> dict[str, float]:
    """Bytes one Llama block keeps from forward to backward under torchtitan's op-level selective
    checkpointing, on one GPU, by tensor (bf16 activations, as torchtitan trains with
    ``mixed_precision_param = "bfloat16"``).

    Its save list (``_save_list``, torchtitan 9dec370) is ``aten.mm`` (all but every second,
    ``op_sac_matmuls``), SDPA's flash and memory-efficient kernels, ``_c10d_functional.reduce_scatter_tensor``
    and, for float8, ``abs``/``max`` (none in a bf16 block).  Kept, with s·b tokens of width h:
      input        the block's input, which the checkpoint holds to rerun it: 2·sbh (÷ t under TP, whose
                   sequence parallelism keeps the block input ``Shard(1)``);
      mm outputs   wq 2·sbh, wv 2·sbh·kv_heads/a, w1 2·sb·ffn (each ÷ t: colwise), and w2's 2·sbh
                   (rowwise: under TP its output is the partial sum, whole, before the reduce-scatter);
      attention    SDPA's output 2·sbh and its logsumexp, fp32 per row and head: 4·s·b·a (each ÷ t).
                   On an H100 in bf16 with causal masking SDPA runs FlashAttention-2,
                   ``aten._scaled_dot_product_flash_attention``, whose outputs these are (torch's
                   backend order puts flash first: aten/src/ATen/native/transformers/cuda/sdp_utils.cpp,
                   ``priority_order``); its other outputs (RNG state, debug mask) are empty for dropout 0;
      reduce-scatter  under TP (t > 1) the two rowwise outputs reduce-scattered to ``Shard(1)``
                   (torchtitan's plan: ``rowwise_parallel(output_layouts=Shard(1))``): 2·sbh/t each.
    Recomputed in backward: wk, wo, w3, the norms, rotary embedding, SiLU and product, and under TP the
    two all-gathers of the norms' outputs (``op_sac_recomputed_flops``).  For the Llama 3 8B shape
    (h = 4096, a = 32, kv_heads = 8, ffn = 14,336, t = 1) that is (8 + 2·kv/a + 2·ffn/h + 4a/h)·sbh =
    15.53·sbh, against Korthikanti's 34·sbh without recomputation and 2·sbh under "full".
    Measured on CPU in tests/unit/test_op_sac.py (a small Llama block under ``torch.utils.checkpoint``
    with this rule, CPU's flash kernel standing in for the GPU's).
    """
    for name, x in (("s", s), ("b", b), ("h", h), ("a", a)):
        _nonneg(name, x)
    _at_least_one("t", t)
    sb = s * b
    out = {"input": 2 * sb * h / t}
    for name, _, width, rowwise, saved in op_sac_matmuls(h, a, ffn, gated, kv_heads):
        if saved:
            out[name] = 2 * sb * width / (1 if rowwise else t)
    out["attention"] = 2 * sb * h / t
    out["logsumexp"] = 4 * sb * a / t
    if t > 1:
        out["reduce-scatter"] = 2 * 2 * sb * h / t
    return out


def op_sac_recomputed_flops(h: int, a: int, t: int = 1, ffn: int | None = None, gated: bool = True,
                            kv_heads: int | None = None) -> float:
    """FLOPs per token that torchtitan's op-level selective checkpointing recomputes in one block's
    backward, on one GPU: the matmuls it does not save (``op_sac_matmuls``: wk, wo, w3 in a Llama
    block), 2·(in·out)/t each, 2·(h·h·kv_heads/a + h² + h·ffn)/t.  For Llama 3 8B that is 36.5 % of the
    block's forward matmul FLOPs.  Attention is saved, not recomputed.  The cheap ops it reruns (the norms,
    rotary embedding, SiLU, the product, the first residual add) are memory-bound kernels, not counted
    here (the planner's calibrated model times them).  Under TP the two all-gathers of the norms' outputs
    run again; the reduce-scatters do not (saved)."""
    _at_least_one("t", t)
    return sum(2 * k * n for _, k, n, _, saved in op_sac_matmuls(h, a, ffn, gated, kv_heads) if not saved) / t


def activation_bytes_per_layer(s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False,
                               recompute=False, scores: bool = True, ffn: int | None = None,
                               gated: bool = False, kv_heads: int | None = None,
                               dropout: bool = True, cache: str = "bf16", qk_dim: float | None = None,
                               v_dim: float | None = None, latent: int = 0, sp_gathered: bool = False) -> float:
    """Activation memory of one transformer layer, 16-bit activations (or ``cache="fp8"``, below).

    Korthikanti et al. 2022 (arXiv 2205.05198), Table 2:
      t = 1, no recompute              sbh(34 + 5as/h)
      tensor parallel (t > 1)          sbh(10 + 24/t + 5as/(ht))
      tensor + sequence parallel (sp)  sbh(34 + 5as/h) / t
      selective recomputation (§4)     the 5as/h term (scores, softmax, dropout mask) is
                                       recomputed, so it drops out of every row
      full recomputation               2sbh  (only the layer input is kept; the table gives
                                       2sbh whatever t is; with sp the kept input is
                                       sequence-sharded, 2sbh/t)
    ``scores=False`` is attention that never stores the s×s scores
    (FlashAttention, ``scaled_dot_product_attention``): the 5as/h term is 0 and
    "selective" equals "none".  ``scores=True`` (the default) is the table as
    printed.  ``ffn``: the MLP width when it is not 4h; the 16 units of the
    MLP's two 4h-wide tensors (first linear's output, GeLU's output) scale
    with ffn/(4h).  Of the 34 units, 10 are the tensors TP does not split
    (LayerNorm inputs 4, attention and MLP inputs 2 + 2, dropout masks 2);
    24 are split by t (Q, K and V 2 each, the attention output 2, the MLP's two
    4h-wide tensors 8 each).  The same count for Llama-style layers:
      ``gated``     a SwiGLU MLP (Shazeer 2020) keeps three ffn-wide tensors, the gate's and
                    the up projection's outputs (the SiLU and the product need both) and the
                    down projection's input: 6·ffn/h units instead of 4·ffn/h;
      ``kv_heads``  grouped-query attention (Ainslie et al. 2023): K and V are kv_heads/a as
                    wide as Q, 2 + 4·kv_heads/a units for Q, K, V instead of 6;
      ``dropout``   False (Llama 2 and 3 train without it): the two sbh dropout masks go,
                    and with stored scores the mask and dropped copy of the scores (5as/h
                    becomes 2as/h, the softmax output alone).
    ``cache="fp8"`` is DeepSeek-V3's recipe (DeepSeek-AI 2024, arXiv 2412.19437): the norms'
    outputs are recomputed in backward, not kept (§3.2.3: the attention and MLP inputs, 4 units,
    go; the norms' own inputs, 4 units, stay); the attention output that the output projection
    reads is kept in E5M6, 1.5 bytes (2 units become 1.5); the MLP keeps its activation
    function's inputs in FP8 and recomputes its output (§3.3.2: SwiGLU's 6·ffn/h units become
    2·ffn/h, a GeLU MLP's 4·ffn/h become ffn/h).  Q, K and V stay 16-bit.  The paper states the
    MLP rule for its MoE layers; here every MLP follows it.
    ``qk_dim``, ``v_dim`` (default h/a) and ``latent`` describe multi-head latent attention (MLA,
    DeepSeek-V2 and V3): heads of width qk_dim for Q and K and v_dim for V and the output
    (a·qk_dim/h · 2 units for Q, and so on), and ``latent`` compressed values per token that the
    up-projections read (q_lora_rank + kv_lora_rank + the shared rotary key), kept as their input
    (2·latent/h units).  With ``cache="fp8"`` the up-projections are recomputed (§3.2.3): Q, K and V
    go and the latent is kept in FP8 (latent/h units).
    ``sp_gathered``: sequence parallelism that keeps the all-gathered, full-sequence inputs of the
    column-parallel projections for their weight gradients, as torch's ``SequenceParallel`` with
    ``PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate())`` does (torchtitan's
    Llama plan, ``apply_tp`` in torchtitan/models/llama3/infra/parallelize.py at 238fa9953): the
    attention and MLP inputs (2 + 2 units) are kept whole, 4·sbh, not 4·sbh/t.  Megatron-LM's
    sequence parallelism (the default, False) keeps its sequence shard and all-gathers it again in
    backward (Korthikanti et al. 2022, §4.2.2; megatron/core/tensor_parallel/layers.py,
    ``LinearWithGradAccumulationAndAsyncCommunication``).  Only with ``sp``, t > 1 and 16-bit caching.
    ``recompute`` is "none", "selective" or "full" (or a bool: True = "full"), or "op": torchtitan's
    op-level selective checkpointing (``op_sac_saved``, summed), for a Llama-shaped block with SDPA
    (``scores=False``), 16-bit caching, no MLA, and sequence parallelism whenever t > 1 (torchtitan's TP).
    """
    for name, x in (("s", s), ("b", b), ("h", h), ("a", a)):
        _nonneg(name, x)
    _at_least_one("t", t)
    mode = recompute_mode(recompute)
    _choice("cache", cache, ACTIVATION_CACHES)
    if mode == "op":
        if scores or cache != "bf16" or qk_dim or v_dim or latent or (t > 1 and not sp):
            raise ValueError("recompute=\"op\" (torchtitan's op-level selective checkpointing) is priced for a "
                             "Llama block with SDPA (scores=False), bf16 caching, no MLA, and sequence parallelism "
                             "with t > 1, as torchtitan runs it")
        return sum(op_sac_saved(s, b, h, a, t, ffn, gated, kv_heads).values())
    sbh = s * b * h
    if mode == "full":
        return 2 * sbh / (t if sp else 1)
    if kv_heads is not None:
        _at_least_one("kv_heads", kv_heads)
    per_score = 5 if dropout else 2  # softmax output (2), dropout mask (1) and output (2)
    attn = per_score * a * s / h if scores and mode == "none" else 0.0
    width = (ffn or 4 * h) / h
    qk = a * qk_dim / h if qk_dim else 1.0  # Q's width, then K's and V's, over h
    v = a * v_dim / h if v_dim else 1.0
    group = kv_heads / a if kv_heads else 1
    qkv = 2 * qk + 2 * group * (qk + v) + 2 * latent / h  # Q, then K and V; MLA's latent
    if cache == "fp8":  # norm outputs recomputed; E5M6 attention output; MLP: activation inputs in FP8
        qkv = latent / h if latent else qkv  # MLA: up-projections recomputed from the FP8 latent
        split = qkv + 1.5 * v + (2 if gated else 1) * width
        kept = 4 + (2 if dropout else 0)
    else:
        split = qkv + 2 * v + (6 if gated else 4) * width  # the parts TP splits: Q/K/V, attention output, MLP
        kept = 8 + (2 if dropout else 0)  # norm inputs 4, attention and MLP inputs 2 + 2, dropout masks 2
    if sp and sp_gathered and cache == "bf16":  # the attention and MLP inputs kept gathered (4 units)
        return sbh * ((kept - 4 + split + attn) / t + 4)
    if sp:
        return sbh * (kept + split + attn) / t
    return sbh * (kept + split / t + attn / t)


# ---------------------------------------------------------------- communication
def _ring(k: int, n_params: float, dp: int, exact: bool) -> float:
    # k·(n-1)/n·Ψ with integer arithmetic first, so an integer Ψ gives the
    # correctly rounded float (trace's counter relies on this for exact equality).
    _nonneg("n_params", n_params)
    _at_least_one("dp", dp)
    return k * n_params if not exact else k * (dp - 1) * n_params / dp


def dp_comm_elems(n_params: float, dp: int, exact: bool = True) -> float:
    """Elements each rank sends per step in a data-parallel gradient all-reduce.

    A ring all-reduce is a reduce-scatter then an all-gather; each moves
    (n-1)/n·Ψ elements per rank, so exact=True gives 2(n-1)/n·Ψ (0 for n=1).
    exact=False gives the large-n asymptote 2Ψ quoted by ZeRO §7.
    ZeRO-1 and ZeRO-2 move the same volume with one micro-batch per step; with
    k micro-batches (gradient accumulation) ZeRO-1 still reduces once, while
    ZeRO-2, which keeps only its gradient shard, reduce-scatters after every
    backward: (k + 1)(n-1)/n·Ψ (``zero_comm_elems(..., micro_batches=k)``).
    Multiply by bytes per element (``comm_bytes``) for bytes.
    """
    return _ring(2, n_params, dp, exact)


def zero3_comm_elems(n_params: float, dp: int, exact: bool = True) -> float:
    """Elements each rank sends per step under ZeRO-3 / FSDP.

    An all-gather of the weights in forward, another in backward and a
    reduce-scatter of the gradients: 3(n-1)/n·Ψ exactly on a ring
    (exact=True), asymptotically 3Ψ = 1.5× plain DP (ZeRO §7, exact=False).
    That is one micro-batch per step: with k micro-batches FSDP gathers and
    reduce-scatters for each, 3k(n-1)/n·Ψ, unless gradient sync and resharding
    are turned off until the last one (``zero_comm_elems(..., micro_batches=k)``).
    """
    return _ring(3, n_params, dp, exact)


def hsdp_comm_elems(n_params: float, replicate: int, shard: int, exact: bool = True) -> dict[str, float]:
    """Per-rank elements per step under HSDP, by mesh axis: {"shard": ..., "replicate": ...}.

    Hybrid sharding (Zhao et al. 2023, "PyTorch FSDP: Experiences on Scaling Fully
    Sharded Data Parallel", VLDB, §3.2.2): ZeRO-3 inside each group of ``shard``
    ranks, the groups ``replicate`` copies of each other.  Inside a group: the
    weights all-gathered in forward and again in backward and the gradients
    reduce-scattered, ``zero3_comm_elems(Ψ, shard)`` = 3(S-1)/S·Ψ; across the
    groups: an all-reduce of each rank's gradient shard, ``dp_comm_elems(Ψ/S, R)`` =
    2(R-1)/R·Ψ/S.  replicate = 1 is FSDP; shard = 1 is plain DP.
    """
    _at_least_one("shard", shard)
    return {"shard": zero3_comm_elems(n_params, shard, exact),
            "replicate": dp_comm_elems(n_params / shard, replicate, exact)}


def hsdp_memory_per_gpu(n_params: float, replicate: int, shard: int, weight_bytes: float = 2,
                        grad_bytes: float = 2, optim_bytes: float = 12) -> float:
    """Model-state bytes per GPU under HSDP: ZeRO-3 over the ``shard`` ranks of a group, whatever
    ``replicate`` is (Zhao et al. 2023, §3.2.2): ``zero_memory_per_gpu(Ψ, shard, 3, ...)``."""
    _at_least_one("replicate", replicate)
    return zero_memory_per_gpu(n_params, shard, 3, weight_bytes, grad_bytes, optim_bytes)


def zero_comm_elems(n_params: float, dp: int, stage: int, exact: bool = True, micro_batches: int = 1) -> float:
    """Per-rank elements per step for ZeRO stage 0-3 with ``micro_batches`` = k per step.

    k = 1: stages 0-2 move plain DP's 2(n-1)/n·Ψ, stage 3 1.5× that.  k > 1: stages 0
    and 1 still reduce once per step (their gradients are whole and accumulate locally);
    stage 2 reduce-scatters after every backward and all-gathers once, (k + 1)(n-1)/n·Ψ
    (DeepSpeed issue #2252); stage 3 gathers twice and reduce-scatters per micro-batch,
    3k(n-1)/n·Ψ.
    """
    _choice("stage", stage, ZERO_STAGES)
    _at_least_one("micro_batches", micro_batches)
    if stage == 3:
        return micro_batches * zero3_comm_elems(n_params, dp, exact)
    if stage == 2:
        return _ring(micro_batches + 1, n_params, dp, exact)
    return dp_comm_elems(n_params, dp, exact)


def tp_comm_elems_per_layer(b: int, s: int, h: int, t: int, sp: bool = False,
                            recompute=False) -> float:
    """Elements each rank sends per layer per micro-batch under Megatron TP.

    Two all-reduces of b·s·h activations in forward and two in backward
    (Shoeybi et al. 2019); each ring all-reduce sends 2(t-1)/t·bsh, giving
    8·b·s·h·(t-1)/t (Narayanan et al. 2021, §3.2).  The lab's sequence
    parallelism (all-gather + reduce-scatter instead, sp=False here) moves the
    same volume.  ``sp=True`` is Megatron's SP, which all-gathers the
    sequence-sharded input again in backward for each column-parallel GEMM:
    10 units of (t-1)/t·bsh instead of 8 (Korthikanti et al. 2022, §4.2.2).
    ``recompute="full"`` (or True) repeats the forward's collectives when the
    layer is recomputed: +4 units.
    """
    for name, x in (("b", b), ("s", s), ("h", h)):
        _nonneg(name, x)
    _at_least_one("t", t)
    units = (10 if sp else 8) + (4 if recompute_mode(recompute) == "full" else 0)
    return units * b * s * h * (t - 1) / t


def cp_comm_elems_per_layer(b: int, s: int, h_kv: int, c: int, reverse_backward: bool = False) -> float:
    """Elements each rank sends per layer per micro-batch under context parallelism (ring attention).

    Each rank holds s/c tokens, so one chunk of K (or V, dK, dV) is b·(s/c)·h_kv
    elements (h_kv = h·kv_heads/heads).  Forward passes K and V c − 1 hops round the
    ring (Liu et al. 2023, ring attention): 2(c − 1) chunks.  Backward depends on
    where the ring starts again:
      reverse_backward=False (lab 07's ring): each rank starts from its own K/V and
          carries dK, dV with them; K and V make c − 1 hops, dK and dV c, the last
          one home: 4c − 2 chunks, (6c − 4)/c·s·b·h_kv per layer in all.
      reverse_backward=True (TransformerEngine's AttnFuncWithCPAndKVP2P, which
          Megatron-Core's context parallelism calls): forward keeps the last chunk
          it received, backward passes K/V the other way round with dK/dV one hop
          behind, so each makes c − 1 hops and dK/dV end at home: 4(c − 1) chunks,
          6(c − 1)/c·s·b·h_kv in all.
    Assumptions: every hop carries a whole chunk (a causal mask skips compute, not
    traffic), gradients in the dtype of K and V, one forward and one backward (a
    recomputed forward sends its 2(c − 1) chunks again).  c = 1 sends nothing.
    """
    for name, x in (("b", b), ("s", s), ("h_kv", h_kv)):
        _nonneg(name, x)
    _at_least_one("c", c)
    if c == 1:
        return 0.0
    chunks = 2 * (c - 1) + (4 * (c - 1) if reverse_backward else 4 * c - 2)
    return chunks * s * b * h_kv / c


CP_ALLGATHER = ("transformer_engine", "torch")


def cp_allgather_elems_per_layer(b: int, s: int, h_kv: int, c: int, implementation: str) -> float:
    """Elements each rank sends per layer per micro-batch under all-gather context parallelism.

    Forward all-gathers the K and V chunks (each b·(s/c)·h_kv elements) so that every rank holds
    the whole sequence's K and V, and attends its own queries to them: 2(c − 1) chunks.  Neither
    implementation keeps the gathered K/V for backward (only the local chunk is saved), so backward
    gathers them again, 2(c − 1) chunks more, and returns dK, dV to their owners:
      "transformer_engine"  ``AttnFuncWithCPAndKVAllGather`` (Megatron-Core's
          ``cp_comm_type="all_gather"``; transformer_engine/pytorch/attention/dot_product_attention/
          context_parallel.py: ``gather_along_first_dim`` of k and v in forward and again in backward,
          ``reduce_scatter_along_first_dim`` of dk and dv): 2(c − 1) chunks for the reduce-scatter,
          6(c − 1) in all, 6(c − 1)/c·s·b·h_kv, the bytes of TransformerEngine's ring
          (``cp_comm_elems_per_layer(reverse_backward=True)``).  Its docstring: "KV all-gather between CP
          ranks is exposed".
      "torch"  torch 2.13's ``context_parallel`` with its default ``set_rotate_method("allgather")``
          (torch/distributed/tensor/experimental/_context_parallel/_attention.py,
          ``_templated_ring_attention_backward``): the backward all-gathers K/V again and passes dK, dV
          round the ring one hop per block with an all-to-all rotater, c hops (the last one home): 2c
          chunks, 6c − 4 in all, (6c − 4)/c·s·b·h_kv, the bytes of lab 07's ring
          (``cp_comm_elems_per_layer(reverse_backward=False)``).
    So all-gather moves no fewer bytes than the ring.  What it buys is elsewhere: the attention
    kernel sees the whole sequence's K/V at once, so any mask (Llama 3's document masks) is easy,
    and with grouped-query attention K/V are small beside Q (Dubey et al. 2024, §3.3.2); the price
    is ``cp_kv_elems_held`` of the whole sequence.  c = 1 sends nothing.
    """
    for name, x in (("b", b), ("s", s), ("h_kv", h_kv)):
        _nonneg(name, x)
    _at_least_one("c", c)
    _choice("implementation", implementation, CP_ALLGATHER)
    if c == 1:
        return 0.0
    chunks = 6 * (c - 1) if implementation == "transformer_engine" else 6 * c - 4
    return chunks * s * b * h_kv / c


def cp_alltoall_elems_per_layer(b: int, s: int, h: int, h_kv: int, c: int) -> float:
    """Elements each rank sends per layer per micro-batch under all-to-all (Ulysses) context parallelism.

    DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv:2309.14509): an all-to-all turns Q, K and V
    from sequence-sharded (s/c tokens, all heads) into head-sharded (all s tokens, 1/c of the
    heads), attention runs locally, and a second all-to-all turns the output back; backward
    repeats both in reverse.  Each all-to-all keeps 1/c of the rank's (s/c)·b·width elements
    and sends the rest: 2·(c − 1)/c·(s/c)·b·(2h + 2h_kv) in all, which shrinks as c grows,
    where the ring's and all-gather's stay near 6 chunks of K/V.  It needs the heads
    and the K/V heads to divide by c, so c is capped by the K/V heads (8 in Llama 3).  DeepSpeed's
    sequence parallelism is this one.
    Megatron-Core calls it ``cp_comm_type="a2a"`` (and "a2a+p2p" for a2a inside a node and
    the ring across).  c = 1 sends nothing.
    """
    for name, x in (("b", b), ("s", s), ("h", h), ("h_kv", h_kv)):
        _nonneg(name, x)
    _at_least_one("c", c)
    return 2 * (c - 1) / c * (s / c) * b * (2 * h + 2 * h_kv)


def cp_kv_elems_held(b: int, s: int, h_kv: int, c: int, method: str = "ring") -> float:
    """K and V elements a rank holds for one layer's attention under each CP method: the ring
    its own chunk and the one arriving (2 · 2·b·(s/c)·h_kv), all-gather the whole sequence's
    (2·b·s·h_kv), all-to-all (Ulysses) all tokens of 1/c of the K/V heads (2·b·s·h_kv/c)."""
    _at_least_one("c", c)
    per_chunk = 2 * b * s * h_kv / c  # K and V of s/c tokens
    held = {"ring": 2 * per_chunk, "all_gather": c * per_chunk, "all_to_all": per_chunk}
    if method not in held:
        raise ValueError(f"method must be one of {tuple(held)}, got {method!r}")
    return held[method]


def ep_comm_elems_per_layer(tokens: int, h: int, top_k: int, n: int) -> float:
    """Elements each rank sends per MoE layer per micro-batch under expert parallelism.

    Each of the rank's ``tokens`` tokens goes to ``top_k`` experts; the experts are
    spread over n ranks.  Dispatch sends every assignment's row of h elements to
    the rank of its expert with an all-to-all, combine sends the results back with a
    second one (GShard, Lepikhin et al. 2020, §2.2 and §3.2; Switch Transformer,
    Fedus et al. 2021, §2.2), and backward runs both again in reverse: 4 all-to-alls
    of top_k·tokens·h·(n − 1)/n elements, the share (n − 1)/n leaving the rank.
    Assumptions: routing is balanced (each rank's experts get 1/n of the
    assignments, and every rank sends back as many rows as it received), no
    assignment is dropped by a capacity factor (drops only lower it), each
    assignment travels as its own row (a token with two experts on one rank is
    sent twice, as lab 07's layer sends it), and the all-to-all of the counts
    (n integers) is left out.
    """
    for name, x in (("tokens", tokens), ("h", h)):
        _nonneg(name, x)
    _at_least_one("top_k", top_k)
    _at_least_one("n", n)
    return 4 * top_k * tokens * h * (n - 1) / n


def pp_comm_elems(b: int, s: int, h: int) -> float:
    """Elements sent between neighbouring pipeline stages per micro-batch, each way.

    The activation (forward) or its gradient (backward): b·s·h.
    Interleaved schedules send this v times as often.
    """
    for name, x in (("b", b), ("s", s), ("h", h)):
        _nonneg(name, x)
    return b * s * h


def comm_bytes(elems: float, dtype=2) -> float:
    """Elements × bytes per element; dtype is a byte count, a name ("bf16") or a torch.dtype."""
    _nonneg("elems", elems)
    per = dtype if isinstance(dtype, (int, float)) and not isinstance(dtype, bool) else dtype_bytes(dtype)
    return elems * per


# ---------------------------------------------------------------- pipeline bubble
SCHEDULES = ("gpipe", "1f1b", "interleaved")
BUBBLE_DEFINITIONS = ("share", "megatron")


def bubble_fraction(p: int, m: int, schedule: str = "gpipe", v: int = 1,
                    definition: str = "share") -> float:
    """Pipeline bubble for p stages and m micro-batches.  Two definitions:

    definition="share":    idle time as a share of the TOTAL step time
                           (Huang et al. 2018, GPipe):   (p-1)/(m+p-1)
    definition="megatron": idle time relative to the IDEAL (bubble-free)
                           time (Narayanan et al. 2021): (p-1)/m

    1F1B has the same bubble as GPipe.  Interleaved 1F1B with v virtual
    stages per rank: (p-1)/(v·m) under "megatron", and the matching share
    (p-1)/(v·m + p-1) under "share".  In general share = r/(1+r) where r is
    the megatron ratio.
    """
    _choice("schedule", schedule, SCHEDULES)
    _choice("definition", definition, BUBBLE_DEFINITIONS)
    _at_least_one("p", p)
    _at_least_one("m", m)
    _at_least_one("v", v)
    if schedule != "interleaved" and v != 1:
        raise ValueError(f"v={v} only applies to schedule='interleaved'")
    ideal = v * m  # ideal time in units of one (virtual) stage's chunk of work
    bubble = p - 1
    return bubble / ideal if definition == "megatron" else bubble / (ideal + bubble)


def stage_sizes(n_layers: int, p: int) -> tuple[int, ...]:
    """Layers on each of p pipeline stages, split as evenly as they go: the first n_layers mod p
    stages take one more (0 on the last stages when p > n_layers, a split no plan may use)."""
    _at_least_one("n_layers", n_layers)
    _at_least_one("p", p)
    q, r = divmod(n_layers, p)
    return tuple(q + (1 if i < r else 0) for i in range(p))


def pipeline_warmup(p: int, rank: int, v: int = 1) -> int:
    """Forward passes stage ``rank`` runs before its first backward, with enough micro-batches
    (Megatron-LM's schedules, megatron/core/pipeline_parallel/schedules.py): p - rank - 1 in 1F1B;
    with v > 1 model chunks per rank (interleaved 1F1B), 2(p - rank - 1) + (v - 1)·p chunk forwards.
    The one home of the warm-up: ``activations_held`` and ``parallel.pp_schedule.warmup_forwards``
    (which caps it by the micro-batches there are) read it."""
    _at_least_one("p", p)
    _at_least_one("v", v)
    if not 0 <= rank < p:
        raise ValueError(f"rank must be in 0..{p - 1}, got {rank!r}")
    return p - rank - 1 if v == 1 else 2 * (p - rank - 1) + (v - 1) * p


def activations_held(p: int, m: int, schedule: str = "1f1b", rank: int = 0, v: int = 1) -> float:
    """Peak number of micro-batches whose activations a stage keeps (in units of a whole stage's layers).

    GPipe runs all m forwards before any backward: m.  1F1B keeps the
    warm-up forwards plus the one in flight: min(m, p - rank), at most p
    (on stage 0).  Interleaved 1F1B with v chunks per rank (Megatron-LM
    schedules: warm-up 2(p - rank - 1) + (v - 1)p chunks, each 1/v of the
    stage) keeps min(m·v, 2(p-rank-1) + (v-1)p + 1) / v: on stage 0 about
    1 + (p-1)/(p·v) times what 1F1B holds there.  With m = p Megatron-LM runs
    every forward first (all warm-up), so each rank holds all m·v chunks: m.
    """
    _choice("schedule", schedule, ("gpipe", "1f1b", "interleaved"))
    _at_least_one("m", m)
    _at_least_one("v", v)
    if schedule == "gpipe":
        pipeline_warmup(p, rank)  # checks p and rank
        return m
    if schedule == "1f1b":
        if v != 1:
            raise ValueError(f"v={v} only applies to schedule='interleaved'")
        return min(m, pipeline_warmup(p, rank) + 1)
    warm = pipeline_warmup(p, rank, v)
    if m == p:
        return m
    chunks = min(m * v, warm + 1)
    return chunks / v


# ---------------------------------------------------------------- bandwidth
_BUSBW = {  # op -> k, factor = k(n-1)/n; None means factor 1 (rooted ops, point-to-point)
    "allreduce": 2, "allgather": 1, "reducescatter": 1, "alltoall": 1,
    "broadcast": None, "reduce": None, "sendrecv": None,
}
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
               "sendrecv")


def busbw_ratio(op: str, n: int) -> Fraction:
    """``busbw_factor`` as an exact Fraction (used by parlab.trace for exact byte counts)."""
    key = op.lower().replace("_", "").replace("-", "").replace(" ", "")
    if key not in _BUSBW:
        raise ValueError(f"unknown collective {op!r}; allowed: {', '.join(COLLECTIVES)}")
    _at_least_one("n", n)
    k = _BUSBW[key]
    return Fraction(1) if k is None else Fraction(k * (n - 1), n)


def busbw_factor(op: str, n: int) -> float:
    """busbw / algbw for a collective on n ranks (nccl-tests, doc/PERFORMANCE.md).

    all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n;
    broadcast, reduce (and sendrecv) 1.  The factor is also the bytes each
    rank sends, per byte of S, in a ring algorithm.  Names are matched
    ignoring case, "_", "-" and spaces ("all_reduce", "allreduce", "all-reduce").
    """
    return float(busbw_ratio(op, n))


def algbw(size_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth S / t in bytes/s (S = full array for all-gather/reduce-scatter)."""
    _nonneg("size_bytes", size_bytes)
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds!r}")
    return size_bytes / seconds


def busbw(op: str, size_bytes: float, seconds: float, n: int) -> float:
    """Bus bandwidth = algbw × busbw_factor(op, n), comparable to link speed (nccl-tests)."""
    return algbw(size_bytes, seconds) * busbw_factor(op, n)


# ---------------------------------------------------------------- FLOPs and time
def model_flops_per_token(n_params: float, layers: int, hidden: int, seq: int) -> float:
    """Training FLOPs per token: 6N + 12·L·h·s (PaLM, Chowdhery et al. 2022, app. B).

    6N is forward + backward through the weights; 12·L·h·s the attention
    scores and weighted sum (no recomputation counted: *model* FLOPs).
    """
    for name, x in (("n_params", n_params), ("layers", layers), ("hidden", hidden), ("seq", seq)):
        _nonneg(name, x)
    return 6 * n_params + 12 * layers * hidden * seq


def mfu(tokens_per_s: float, n_params: float, layers: int, hidden: int, seq: int,
        n_gpus: int, peak_flops: float = H100_BF16_PEAK) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over peak FLOP/s (PaLM app. B).

    tokens_per_s is the throughput of the whole job (all n_gpus together).
    """
    _nonneg("tokens_per_s", tokens_per_s)
    _at_least_one("n_gpus", n_gpus)
    if peak_flops <= 0:
        raise ValueError(f"peak_flops must be > 0, got {peak_flops!r}")
    return tokens_per_s * model_flops_per_token(n_params, layers, hidden, seq) / (n_gpus * peak_flops)


def time_to_train(n_params: float, tokens: float, n_gpus: int,
                  peak_flops: float = H100_BF16_PEAK, mfu: float = 0.4) -> float:
    """Seconds to train: 6·N·tokens / (GPUs × peak × MFU) (attention FLOPs ignored).

    Divide by SECONDS_PER_DAY for days.
    """
    _nonneg("n_params", n_params)
    _nonneg("tokens", tokens)
    _at_least_one("n_gpus", n_gpus)
    if peak_flops <= 0 or not 0 < mfu <= 1:
        raise ValueError(f"need peak_flops > 0 and 0 < mfu <= 1, got {peak_flops!r}, {mfu!r}")
    return 6 * n_params * tokens / (n_gpus * peak_flops * mfu)
