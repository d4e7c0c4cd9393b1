"""Published training runs, as the planner sees them: model shape, GPUs, layout, reported throughput.

The planner's error band (``error_band``) is measured on these runs: for each, the planner
predicts the published layout's throughput and the band is the largest |predicted ÷ reported − 1|
over the runs it is meant to cover.  Runs whose throughput it is known to miss carry ``miss`` with
the figure and the reason (docs/planner.md), and are left out of the band; runs whose layout it
counts over the memory their authors ran it in carry ``memory_miss``, and stay in the band.  Throughput is converted to tokens/s
the way each paper counts FLOPs.

Sources:
  Megatron-LM: Narayanan et al. 2021 (arXiv 2104.04473), Table 1: A100 80 GB, seq 2048,
    V = 51,200, full recomputation; TFLOP/s by their eq. (3), 96·B·s·l·h²(1 + s/6h + V/16lh),
    which counts the recomputed forward.  2021 attention stored its scores.
  Llama 3: Dubey et al. 2024 (arXiv 2407.21783), Table 4: 405B, TP 8, PP 16, seq 8192,
    H100 80 GB; TFLOP/s counted as model FLOPs (here 6N + 12·L·h·s, PaLM app. B).
  torchtitan docs/performance.md: Llama 3.1 8B on 8 H100s (96 GB HBM2e), FSDP, local batch 2,
    "Selective activation checkpointing", 5,762 tokens/s/GPU at 82.4 GiB (Table 1, commit 47d1825,
    Jan 2025; run at torchtitan 9dec370, whose llama3_8b.toml sets selective_ac_option = 'op'; the
    memory is train.py's ``max_reserved_gib``, the caching allocator's peak reservation; footnote 2:
    "HBM2e-based SXM H100 with lower TDP, the actual peak TFLOPs number is between SXM and NVL, and we
    don't know its exact value", at a 500 W power limit);
    Llama 3 8B and 70B with FSDP on 64 A100 80 GB, 2,904 tokens/s/GPU with "selective layer" and
    331 with "full" checkpointing (commit 1d5815c, Oct 2024; k of "selective layer" not stated, the
    option's default there "2", config_manager.py: "2 = checkpoint every other layer").
  DeepSeek-V3: DeepSeek-AI 2024 (arXiv 2412.19437).  671B parameters, 37B active, 61 layers
    (the first 3 dense, FFN 18,432), h = 7,168, 128 heads (MLA), 256 routed experts of width
    2,048 and 1 shared expert per MoE layer, top-8, vocabulary 129,280 (§4.2); sequence 4,096,
    batch 15,360 sequences after the ramp-up (§4.2); 2,048 H800 GPUs, NVLink 160 GB/s and
    InfiniBand 50 GB/s per GPU as §3.2.2 states them; PP 16, EP 64 over 8 nodes, ZeRO-1 data
    parallelism, no TP (§3.2).  Throughput: "training DeepSeek-V3 on each trillion tokens
    requires only 180K H800 GPU hours" (§1; Table 1: 2,664K GPU hours for 14.8T tokens of
    pre-training), i.e. 1e12 / (180,000 × 3,600 s) = 1,543 tokens/s per GPU.  The micro-batch
    is not stated (1 assumed).  H800: the H100 SXM's compute and HBM, less NVLink.  MLA: heads of
    128 + 64 (queries and keys) and 128 (values), latent 1,536 + 512 + 64 (§4.2).  Priced as the paper
    trains it (``DSV3_PRICED``): DualPipe (``Plan(schedule="dualpipe")``), which runs the all-to-all
    beside another micro-batch's computation (§3.2.1; ``Plan.ep_overlap``) on 20 of the 132 SMs (§3.5.1;
    ``planner.OVERLAP_SMS``); activations cached in FP8 (``Plan(act_cache="fp8")``, §3.3.2, with the
    norms and MLA's up-projections recomputed, §3.2.3, and no whole layer: the paper recomputes nothing
    else); Adam's moments in bf16 (precision "bf16_moments", §3.3.3); in DeepSeek-AI's HAI-LLM (§3.2),
    not public.  So priced, the planner counts it over the memory a plan may use (``DSV3_MEMORY_MISS``),
    as it counts Llama 3 405B (``LLAMA_405B_MEMORY_MISS``).

Each run states its checkpointing as the source words it (``Run.published_ac``) and, where the
planner has no such mode, why the mode it is priced under (``Plan.recompute``) is the nearest
(``Run.priced_as``).  Llama 3 405B trained without checkpointing (Dubey et al. 2024, §3.3.2), which
the planner counts over the HBM (``LLAMA_405B_MEMORY_MISS``).  torchtitan's two rows are priced in its
own modes: "selective op" as ``Plan(recompute="op")`` (every matmul's output saved but every second one,
and SDPA's; ``cost.op_sac_saved``, torchtitan 9dec370 parallelize_llama.py ``_custom_policy``), "selective
layer" as ``Plan(recompute="full", recompute_every=2)`` (every k-th block fully recomputed,
``selective_ac_option = 'k'``; k = 2, the option's default, and any k predicts the same:
``titan_8b_a100_every_k``).

Llama 3's data parallelism is FSDP that shards optimizer states and gradients and does not reshard
the weights after forward (Dubey et al. 2024, §3.3.2).  It is priced as ZeRO-1: under PP with
32 or 16 micro-batches per step the weights then stay gathered from the first forward to the last
backward, which is ZeRO-1's whole bf16 weights and one all-gather per step.  The gradients are
either accumulated whole and reduce-scattered once (ZeRO-1 exactly, memory and bytes) or
reduce-scattered after every micro-batch (ZeRO-2's gradient memory, and accum times the
reduce-scatter bytes); the paper does not say which.  ``LLAMA_FSDP`` gives the figures of the
second reading: it needs less memory and moves more bytes; the layout is still over the 72 GB a
plan may use (``LLAMA_405B_MEMORY_MISS``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from .. import planner as P
from . import ModelSpec, Plan, Workload

__all__ = ["Run", "RUNS", "error_band", "ratios", "calibrated", "llama_fsdp_zero2_reading", "deepseek_v3_readings",
           "DSV3_MEMORY_MISS", "LLAMA_405B_MEMORY_MISS", "titan_8b_h100_readings", "titan_8b_a100_every_k",
           "H100_NVL_PEAK"]


@dataclass(frozen=True)
class Run:
    name: str
    work: Workload
    plan: Plan
    reported: float  # tokens/s over all GPUs
    miss: str = ""  # why the planner misses its throughput (kept out of the band), or ""
    memory_miss: str = ""  # why the planner counts the layout over the memory its authors ran it in, or ""
    published_ac: str = ""  # the activation checkpointing as the source states it
    priced_as: str = ""  # why plan.recompute is the planner's nearest mode, where it differs


def _megatron(name, params, heads, h, l, tp, pp, gpus, batch, tflops) -> Run:
    m = ModelSpec(f"GPT {name}", params * 1e9, l, h, heads, 2048, vocab=51200, tied=True, scores=True)
    dp = gpus // (tp * pp)
    flops = 96 * l * h * h * (1 + 2048 / (6 * h) + 51200 / (16 * l * h))  # per token, eq. (3)
    return Run(f"Megatron-LM {name}, {gpus} A100s (Narayanan 2021, Table 1)", Workload(m, P.A100_80GB(gpus), batch),
               Plan(dp=dp, tp=tp, pp=pp, zero=0, micro_batch=1, accum=batch // dp, recompute="full", sp=False),
               tflops * 1e12 * gpus / flops, published_ac="full (Narayanan 2021)")


LLAMA = dict(vocab=128256, kv_heads=8, gated=True, dropout=False)  # SwiGLU, GQA, no dropout (Dubey 2024)
L405 = ModelSpec("Llama 3 405B", 405e9, 126, 16384, 128, 8192, ffn=53248, **LLAMA)
L8 = ModelSpec("Llama 3 8B", 8.03e9, 32, 4096, 32, 8192, ffn=14336, **LLAMA)
L70 = ModelSpec("Llama 3 70B", 70.6e9, 80, 8192, 64, 8192, ffn=28672, **LLAMA)


def _palm(m: ModelSpec) -> float:
    return 6 * m.params + 12 * m.layers * m.hidden * m.seq


LLAMA_405B_MEMORY_MISS = (
    "Dubey et al. 2024 trained it without activation checkpointing (§3.3.2: 'we could pre-train Llama 3 on "
    "sequences of 8K tokens without activation checkpointing'), having deallocated the tensors no later "
    "computation uses, the pipeline stages' inputs and outputs included, and with their own schedule of N "
    "contiguous micro-batches. The planner counts 101.7 GB (8,192 GPUs) and 87.6 GB (16,384) on the busiest "
    "stage: 19.7 and 19.4 GB of model states plus one layer's activations (532.7 MB per micro-batch: Korthikanti's "
    "tensors with SwiGLU and GQA, TP 8 with SP) × its 8 layers × the 19.25 and 16 micro-batches Megatron-LM's "
    "interleaved schedule holds there. To fit the 80 GB Meta had, no more than 14.2 and 14.2 could be held. Neither "
    "Meta's schedule nor its deallocation is modelled. The throughput, priced as trained, is 0.93 and 0.91, "
    "inside the band (docs/planner.md)")


TITAN_8B_H100_MISS = (
    "Priced as run, under torchtitan's op-level selective checkpointing (recompute=\"op\": wk, wo and w3 "
    "recomputed, 36.5 % of a layer's forward matmul FLOPs), at the H100 SXM's 989 TFLOP/s the planner "
    "predicts 1.26. torchtitan's GPUs were not SXM H100s at their rated power: 'HBM2e-based SXM H100 with lower "
    "TDP, the actual peak TFLOPs number is between SXM and NVL, and we don't know its exact value' (500 W; "
    "docs/performance.md at 47d1825, footnote 2). At the H100 NVL's 835 TFLOP/s (dense BF16, NVIDIA's H100 "
    "datasheet) it predicts 1.06; the planner has no peak for these GPUs, so the row is kept out of the band. "
    "Memory: the planner counts 61.1 GB against 88.5 GB (82.4 GiB) measured, 27.4 GB under. The measure is the "
    "caching allocator's peak reservation (train.py's max_reserved_gib at 9dec370), which the planner does "
    "not model, nor the loss's chain: torchtitan casts the bf16 logits to fp32 and cross_entropy keeps their "
    "log-softmax, 4.2 + 8.4 + 8.4 GB at the loss against the 8.4 GB of fp32 logits the planner counts. For "
    "comparison: without recomputation it counts 99.5 GB (1.28), under full 33.0 GB (1.16) "
    "(docs/planner.md)")
TITAN_8B_A100_EVERY = 2  # torchtitan's default selective_ac_option at 1d5815c ("2 = checkpoint every other layer")
TITAN_8B_A100_AC = ("full: torchtitan's selective layer checkpointing, every k-th layer fully recomputed "
                    "(recompute_every), k not stated; priced at k = 2, the option's default (config_manager.py "
                    "at 1d5815c), 26.9 GB. Every k from 1 to 32 predicts 0.85 (ZeRO-3's exposed all-gathers take "
                    "the time recomputation adds; titan_8b_a100_every_k), as do none and op")


DSV3 = ModelSpec("DeepSeek-V3", 671e9, 61, 7168, 128, 4096, vocab=129280, ffn=18432, gated=True, dropout=False,
                 experts=256, top_k=8, expert_ffn=2048, shared_experts=1, moe_layers=58,
                 qk_head_dim=192, v_head_dim=128, latent=1536 + 512 + 64)  # MLA (§4.2)
H800 = P.H100_SXM(2048, nvlink=200e9, nvlink_busbw=160e9, network=50e9, name="H800")
DSV3_PRICED = ("none: DeepSeek-AI 2024 recomputes RMSNorm and MLA's up-projections only (§3.2.3), no whole layer; "
               "the planner prices that as act_cache=\"fp8\" (the norms' outputs and Q, K, V recomputed in "
               "backward, the latent and the activation functions' inputs cached in FP8, §3.2.3, §3.3.2) with no "
               "layer recomputed, beside what the paper states and the planner prices: MLA's heads and latent (§4.2); "
               "DualPipe (§3.2.1, Table 2: the all-to-all and the pipeline's sends beside the computation, its bubble, "
               "two parameter copies, PP + 1 micro-batches of activations); the computation on the 112 of 132 SMs the "
               "all-to-all kernels leave it (§3.5.1); Adam's moments in bf16 (§3.3.3). So priced it is predicted at "
               "0.89 and needs 74.8 GB, over the 72 GB a plan may use (DSV3_MEMORY_MISS). Recomputing whole layers "
               "as well, which the paper does not do, the fewest that fit (1 layer of each stage's 3 or 4, "
               "planner.fewest_recomputed) need 66.2 GB and predict 0.83. Without the recipe (1F1B, bf16 "
               "activations and moments in fp32, the all-to-all exposed as Megatron-LM runs it by default, 3 of each "
               "stage's layers recomputed) 0.40: the all-to-all alone is about as long as the computation (15.9 "
               "against 18.1 s per step without recomputation, the 1:1 of §3.2.1). Not priced, which would raise it: "
               "FP8 GEMMs (§3.3.1, 'theoretically doubles the computational speed': every FLOP at twice the rate "
               "gives 1.18, an upper bound, since attention, the embedding and the output head stay in BF16; the "
               "planner has no measured FP8 efficiency), FP8 dispatch and node-limited routing (§3.2.2) "
               "(docs/planner.md)")
DSV3_MEMORY_MISS = (
    "DeepSeek-AI 2024 trained this layout on H800s of 80 GB, recomputing only RMSNorm and MLA's up-projections "
    "(§3.2.3). The planner counts 74.8 GB on the busiest stage (stage 0, with the embedding): 34.0 GB of model "
    "states (DualPipe's two parameter copies and their fp32 gradients, ZeRO-1 sharding the optimizer's states) "
    "and 40.9 GB of activations (0.60 GB per layer and micro-batch, FP8-cached, × its 4 layers × the PP + 1 = 17 "
    "micro-batches DualPipe holds). That is under the 80 GB the GPU holds but over the 72 GB (90 %) a plan may use, "
    "so the planner would not have chosen it. Not modelled: the per-chunk activations DualPipe actually keeps (the "
    "paper gives PP + 1 in units it does not size), the tensors its kernels free early, and its other savings "
    "(the exponential moving average of the weights kept in CPU memory, the embedding and output head shared with "
    "the multi-token-prediction module, §3.2.3). The throughput, priced as trained, is 0.89, inside the band "
    "(docs/planner.md)")


def _llama(gpus, dp, per_dp, tflops) -> Run:
    # first and last stage one layer fewer (Dubey et al. 2024 §3.3.2); interleaved schedule (v=4 assumed);
    # no activation checkpointing (§3.3.2), which the planner counts over the HBM (LLAMA_405B_MEMORY_MISS)
    return Run(f"Llama 3 405B, {gpus:,} H100s (Dubey 2024, Table 4)", Workload(L405, P.H100_SXM(gpus), dp * per_dp),
               Plan(dp=dp, tp=8, pp=16, zero=1, micro_batch=1, accum=per_dp, recompute="none",
                    stages=(7,) + (8,) * 14 + (7,), v=4),
               tflops * 1e12 * gpus / _palm(L405), published_ac="none (Dubey 2024, §3.3.2)",
               memory_miss=LLAMA_405B_MEMORY_MISS)


RUNS = (
    _megatron("1.7B", 1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    _megatron("18.4B", 18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    _megatron("145.6B", 145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    _megatron("1T", 1008, 160, 25600, 128, 8, 64, 3072, 3072, 163),
    _llama(8192, 64, 32, 430),
    _llama(16384, 128, 16, 400),
    Run("torchtitan Llama 3.1 8B, FSDP, 8 H100s", Workload(L8, P.H100_SXM(8, memory=96e9, hbm_bandwidth=2.4e12), 16),
        Plan(dp=8, tp=1, pp=1, zero=3, micro_batch=2, accum=1, recompute="op"), 5762 * 8,
        published_ac="selective op (82.4 GiB measured)", miss=TITAN_8B_H100_MISS),
    Run("torchtitan Llama 3 8B, FSDP, 64 A100s", Workload(L8, P.A100_80GB(64), 64),
        Plan(dp=64, tp=1, pp=1, zero=3, micro_batch=1, accum=1, recompute="full",
             recompute_every=TITAN_8B_A100_EVERY), 2904 * 64,
        published_ac="selective layer", priced_as=TITAN_8B_A100_AC),
    Run("torchtitan Llama 3 70B, FSDP, 64 A100s", Workload(L70, P.A100_80GB(64), 64),
        Plan(dp=64, tp=1, pp=1, zero=3, micro_batch=1, accum=1, recompute="full"), 331 * 64,
        published_ac="full"),
    Run("DeepSeek-V3, 2,048 H800s (DeepSeek-AI 2024)", Workload(DSV3, H800, 15360),
        Plan(dp=128, tp=1, pp=16, zero=1, micro_batch=1, accum=120, recompute="none", ep=64,
             ep_overlap=True, schedule="dualpipe", act_cache="fp8", precision="bf16_moments"),
        1e12 / (180e3 * 3600) * 2048, published_ac="RMSNorm and MLA up-projection (§3.2.3)",
        priced_as=DSV3_PRICED, memory_miss=DSV3_MEMORY_MISS),
)


def llama_fsdp_zero2_reading(run: Run) -> dict:
    """Llama 3's FSDP read as ZeRO-2 under PP (gradients reduce-scattered after every micro-batch,
    weights kept gathered): GB per GPU without and with full recomputation, and the reduce-scatters
    of each stage's gradients per step (ZeRO-1's reading: one)."""
    gb = {rc: P.memory_per_gpu(replace(run.plan, zero=2, recompute=rc, recompute_layers=0), run.work.model) / 1e9
          for rc in ("none", "full")}
    return {"GB without recomputation": gb["none"], "GB with full recomputation": gb["full"],
            "reduce-scatters per step": run.plan.accum}


def deepseek_v3_readings() -> dict:
    """The DeepSeek-V3 row under each reading ``DSV3_PRICED`` states: name -> ``planner.Prediction``: "priced"
    (as published), "block" (whole layers recomputed as well, the fewest that fit), "plain" (without the recipe,
    the fewest layers recomputed that fit), "bare" (without the recipe or recomputation) and "every FLOP at twice
    the rate" (the FP8 bound)."""
    run = next(r for r in RUNS if r.work.model is DSV3)
    plan, work = run.plan, run.work
    block = P.fewest_recomputed(replace(plan, recompute="full"), work)  # whole layers too, which the paper does not
    bare = replace(plan, ep_overlap=False, schedule="1f1b", act_cache="bf16", precision="fp32_grads")
    plain = P.fewest_recomputed(replace(bare, recompute="full"), work)
    twice = replace(work, cluster=replace(work.cluster, peak_flops=2 * work.cluster.peak_flops))
    readings = {"priced": (plan, work), "block": (block, work), "plain": (plain, work), "bare": (bare, work),
                "every FLOP at twice the rate": (plan, twice)}
    return {name: P.predict(p, w) for name, (p, w) in readings.items()}


