"""Which framework runs a planner plan, and its configuration there.

A plan is only worth predicting if some framework runs it the way the planner prices it.
``runs_on(plan)`` names the framework, ``unrunnable(plan)`` lists the rules a plan breaks
(each with its source), and ``configuration(plan, work)`` prints what to give the framework:
Megatron-LM's command-line arguments, a torchtitan TOML file or a DeepSpeed JSON config.

Which framework takes which plan (precision "fp32_grads", bf16 weights with fp32 gradients):
  ZeRO-0/1   Megatron-LM (ZeRO-1 is ``--use-distributed-optimizer``: it shards the fp32 main
             weights and Adam's states over the data-parallel ranks, context-parallel ones
             included; the gradient buffer stays whole: 6 + 12/d bytes per parameter,
             Megatron-LM docs/source/api-guide/dist_optimizer.md).  Any dp, tp, cp, pp, v.
  ZeRO-2     pp = tp = cp = 1: DeepSpeed's ZeRO stage 2 (gradients reduce-scattered after every
             micro-batch's backward into their shard, weights all-gathered once per step).
             tp or cp > 1: torchtitan's FSDP2 with ``fsdp_reshard_after_forward = "never"``,
             which holds the whole bf16 weights from forward to backward and shards gradients
             and optimizer states: ZeRO-2's memory, but its weights are all-gathered again in
             every micro-batch's forward (the planner prices that, ``step_time``).
  ZeRO-3     pp = 1: torchtitan's FSDP2 (``data_parallel_shard_degree``), with TP and CP.
             HSDP (``Plan.shard``): torchtitan's ``data_parallel_replicate_degree`` = dp/shard with
             ``data_parallel_shard_degree`` = shard (torchtitan/config/configs.py: "If
             `data_parallel_replicate_degree` is also greater than 1, the parallelism method used
             is HSDP"), the mesh ("dp_replicate", "dp_shard", "cp", "tp") with FSDP over dp_shard·cp.
             torchtitan (torch's ``fully_shard``) all-reduces across the groups every micro-batch,
             as the planner prices it.  Megatron-LM runs HSDP as Megatron-FSDP (``--use-megatron-fsdp
             --data-parallel-sharding-strategy optim_grads_params --num-distributed-optimizer-instances
             R``), which all-reduces across the groups "during the last backward pass before the
             optimization step" (docs/user-guide/features/megatron_fsdp.md), and DeepSpeed as MiCS
             (``mics_shard_size``), also once per step (deepspeed/runtime/zero/mics.py,
             ``allreduce_mics_shard_grads``): neither is priced.  DeepSpeed's ZeRO++ hpZ
             (``zero_hpz_partition_size``) is not HSDP: beside ZeRO-3's partition over every rank it
             keeps a secondary copy of the weights sharded inside a node, for the backward's gather
             (docs/_tutorials/zeropp.md; deepspeed/runtime/zero/partition_parameters.py,
             ``ds_secondary_tensor``).
  torchtitan's TP with SP keeps the all-gathered inputs of its column-parallel projections
             (``sp_keeps_gathered``; Megatron-LM keeps its sequence shard and gathers again in backward),
             and its CP all-gathers K/V (``cp_method``): the planner prices each as that framework runs it.
  EP         a MoE model's expert parallelism (``Plan.ep``) as Megatron-LM runs it:
             ``--expert-model-parallel-size`` with ``--num-experts``, ``--moe-router-topk``,
             ``--moe-ffn-hidden-size``; the expert-parallel ranks are data-parallel ones and the
             experts' tensor parallelism is the plan's tp (``--expert-tensor-parallel-size``,
             default tp); ZeRO-0/1 (the distributed optimizer shards the experts' states over
             the expert-data-parallel ranks).  Megatron-LM, megatron/training/arguments.py and
             megatron/core/transformer/moe/README.md.

  EP all-to-all overlap (``Plan.ep_overlap``): Megatron-LM's ``--overlap-moe-expert-parallel-comm
             --delay-wgrad-compute`` (batch-level overlap: the forward and backward of adjacent
             micro-batches merged, megatron/core/transformer/moe/README.md), which asserts a virtual
             pipeline when pp > 1 and no full recomputation, uniform or block
             (megatron/core/transformer/transformer_config.py).  A plan that overlaps otherwise, as
             DeepSeek-V3's DualPipe with its recomputation did, runs on ``NOT_PUBLIC``: DeepSeek-AI's
             HAI-LLM (DeepSeek-AI 2024, §3.2), which is not public.  It prices the published DeepSeek-V3
             row only; ``planner.candidates`` never generates ``ep_overlap`` plans.
  DualPipe and FP8-cached activations (``Plan(schedule="dualpipe")``, ``Plan(act_cache="fp8")``):
             DeepSeek-V3's schedule and activation recipe (DeepSeek-AI 2024, §3.2.1, §3.3.2), run on
             ``NOT_PUBLIC`` too.  DeepSeek published DualPipe's schedule as code
             (github.com/deepseek-ai/DualPipe), not a training framework that runs it with the rest of the
             layout; the planner prices the published row only and never generates either.
  precision "bf16_moments" (Adam's moments in bf16): Megatron-LM's precision-aware distributed
             optimizer, ``--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``
             (megatron/training/arguments.py), priced with ZeRO-1 only.

What no framework runs (``unrunnable``):
  ZeRO-2/3 with pp > 1.  DeepSpeed's ``PipelineEngine`` asserts ``zero_optimization_stage() < 2``
        ("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism",
        deepspeed/runtime/pipe/engine.py); Megatron-LM's distributed optimizer is ZeRO-1;
        ``torch.distributed.pipelining`` (torch 2.13, pipelining/stage.py) runs every backward
        but the last with FSDP's ``set_requires_gradient_sync(False)`` and
        ``set_reshard_after_backward(False)``, reduce-scattering once after the last micro-batch,
        and torchtitan's default ``fsdp_reshard_after_forward`` keeps the weights gathered under
        PP: gradients and weights stay whole for the step, which is ZeRO-1's memory and traffic.
        Use zero=1.
  TP without sequence parallelism under FSDP (ZeRO-2/3, tp > 1): torchtitan's TP plan shards
        the norms' sequence (``SequenceParallel``) whenever TP is on.
  EP with ZeRO-2/3 is not priced: torchtitan runs FSDP with EP (``expert_parallel_degree``,
        which borrows its ranks from FSDP and TP: efsdp = dp_shard·cp·tp/ep,
        torchtitan/config/configs.py) and DeepSpeed-MoE runs EP with ZeRO
        (``deepspeed.moe.layer.MoE(ep_size=...)``), but the planner prices EP only as
        Megatron-LM runs it.  Use zero=1.
  TP without sequence parallelism under EP: Megatron-Core raises "When using expert
        parallelism and tensor parallelism, sequence parallelism must be used"
        (megatron/core/model_parallel_config.py).
  Block recomputation (``Plan.recompute_layers``, only K layers of each model chunk recomputed)
        as Megatron-LM runs it: ``--recompute-granularity full --recompute-method block
        --recompute-num-layers K`` (megatron/core/transformer/transformer_config.py: "block will
        recompute the input activations for only a set number of transformer layers per pipeline
        stage"; megatron/core/recompute.py checkpoints the first K layers of the block, one model
        chunk under interleaving): ZeRO-0/1.  torchtitan's every k-th layer is ``Plan.recompute_every``
        (below); DeepSpeed's (model code) is not priced.
  A recomputation mode its framework does not run (``RECOMPUTE_BY_FRAMEWORK``): torchtitan's op-level
        selective checkpointing (``Plan(recompute="op")``) and its every k-th layer
        (``Plan.recompute_every``) on a layout torchtitan does not run; Korthikanti's selective
        (``recompute="selective"``) on one torchtitan runs.
  precision "zero16" (ZeRO's 2 + 2 + 12 bytes) is DeepSpeed's accounting: DeepSpeed runs it
        with tp = cp = 1 (its own ``PipelineModule`` for pp > 1, ZeRO ≤ 1 there) and without
        interleaving (its pipeline schedule is plain 1F1B, deepspeed/runtime/pipe/schedule.py).
        Megatron-LM keeps fp32 main gradients (18 bytes per parameter) and torchtitan's FSDP
        reduces in fp32 too: with tp, cp or interleaving use precision "fp32_grads".

Which recomputation each framework runs (``RECOMPUTE_BY_FRAMEWORK``):
  Megatron-LM  "none"; "selective", Korthikanti et al. 2022 §4.1's: the core attention (QKᵀ, softmax,
             dropout, ×V) recomputed, ``--recompute-granularity selective`` with its default
             ``--recompute-modules core_attn`` (megatron/core/transformer/transformer_config.py,
             ``recompute_granularity``, ``recompute_modules``; with FlashAttention there are no scores to
             recompute and it equals "none"; the other modules it can recompute, the MLP or the norms
             among them, are not priced); "full" of every layer (``--recompute-method uniform``) or of
             K layers per chunk (``--recompute-method block``, ``Plan.recompute_layers``).
  torchtitan   "none"; "full", one ``checkpoint_wrapper`` per block (``mode = "full"``); "op", its
             op-level selective checkpointing (``mode = "selective"``, ``selective_ac_option = "op"``: every
             matmul's output saved but every second one, SDPA's and the reduce-scatters' saved, the rest
             recomputed; ``_custom_policy`` in torchtitan/parallelisms/parallelize_llama.py at 9dec370,
             torchtitan/distributed/activation_checkpoint.py ``SelectiveAC`` today; ``cost.op_sac_saved``);
             and every k-th block fully recomputed (``selective_ac_option = "k"``, ``Plan.recompute_every``;
             the same file at 9dec370, dropped from torchtitan in March 2026, pytorch/torchtitan#2357).
             Its "selective" is not Korthikanti's: no option recomputes the attention core alone.
  DeepSpeed    its checkpointing is the model's code: ``deepspeed.checkpointing.checkpoint`` around whatever
             the model wraps, a layer ("full") or the attention core ("selective").

The configurations give the parallel layout and batch only; the model's own fields (shape,
tokenizer, data, learning rate) are the user's.  Megatron-LM's uneven pipeline stages are
``--pipeline-model-parallel-layout`` (experimental in Megatron-Core: "E" the embedding,
"t" a decoder layer, "L" the loss, "|" between stages), used only when the stages are uneven.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from .. import cost

__all__ = ["Rule", "RULES", "FRAMEWORKS", "NOT_PUBLIC", "megatron_overlaps", "runs_on", "unrunnable", "configuration", "cp_method",
           "sp_keeps_gathered", "RECOMPUTE_BY_FRAMEWORK"]

FRAMEWORKS = ("Megatron-LM", "torchtitan", "DeepSpeed")
NOT_PUBLIC = "HAI-LLM (DeepSeek-AI's, not public)"  # runs a published row's plan; no configuration to print
#: The recomputation modes each framework runs, as ``Plan.recompute`` names them (the module docstring gives
#: each one's source); "full" includes Megatron-LM's block method (``recompute_layers``) and torchtitan's
#: every k-th layer (``recompute_every``).
RECOMPUTE_BY_FRAMEWORK = {"Megatron-LM": ("none", "selective", "full"), "torchtitan": ("none", "full", "op"),
                          "DeepSpeed": ("none", "selective", "full")}


@dataclass(frozen=True)
class Rule:
    """One thing no framework runs as the planner prices it: ``breaks(plan)`` is True for a plan that needs it."""

    name: str
    says: str  # what to do instead
    source: str

    def breaks(self, plan) -> bool:
        return _CHECKS[self.name](plan)


_CHECKS = {
    "sharded gradients under PP": lambda p: p.zero >= 2 and p.pp > 1,
    "FSDP's TP without SP": lambda p: p.precision == "fp32_grads" and p.zero >= 2 and p.tp > 1 and not p.sp,
    "EP with sharded gradients": lambda p: p.ep > 1 and p.zero >= 2,
    "EP's TP without SP": lambda p: p.ep > 1 and p.tp > 1 and not p.sp,
    "block recomputation beyond Megatron-LM": lambda p: p.recompute_layers > 0 and (p.zero >= 2
                                                                                  or p.precision == "zero16"),
    "zero16 beyond DeepSpeed": lambda p: p.precision == "zero16" and (p.tp > 1 or p.cp > 1 or p.v > 1
                                                                     or (p.pp > 1 and p.zero >= 2)),
    "bf16 moments beyond Megatron-LM": lambda p: p.precision == "bf16_moments" and p.zero != 1,
    "HSDP beyond torchtitan": lambda p: p.shard > 0 and p.precision != "fp32_grads",
    "torchtitan's checkpointing beyond torchtitan": lambda p: (p.recompute == "op" or p.recompute_every > 0)
    and not _torchtitan_layout(p),
    "Korthikanti's selective on torchtitan": lambda p: p.recompute == "selective" and _torchtitan_layout(p),
}

RULES = (
    Rule("sharded gradients under PP",
         "ZeRO-{zero} with pp={pp}: no framework shards gradients under pipeline parallelism. DeepSpeed's "
         "pipeline engine refuses ZeRO-2/3, Megatron-LM's distributed optimizer is ZeRO-1, and torch's "
         "pipelining keeps FSDP's gradients (and torchtitan's gathered weights) whole until the last "
         "micro-batch, which is ZeRO-1's memory and bytes: use zero=1",
         "deepspeed/runtime/pipe/engine.py (assert zero stage < 2); torch/distributed/pipelining/stage.py "
         "(set_requires_gradient_sync(False) until the last backward); Megatron-LM dist_optimizer.md"),
    Rule("FSDP's TP without SP",
         "tp={tp} with sp=False under ZeRO-{zero}: torchtitan, which runs FSDP with TP, always adds "
         "sequence parallelism to its TP plan: use sp=True (or ZeRO-1 on Megatron-LM)",
         "torchtitan models/llama3/infra/parallelize.py (apply_tp: SequenceParallel on the norms)"),
    Rule("EP with sharded gradients",
         "ep={ep} with ZeRO-{zero}: the planner prices expert parallelism as Megatron-LM runs it, with ZeRO-0/1 "
         "(torchtitan's FSDP with expert_parallel_degree and DeepSpeed-MoE's EP with ZeRO are not modelled): "
         "use zero=1",
         "torchtitan/config/configs.py (expert_parallel_degree: efsdp = dp_shard*cp*tp/ep); deepspeed/moe/layer.py "
         "(MoE(ep_size=...)); Megatron-LM megatron/core/transformer/moe/README.md (EP with the distributed optimizer)"),
    Rule("EP's TP without SP",
         "ep={ep} and tp={tp} with sp=False: Megatron-LM needs sequence parallelism when expert and tensor "
         "parallelism are both on: use sp=True",
         "megatron/core/model_parallel_config.py (\"When using expert parallelism and tensor parallelism, "
         "sequence parallelism must be used\")"),
    Rule("block recomputation beyond Megatron-LM",
         "recompute_layers with ZeRO-{zero} (or precision \"zero16\"): the planner prices recomputing only some "
         "layers as Megatron-LM's --recompute-method block runs it, with ZeRO-0/1 and fp32 gradients "
         "(torchtitan's every k-th layer is recompute_every; DeepSpeed's is not modelled): use zero=1, or "
         "recompute_layers=0",
         "megatron/core/transformer/transformer_config.py (recompute_method 'block', recompute_num_layers); "
         "megatron/core/recompute.py (the first recompute_num_layers layers of the block checkpointed)"),
    Rule("zero16 beyond DeepSpeed",
         "precision \"zero16\" (ZeRO's 2 + 2 + 12 bytes) is DeepSpeed's, which runs it without TP, CP or "
         "interleaving and with ZeRO <= 1 under its pipeline: use precision \"fp32_grads\" "
         "(Megatron-LM and torchtitan keep fp32 gradients)",
         "deepspeed/runtime/pipe/engine.py, deepspeed/runtime/pipe/schedule.py (TrainSchedule, plain 1F1B)"),
    Rule("bf16 moments beyond Megatron-LM",
         "precision \"bf16_moments\" with ZeRO-{zero}: the planner prices Adam's moments in bf16 as "
         "Megatron-LM's precision-aware distributed optimizer runs them, with ZeRO-1: use zero=1",
         "megatron/training/arguments.py (--use-precision-aware-optimizer, --exp-avg-dtype, --exp-avg-sq-dtype); "
         "DeepSeek-AI 2024 §3.3.3"),
    Rule("HSDP beyond torchtitan",
         "shard={shard} (HSDP) with precision \"{precision}\": the planner prices HSDP as torchtitan runs it, with "
         "fp32 gradient reductions over both axes every micro-batch (DeepSpeed's MiCS, mics_shard_size, "
         "all-reduces across its groups once per step and is not priced): use precision \"fp32_grads\"",
         "torchtitan/config/configs.py (data_parallel_replicate_degree, data_parallel_shard_degree); "
         "deepspeed/runtime/zero/mics.py (allreduce_mics_shard_grads at the accumulation boundary)"),
    Rule("torchtitan's checkpointing beyond torchtitan",
         "recompute=\"{recompute}\" with recompute_every={recompute_every}: op-level selective checkpointing and "
         "every k-th layer recomputed are torchtitan's (selective_ac_option \"op\" or \"k\"), which the planner "
         "prices on the layouts torchtitan runs (FSDP, ZeRO-2/3, pp = 1; here ZeRO-{zero}, pp={pp}): use "
         "recompute=\"full\" (with recompute_layers for Megatron-LM's block method), or a torchtitan layout",
         "torchtitan/parallelisms/parallelize_llama.py at 9dec370 (_apply_ac_to_transformer_block: "
         "_custom_policy, selective_ac_option); Megatron-LM megatron/core/transformer/transformer_config.py "
         "(recompute_granularity 'full' or 'selective' with recompute_modules: modules, no op-level policy)"),
    Rule("Korthikanti's selective on torchtitan",
         "recompute=\"selective\" (Korthikanti's: the attention core alone) on a torchtitan layout (ZeRO-{zero}): "
         "torchtitan's selective checkpointing is op-level (recompute=\"op\") or every k-th layer "
         "(recompute_every); it has no attention-core mode. Use recompute=\"op\", \"full\" or \"none\", or "
         "ZeRO-1 on Megatron-LM",
         "torchtitan/parallelisms/parallelize_llama.py at 9dec370 (valid modes 'full' and 'selective' with "
         "selective_ac_option 'op' or an int); Korthikanti et al. 2022 §4.1"),
)


def unrunnable(plan) -> list[str]:
    """The rule each framework breaks for ``plan``, in words with what to use instead; [] if one runs it."""
    fields = dict(zero=plan.zero, pp=plan.pp, tp=plan.tp, ep=plan.ep, shard=plan.shard,
                  precision=plan.precision, recompute=plan.recompute, recompute_every=plan.recompute_every)
    return [rule.says.format(**fields) for rule in RULES if rule.breaks(plan)]


def megatron_overlaps(plan) -> bool:
    """Whether Megatron-LM's ``--overlap-moe-expert-parallel-comm`` runs ``plan``'s all-to-all overlap: it
    asserts a virtual pipeline under pp > 1 and no full recomputation (transformer_config.py)."""
    return plan.ep_overlap and (plan.pp == 1 or plan.v > 1) and plan.recompute != "full"


def runs_on(plan) -> str:
    """The framework whose configuration runs ``plan`` as the planner prices it."""
    found = unrunnable(plan)
    if found:
        raise ValueError("no framework runs this plan: " + "; ".join(found))
    if (plan.ep_overlap and not megatron_overlaps(plan)) or plan.schedule == "dualpipe" or plan.act_cache == "fp8":
        return NOT_PUBLIC
    if plan.precision == "zero16":
        return "DeepSpeed"
    if _torchtitan_layout(plan):
        return "torchtitan"
    return "DeepSpeed" if plan.zero == 2 else "Megatron-LM"


def _torchtitan_layout(plan) -> bool:
    """Whether ``runs_on`` gives ``plan`` to torchtitan: FSDP (ZeRO-2/3) with fp32 gradients, pp = 1, no EP,
    and not DeepSpeed's ZeRO-2 without TP or CP.  Unlike ``runs_on`` it does not raise for a plan no
    framework runs (the planner prices those too, to say why they do not fit): ZeRO-2/3 under PP is no
    torchtitan layout (``unrunnable``), and is priced with Megatron-LM's rules."""
    return (plan.precision == "fp32_grads" and plan.zero >= 2 and plan.ep == 1 and plan.pp == 1
            and not (plan.zero == 2 and plan.tp == plan.cp == 1))


