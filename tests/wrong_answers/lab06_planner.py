"""Answers to Lab 06's planner exercises: right ones written differently, and typical wrong ones.

Two of the four tables of tests/answer_suite.py: ``CORRECT`` maps each exercise
to answers that must pass; ``WRONG`` maps it to (fixture, words the check's
message must contain), and each must fail the hidden cases too.  The wrong planners
share one search (``_search``) with the single mistake their name says.
tests/unit/test_lab06_planner.py grades them all in one batch.
"""
import itertools
from dataclasses import replace

from parlab import cost, planner, planner_frameworks
from parlab.planner import Plan
from wrong_answers import says


# ------------------------------------------------------------ memory_per_gpu
def _stage(plan, model, r, held=None, logits=True, tp_acts=None, precision=None, working=True, tie=True,
           tied_once=False):
    layers = planner.stage_layers(plan, model)
    n = layers[r]
    params = n * model.layer_params
    if r == 0:
        params += model.vocab * model.hidden
    if r == plan.pp - 1 and (not (model.tied and tie) or plan.pp > 1 and not tied_once):
        params += model.vocab * model.hidden
    states = cost.model_state_bytes(params / plan.tp, plan.dp * plan.cp, plan.zero,
                                    precision or plan.precision)

    def act(mode):
        return cost.activation_bytes_per_layer(model.seq / plan.cp, plan.micro_batch, model.hidden,
                                               model.heads, t=plan.tp if tp_acts is None else tp_acts,
                                               sp=plan.sp, recompute=mode, scores=model.scores,
                                               sp_gathered=planner_frameworks.sp_keeps_gathered(plan),
                                               **model.shape)
    if held is None:
        held = (cost.activations_held(plan.pp, plan.accum, "interleaved", rank=r, v=plan.v) if plan.v > 1
                else cost.activations_held(plan.pp, plan.accum, "1f1b", rank=r))
    acts = act(plan.recompute) * n * held
    if working and plan.recompute == "full":
        acts += act("none")
    elif working and plan.recompute == "selective" and model.scores:
        acts += act("none") - act("selective")
    if logits and r == plan.pp - 1:
        acts += 4 * plan.micro_batch * model.seq / plan.cp * model.vocab / plan.tp
    return states + acts


def memory(plan, model):
    return max(_stage(plan, model, r) for r in range(plan.pp))


