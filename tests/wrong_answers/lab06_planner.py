"""Answers to Lab 06's planner exercises: right ones written differently, and typical wrong ones.

``CORRECT`` maps each exercise to answers that must pass; ``WRONG`` maps it
to (fixture, words the check's message must contain).  The wrong planners
share one search (``_search``) with the single mistake their name says.
tests/test_lab06_planner.py grades them all in one batch.
"""
import itertools

from parlab import cost, planner
from parlab.planner import Plan


# ------------------------------------------------------------ memory_per_gpu
def memory(plan, model):
    shard = model.params / (plan.tp * plan.pp)
    states = cost.zero_memory_per_gpu(shard, plan.dp, plan.zero)
    per_layer = cost.activation_bytes_per_layer(model.seq, plan.micro_batch, model.hidden, model.heads,
                                                t=plan.tp, recompute=plan.recompute)
    held = cost.activations_held(plan.pp, plan.accum, "1f1b")
    return states + per_layer * (model.layers // plan.pp) * held


def memory_by_hand(plan, model):
    """The same model written out: 2 + 2 + 12 bytes with ZeRO's divisions, Korthikanti's table."""
    psi = model.params / plan.tp / plan.pp
    weights = 2 * psi / (plan.dp if plan.zero == 3 else 1)
    grads = 2 * psi / (plan.dp if plan.zero >= 2 else 1)
    adam = 12 * psi / (plan.dp if plan.zero >= 1 else 1)
    s, b, h, a, t = model.seq, plan.micro_batch, model.hidden, model.heads, plan.tp
    layer = 2 * s * b * h if plan.recompute else s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    return weights + grads + adam + layer * model.layers / plan.pp * min(plan.accum, plan.pp)


def memory_no_activations(plan, model):
    return cost.zero_memory_per_gpu(model.params / (plan.tp * plan.pp), plan.dp, plan.zero)


def memory_no_optimizer(plan, model):
    return memory(plan, model) - 12 * model.params / (plan.tp * plan.pp) / (plan.dp if plan.zero else 1)


def memory_all_microbatches(plan, model):
    per_layer = cost.activation_bytes_per_layer(model.seq, plan.micro_batch, model.hidden, model.heads,
                                                t=plan.tp, recompute=plan.recompute)
    return memory_no_activations(plan, model) + per_layer * model.layers / plan.pp * plan.accum


def memory_tp_ignored_in_activations(plan, model):
    per_layer = cost.activation_bytes_per_layer(model.seq, plan.micro_batch, model.hidden, model.heads,
                                                recompute=plan.recompute)
    return memory_no_activations(plan, model) + per_layer * model.layers / plan.pp * min(plan.accum, plan.pp)


def memory_in_gb(plan, model):
    return memory(plan, model) / 1e9


# ------------------------------------------------------------ choose
def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def _why(plan):
    return {"dp": f"dp={plan.dp}", "tp": f"tp={plan.tp}", "pp": f"pp={plan.pp}", "zero": f"ZeRO-{plan.zero}"}


def _search(work, mem=memory, tp_in_node=True, check_memory=True, recompute=(False, True),
            zeros=(0, 1, 2, 3), sizes=_divisors, explain=_why):
    m, c = work.model, work.cluster
    best, best_time = None, float("inf")
    for tp in sizes(c.gpus):
        if tp_in_node and (tp > c.gpus_per_node or c.gpus_per_node % tp) or m.heads % tp:
            continue
        for pp in sizes(c.gpus // tp):
            dp = c.gpus // (tp * pp)
            if m.layers % pp or work.global_batch % dp:
                continue
            for mb in sizes(work.global_batch // dp):
                for zero in zeros:
                    for rc in recompute:
                        plan = Plan(dp=dp, tp=tp, pp=pp, zero=zero, micro_batch=mb,
                                    accum=work.global_batch // (dp * mb), recompute=rc)
                        if check_memory and mem(plan, m) > c.memory:
                            continue
                        t = planner.step_time(plan, work)["total"]
                        if t < best_time:
                            best, best_time = plan, t
    if best is None:
        return None
    return Plan(**{k: getattr(best, k) for k in ("dp", "tp", "pp", "zero", "micro_batch", "accum",
                                                 "recompute")}, why=explain(best))


def choose(work):
    return _search(work)


def choose_with_product(work):
    """A different shape: every combination from itertools.product, the best by a key."""
    m, c, batch = work.model, work.cluster, work.global_batch
    options = []
    for tp, pp in itertools.product(range(1, c.gpus_per_node + 1), range(1, m.layers + 1)):
        if c.gpus % (tp * pp) or c.gpus_per_node % tp or m.heads % tp or m.layers % pp:
            continue
        dp = c.gpus // (tp * pp)
        if batch % dp:
            continue
        sizes = [mb for mb in range(1, batch // dp + 1) if batch // dp % mb == 0]
        for mb, zero, rc in itertools.product(sizes, range(4), (True, False)):
            plan = Plan(dp, tp, pp, zero, mb, batch // (dp * mb), rc)
            if memory_by_hand(plan, m) <= c.memory:
                options.append(plan)
    if not options:
        return None
    fastest = min(options, key=lambda p: planner.step_time(p, work)["total"])
    why = {"dp": "replicas: the GPUs left over", "tp": "inside a node", "pp": "stages of whole layers",
           "zero": "as little sharding as fits"}
    return Plan(fastest.dp, fastest.tp, fastest.pp, fastest.zero, fastest.micro_batch, fastest.accum,
                fastest.recompute, why=why)


def choose_ignores_activations(work):
    return _search(work, mem=memory_no_activations)


def choose_ignores_optimizer(work):
    return _search(work, mem=memory_no_optimizer)


def choose_tp_across_nodes(work):
    return _search(work, tp_in_node=False)


def choose_never_checks_memory(work):
    return _search(work, check_memory=False)


def choose_no_recompute(work):
    return _search(work, recompute=(False,))


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
    "memory": {"memory": memory, "memory_by_hand": memory_by_hand},
    "choose": {"choose": choose, "choose_with_product": choose_with_product},
}

WRONG = {
    "memory": [(memory_no_activations, "activations are missing"),
               (memory_no_optimizer, "optimizer states"),
               (memory_all_microbatches, "min(accum, pp)"),
               (memory_tp_ignored_in_activations, "t=tp"),
               (memory_in_gb, "not GB")],
    "choose": [(choose_ignores_activations, "Without the activations"),
               (choose_ignores_optimizer, "Without the optimizer states"),
               (choose_tp_across_nodes, "inside a node"),
               (choose_never_checks_memory, "over the 80 GB"),
               (choose_no_recompute, "recompute=True"),
               (choose_plan_even_if_nothing_fits, "Return None when nothing fits"),
               (choose_calls_search, "planner.search"),
               (choose_without_reasons, "no line for tp, pp, zero")],
}