def sp_keeps_gathered(plan) -> bool:
    """Whether the plan's framework keeps the all-gathered, full-sequence inputs of its column-parallel
    projections for their weight gradients (``cost.activation_bytes_per_layer(sp_gathered=True)``).

    torchtitan (tp > 1 with SP): its Llama plan (torchtitan/models/llama3/infra/parallelize.py at 238fa9953,
    ``apply_tp``) runs ``SequenceParallel()`` on ``attention_norm`` and ``ffn_norm``, then
    ``prepare_module_input(input_layouts=(Shard(1), ...), desired_input_layouts=(Replicate(), ...))`` on
    ``attention`` and ``feed_forward``: the gathered input is a tensor the colwise ``wq``/``wk``/``wv`` and
    ``w1``/``w3`` read, and autograd keeps it for their weight gradients.  Its block input stays
    ``Shard(1)`` (``wo`` and ``w2`` are rowwise with ``output_layouts=Shard(1)``), so its "full"
    checkpointing (one ``checkpoint_wrapper`` per block) keeps the sequence shard, as Megatron-LM's does.
    Megatron-LM: False; its column-parallel linear saves the sequence shard and all-gathers it again in
    backward (megatron/core/tensor_parallel/layers.py, ``LinearWithGradAccumulationAndAsyncCommunication``;
    Korthikanti et al. 2022, §4.2.2), the variant lab 03 teaches as Megatron's."""
    return plan.tp > 1 and plan.sp and _torchtitan_layout(plan)