def memory_by_hand(plan, model):
    """The same model written out: bytes per parameter with ZeRO's divisions, Korthikanti's table
    (the 5as/h term only when scores are stored; with dropout off 2as/h), 1F1B's in-flight count,
    per stage; a tied output layer counted once on a single stage."""
    w, g, o = {"zero16": (2, 2, 12), "fp32_grads": (2, 4, 12)}[plan.precision]
    d = plan.dp * plan.cp
    per_stage = [model.layers // plan.pp + (1 if r < model.layers % plan.pp else 0) for r in range(plan.pp)]
    if plan.stages:
        per_stage = list(plan.stages)
    s, b, h, t, V = model.seq / plan.cp, plan.micro_batch, model.hidden, plan.tp, model.vocab
    ffn = model.ffn or 4 * h
    kv = model.kv_heads or model.heads
    # Q, K and V (K, V narrower under GQA), attention output, the MLP's 2 (or SwiGLU's 3) ffn-wide tensors
    split = 2 + 4 * kv / model.heads + 2 + (6 if model.gated else 4) * ffn / h
    unsplit = 8 + (2 if model.dropout else 0)  # norm inputs, attention and MLP inputs, dropout masks
    scores = s * b * h * (5 if model.dropout else 2) * model.heads * s / h / t if model.scores else 0.0
    nothing_kept = s * b * h * ((unsplit + split) / t if plan.sp else unsplit + split / t) + scores
    if planner_frameworks.sp_keeps_gathered(plan):  # torchtitan's SP keeps attention's and the MLP's inputs whole
        nothing_kept += 4 * s * b * h * (1 - 1 / t)
    if plan.recompute == "full":
        layer, working = 2 * s * b * h / (t if plan.sp else 1), nothing_kept
    elif plan.recompute == "selective":  # the scores recomputed: one layer's of them at a time
        layer, working = nothing_kept - scores, scores
    else:
        layer, working = nothing_kept, 0.0
    embeddings = 1 if model.tied else 2
    worst = 0.0
    for r, n in enumerate(per_stage):
        output = r == plan.pp - 1 and (not model.tied or plan.pp > 1)  # tied, one stage: one matrix
        psi = (n * (model.params - embeddings * V * h) / model.layers + V * h * ((r == 0) + output)) / t
        states = psi * (w / (d if plan.zero == 3 else 1) + g / (d if plan.zero >= 2 else 1)
                        + o / (d if plan.zero >= 1 else 1))
        if plan.v == 1:
            inflight = min(plan.accum, plan.pp - r)
        else:
            inflight = cost.activations_held(plan.pp, plan.accum, "interleaved", rank=r, v=plan.v)
        acts = layer * n * inflight + working
        acts += 4 * b * s * V / t if r == plan.pp - 1 else 0
        worst = max(worst, states + acts)
    return worst


def memory_no_activations(plan, model):
    return max(_stage(plan, model, r, held=0, logits=False, working=False) for r in range(plan.pp))


def memory_no_optimizer(plan, model):
    r = max(range(plan.pp), key=lambda r: _stage(plan, model, r))
    params = planner.stage_layers(plan, model)[r] * model.layer_params + model.vocab * model.hidden * (
        (r == 0) + (r == plan.pp - 1 and (not model.tied or plan.pp > 1)))
    return memory(plan, model) - 12 * params / plan.tp / (plan.dp * plan.cp if plan.zero else 1)


def memory_all_microbatches(plan, model):
    return max(_stage(plan, model, r, held=plan.accum) for r in range(plan.pp))


def memory_tp_ignored_in_activations(plan, model):
    return max(_stage(plan, model, r, tp_acts=1) for r in range(plan.pp))


def memory_stage0_only(plan, model):
    return _stage(plan, model, 0)


def memory_no_logits(plan, model):
    return max(_stage(plan, model, r, logits=False) for r in range(plan.pp))


def memory_zero16_always(plan, model):
    return max(_stage(plan, model, r, precision="zero16") for r in range(plan.pp))


def memory_output_layer_untied(plan, model):
    """Counts the output layer on its own even when it is the (tied) embedding on one stage."""
    return max(_stage(plan, model, r, tie=False) for r in range(plan.pp))


def memory_activations_one_sequence(plan, model):
    """Activations of one sequence per micro-batch: micro_batch left out of activation_bytes_per_layer
    (the logits keep it)."""
    one = replace(plan, micro_batch=1)
    logits = 4 * plan.micro_batch * model.seq / plan.cp * model.vocab / plan.tp
    return max(_stage(one, model, r, logits=False) + (logits if r == plan.pp - 1 else 0) for r in range(plan.pp))


def memory_tied_counted_once(plan, model):
    """A tied model's embedding counted once, on the first stage, even when pp > 1 gives the last
    stage its own copy."""
    return max(_stage(plan, model, r, tied_once=True) for r in range(plan.pp))


def choose_ignores_logits(work):
    return _search(work, mem=memory_no_logits)


def memory_selective_no_working_set(plan, model):
    """Leaves out the working set of the layer whose attention selective recomputation redoes."""
    return max(_stage(plan, model, r, working=plan.recompute != "selective") for r in range(plan.pp))


def memory_ignores_zero(plan, model):
    """Every GPU keeps all of its stage's model states, whatever plan.zero says."""
    return max(_stage(replace(plan, zero=0), model, r) for r in range(plan.pp))


def memory_calls_the_reference(plan, model):
    return planner.memory_per_gpu(plan, model)


def memory_in_gb(plan, model):
    return memory(plan, model) / 1e9


# ------------------------------------------------------------ choose
def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def _why(plan):
    return {"dp": f"dp={plan.dp}", "tp": f"tp={plan.tp}", "pp": f"pp={plan.pp}", "zero": f"ZeRO-{plan.zero}"}


def _search(work, mem=memory, tp_in_node=True, check_memory=True, recompute=("none", "full"),
            zeros=(0, 1, 2, 3), sizes=_divisors, explain=_why, headroom=True, rows=True, cps=True,
            runnable=True):
    m, c = work.model, work.cluster
    cap = c.usable_memory if headroom else c.memory
    modes = tuple(recompute) + (("selective",) if m.scores and "none" in recompute else ())
    best, best_time = None, float("inf")
    for tp in sizes(c.gpus):
        if tp_in_node and (tp > c.gpus_per_node or c.gpus_per_node % tp) or m.heads % tp \
                or (m.kv % tp and tp % m.kv):
            continue
        for cp in sizes(c.gpus // tp):
            if cp > 1 and (not cps or m.seq < planner.CP_FROM or cp > 16 or m.seq // cp < 2048
                           or m.seq % (2 * cp)):
                continue
            for pp in sizes(c.gpus // (tp * cp)):
                dp = c.gpus // (tp * cp * pp)
                if pp > m.layers or work.global_batch % dp:
                    continue
                per_replica = work.global_batch // dp
                for mb in sizes(per_replica if rows else work.global_batch):
                    accum = max(1, per_replica // mb)
                    vs = [1] + [v for v in (2, 4) if pp > 1 and m.layers % (pp * v) == 0 and accum % pp == 0]
                    for v in vs:
                        for zero in (zeros if dp * cp > 1 else (0,)):
                            if runnable and zero >= 2 and pp > 1:  # no framework shards grads under PP
                                continue
                            for rc in modes:
                                plan = Plan(dp=dp, tp=tp, pp=pp, cp=cp, zero=zero, micro_batch=mb,
                                            accum=accum, recompute=rc, v=v, precision=work.precision)
                                if check_memory and mem(plan, m) > cap:
                                    continue
                                t = planner.step_time(plan, work)["total"]
                                if t < best_time * (1 - 1e-12):
                                    best, best_time = plan, t
    if best is None:
        return None
    return replace(best, why=explain(best))


def choose(work):
    return _search(work)


def choose_with_product(work):
    """A different shape: every combination from itertools.product, the fastest by tokens per second."""
    m, c, batch = work.model, work.cluster, work.global_batch
    options = []
    node = c.gpus_per_node
    modes = ("none", "selective", "full") if m.scores else ("none", "full")
    for tp, cp, pp in itertools.product(range(1, node + 1), (1, 2, 4, 8, 16), range(1, m.layers + 1)):
        if c.gpus % (tp * cp * pp) or node % tp or m.heads % tp or (m.kv % tp and tp % m.kv):
            continue
        if cp > 1 and (m.seq < 16384 or m.seq // cp < 2048 or m.seq % (2 * cp)):
            continue
        dp = c.gpus // (tp * cp * pp)
        if batch % dp:
            continue
        rows = batch // dp
        sizes = [mb for mb in range(1, rows + 1) if rows % mb == 0]
        for mb, zero, rc, v in itertools.product(sizes, range(4), modes, (1, 2, 4)):
            accum = rows // mb
            if (zero and dp * cp == 1) or (v > 1 and (pp == 1 or m.layers % (pp * v) or accum % pp)) \
                    or (zero >= 2 and pp > 1):
                continue
            plan = Plan(dp, tp, pp, zero, mb, accum, rc, cp=cp, v=v, precision=work.precision)
            if memory_by_hand(plan, m) <= c.memory * c.headroom:
                options.append(plan)
    if not options:
        return None
    fastest = max(options, key=lambda p: (batch * m.seq / planner.step_time(p, work)["total"]))
    why = {"dp": "replicas: the GPUs left over", "tp": "inside a node", "pp": "stages of whole layers",
           "zero": "the sharding that is fastest"}
    return replace(fastest, why=why)


def choose_ignores_activations(work):
    return _search(work, mem=memory_no_activations)


def choose_ignores_optimizer(work):
    return _search(work, mem=memory_no_optimizer)


def choose_tp_across_nodes(work):
    return _search(work, tp_in_node=False)


def choose_never_checks_memory(work):
    return _search(work, check_memory=False)


def choose_ignores_headroom(work):
    return _search(work, headroom=False)


def choose_no_recompute(work):
    return _search(work, recompute=("none",))


def choose_no_context_parallel(work):
    return _search(work, cps=False)


def choose_shards_gradients_under_pp(work):
    """ZeRO-2/3 with pipeline parallelism, which no framework runs (planner_frameworks)."""
    return _search(work, runnable=False)


def choose_rounds_accum_down(work):
    """Issue 20, contract 10: micro-batches that divide the global batch, accumulation rounded down."""
    return _search(work, rows=False)


def choose_plan_even_if_nothing_fits(work):
    plan = _search(work)
    return plan or Plan(dp=work.cluster.gpus, tp=1, pp=1, zero=3, micro_batch=1,
                        accum=max(1, work.global_batch // work.cluster.gpus), why=_why(
                            Plan(work.cluster.gpus, 1, 1, 3)))


def choose_calls_search(work):
    found = planner.search(work)
    return found.plan if found else None


def choose_without_reasons(work):
    return _search(work, explain=lambda plan: {"dp": f"dp={plan.dp}"})


CORRECT = {
    "memory": [memory, memory_by_hand],
    "choose": [choose, choose_with_product],
}

WRONG = {
    "memory": [(memory_no_activations, "activations are missing"),
               (memory_no_optimizer, "optimizer states"),
               (memory_all_microbatches, "min(accum, pp - r)"),
               (memory_tp_ignored_in_activations, "t=tp"),
               (memory_stage0_only, "not always stage 0"),
               (memory_no_logits, "fp32 logits"),
               (memory_zero16_always, "plan.precision"),
               (memory_in_gb, "not GB"),
               (memory_ignores_zero, "That is ZeRO-0's model-state memory"),
               (memory_output_layer_untied, "model.tied"),
               (memory_tied_counted_once, says("the last stage keeps its own copy", never="so a single stage")),
               (memory_activations_one_sequence, ("Doubling model.seq and plan.micro_batch",
                                                  "the term that is wrong is the activations")),
               (memory_selective_no_working_set, "Under selective recomputation"),
               (memory_calls_the_reference, "planner.memory_per_gpu")],
    "choose": [(choose_ignores_activations, "Without the activations"),
               (choose_ignores_optimizer, "Without the optimizer states"),
               (choose_tp_across_nodes, "inside a node"),
               (choose_never_checks_memory, "over the 72 GB"),
               # its plan fits without the activations, or the optimizer states, or in all of the HBM:
               # the one case it fails cannot tell these apart
               (choose_ignores_headroom, says("Leaving out any one of", "comparing with all of the HBM",
                                              never=("Without the", "It fits in the"), differs=True)),
               # its one failing case is also what leaving out the optimizer states or the headroom picks
               (choose_ignores_logits, says("Leaving out any one of", "the last stage's fp32 logits (",
                                            never=("Without the", "It fits in the"), differs=True)),
               (choose_no_recompute, 'recompute="full"'),
               (choose_no_context_parallel, "cp="),
               (choose_rounds_accum_down, "fewer than the global batch"),
               (choose_shards_gradients_under_pp, "no framework shards gradients under pipeline"),
               (choose_plan_even_if_nothing_fits, "Return None when nothing fits"),
               (choose_calls_search, "planner.search"),
               (choose_without_reasons, "no line for tp, pp, zero")],
}