#: The H100 NVL's dense BF16 peak (NVIDIA H100 datasheet: 1,671 TFLOP/s with sparsity), the lower end of the range
#: torchtitan gives for its H100s' peak (``TITAN_8B_H100_MISS``).
H100_NVL_PEAK = 835e12


def titan_8b_h100_readings() -> dict:
    """torchtitan's 8B on 8 H100s under each reading ``TITAN_8B_H100_MISS`` states: name -> ``planner.Prediction``:
    "op" (as run, at the SXM's peak), "op at the NVL's peak", "none" and "full" (the planner's other modes)."""
    run = next(r for r in RUNS if r.plan.recompute == "op")
    nvl = replace(run.work, cluster=replace(run.work.cluster, peak_flops=H100_NVL_PEAK))
    readings = {"op": (run.plan, run.work), "op at the NVL's peak": (run.plan, nvl),
                "none": (replace(run.plan, recompute="none"), run.work),
                "full": (replace(run.plan, recompute="full"), run.work)}
    return {name: P.predict(p, w) for name, (p, w) in readings.items()}


def titan_8b_a100_every_k() -> dict:
    """torchtitan's 8B on 64 A100s under "selective layer" with each k from 1 to the layers, and under
    "none" and "op": name -> ``planner.Prediction``."""
    run = next(r for r in RUNS if r.plan.recompute_every)
    out = {k: P.predict(replace(run.plan, recompute_every=k), run.work) for k in range(1, run.work.model.layers + 1)}
    for rc in ("none", "op"):
        out[rc] = P.predict(replace(run.plan, recompute=rc, recompute_every=0), run.work)
    return out


def calibrated(work: Workload) -> Workload:
    """``work`` on the same cluster timed with the calibrated model (``Cluster.calibrated``)."""
    return replace(work, cluster=replace(work.cluster, calibrated=True))


def ratios(calibrated_time: bool = False) -> dict[str, float]:
    """Predicted ÷ reported throughput of each run's published layout (``calibrated_time``: under the
    calibrated time model, memory-bound work, causal attention and the MFU cap)."""
    pick = calibrated if calibrated_time else (lambda w: w)
    return {r.name: P.predict(r.plan, pick(r.work)).tokens_per_second / r.reported for r in RUNS}


@lru_cache(maxsize=2)
def error_band(calibrated_time: bool = False) -> float:
    """The planner's error on published runs: the largest |predicted ÷ reported − 1| over ``RUNS``
    that are not known misses."""
    found = ratios(calibrated_time)
    return max(abs(found[r.name] - 1) for r in RUNS if not r.miss)