def cp_method(plan) -> str:
    """How the plan's framework passes K and V under context parallelism (``plan.cp > 1``):
    "ring" on Megatron-LM (``--cp-comm-type p2p``, its default: TransformerEngine's
    ``AttnFuncWithCPAndKVP2P``, ``cost.cp_comm_elems_per_layer(reverse_backward=True)``);
    "all_gather" on torchtitan, whose ``context_parallel`` all-gathers K/V by default (torch 2.13,
    ``set_rotate_method("allgather")``), gathers them again in backward and passes dK/dV round the ring
    (``cost.cp_allgather_elems_per_layer(implementation="torch")``).  DeepSpeed's plans here have
    cp = 1: its sequence parallelism is Ulysses' all-to-all over heads (``cost.cp_alltoall_elems_per_layer``),
    which the planner does not search."""
    return "all_gather" if plan.cp > 1 and _torchtitan_layout(plan) else "ring"


def _layout(layers: tuple) -> str:
    """Megatron-Core's --pipeline-model-parallel-layout for these layers per stage."""
    parts = [("E" if r == 0 else "") + f"t*{n}" + ("L" if r == len(layers) - 1 else "")
             for r, n in enumerate(layers)]
    return "|".join(parts)


def _megatron(plan, work, layers) -> str:
    m = work.model
    args = [f"--tensor-model-parallel-size {plan.tp}", f"--pipeline-model-parallel-size {plan.pp}",
            f"--context-parallel-size {plan.cp}", f"--micro-batch-size {plan.micro_batch}",
            f"--global-batch-size {work.global_batch}", f"--seq-length {m.seq}",
            f"--num-layers {m.layers}", f"--hidden-size {m.hidden}", f"--num-attention-heads {m.heads}",
            f"--ffn-hidden-size {m.ffn_width}", "--bf16"]
    if m.kv != m.heads:
        args.append(f"--group-query-attention --num-query-groups {m.kv}")
    if m.experts:
        args.append(f"--num-experts {m.experts} --moe-router-topk {m.top_k} --moe-ffn-hidden-size {m.expert_ffn}")
        if m.shared_experts:
            args.append(f"--moe-shared-expert-intermediate-size {m.shared_experts * m.expert_ffn}")
        if m.moe_layer_count < m.layers:  # dense layers first, as DeepSeek-V3's
            args.append(f"--moe-layer-freq \"([0]*{m.layers - m.moe_layer_count}+[1]*{m.moe_layer_count})\"")
        if m.capacity:
            args.append(f"--moe-expert-capacity-factor {m.capacity:g}")
        args.append(f"--expert-model-parallel-size {plan.ep} --moe-grouped-gemm")
        if plan.ep_overlap:
            args.append("--overlap-moe-expert-parallel-comm --delay-wgrad-compute")
    if plan.sp and plan.tp > 1:
        args.append("--sequence-parallel")
    if plan.cp > 1:
        args.append("--cp-comm-type p2p")
    if plan.v > 1:
        args.append(f"--num-layers-per-virtual-pipeline-stage {m.layers // (plan.pp * plan.v)}")
    if len(set(layers)) > 1:
        args.append(f"--pipeline-model-parallel-layout \"{_layout(layers)}\"")
    if plan.zero == 1:
        args.append("--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather")
        if plan.precision == "bf16_moments":
            args.append("--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16")
    elif plan.dp * plan.cp > 1:
        args.append("--overlap-grad-reduce")
    if plan.recompute == "full" and plan.recompute_layers:
        args.append(f"--recompute-granularity full --recompute-method block "
                    f"--recompute-num-layers {plan.recompute_layers}")
    elif plan.recompute == "full":
        args.append("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1")
    elif plan.recompute == "selective":
        args.append("--recompute-granularity selective")
    return "# Megatron-LM (pretrain_gpt.py) arguments\n" + " \\\n".join(args)


def _torchtitan(plan, work) -> str:
    reshard = "never" if plan.zero == 2 else "default"
    shard = plan.shard or plan.dp  # HSDP: replicate dp/shard copies of a shard group
    lines = ["# torchtitan job config (TOML)", "[parallelism]",
             f"data_parallel_replicate_degree = {plan.dp // shard}", f"data_parallel_shard_degree = {shard}",
             f"fsdp_reshard_after_forward = \"{reshard}\"", f"tensor_parallel_degree = {plan.tp}",
             f"context_parallel_degree = {plan.cp}", "pipeline_parallel_degree = 1",
             "context_parallel_rotate_method = \"allgather\"", "",
             "[training]", f"local_batch_size = {plan.micro_batch}",
             f"global_batch_size = {work.global_batch}", f"seq_len = {work.model.seq}",
             "mixed_precision_param = \"bfloat16\"", "mixed_precision_reduce = \"float32\"", "",
             "[activation_checkpoint]"]
    if plan.recompute == "op":
        lines += ["mode = \"selective\"", "selective_ac_option = \"op\""]
    elif plan.recompute_every:
        lines += ["mode = \"selective\"", f"selective_ac_option = \"{plan.recompute_every}\""]
    else:
        lines.append(f"mode = \"{plan.recompute}\"")
    return "\n".join(lines)


def _deepspeed(plan, work) -> str:
    config = {"train_batch_size": work.global_batch, "train_micro_batch_size_per_gpu": plan.micro_batch,
              "gradient_accumulation_steps": plan.accum, "bf16": {"enabled": True},
              "zero_optimization": {"stage": plan.zero, "overlap_comm": True}}
    if plan.precision == "fp32_grads":
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    notes = []
    if plan.pp > 1:
        notes.append(f"# the model as deepspeed.pipe.PipelineModule(layers, num_stages={plan.pp})")
    if plan.recompute != "none":
        notes.append("# recomputation: each layer through deepspeed.checkpointing.checkpoint (model code)")
    return "\n".join(["# DeepSpeed config (JSON)"] + notes + [json.dumps(config, indent=2)])


def configuration(plan, work) -> str:
    """The configuration that runs ``plan`` for ``work`` in ``runs_on(plan)``'s framework, as text."""
    framework = runs_on(plan)
    if framework == NOT_PUBLIC:
        return (f"# {NOT_PUBLIC}: no public configuration. Megatron-LM's all-to-all overlap needs a virtual "
                "pipeline under pp > 1 and no full recomputation (megatron/core/transformer/transformer_config.py); "
                "DualPipe and FP8-cached activations are DeepSeek-V3's own (DeepSeek-AI 2024, §3.2.1, §3.3.2)")
    if framework == "Megatron-LM":
        return _megatron(plan, work, plan.stages or cost.stage_sizes(work.model.layers, plan.pp))
    if framework == "torchtitan":
        return _torchtitan(plan, work)
    return _deepspeed(plan, work)
