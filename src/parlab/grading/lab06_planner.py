"""Checks for Lab 06's strategy planner (sections 5-6), on the grading harness.

    lab06.check_memory_per_gpu(memory_per_gpu)   # bytes the busiest GPU holds under a plan
    lab06.check_choose(choose)                   # the fastest plan that fits, or None

Both are plain functions graded in one process (no ranks).  The reference
is ``parlab.planner``: ``memory_per_gpu`` must equal its memory model, and
``choose`` must return a plan that ``planner.problems`` accepts whose
predicted throughput equals the best that ``planner.search`` finds (any of
several equally fast plans passes).  While ``choose`` runs, a profiler hook
notes calls to the reference's search and memory functions, so an answer
that hands the work to the reference is told so.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from functools import lru_cache

from .. import cost, planner
from ..planner import Cluster, ModelSpec, Plan, Workload
from .harness import Exercise, Graded, Rule, checker
from .numbers import number_message, plain_number

__all__ = ["check_memory_per_gpu", "check_choose", "MEMORY", "CHOOSE", "SCENARIOS", "HIDDEN"]

#: What ``choose`` may not call: the reference answers the exercise asks for.
REFERENCE = ("search", "candidates", "problems", "predict", "memory_breakdown", "memory_per_gpu",
             "explained")
AXES_EXPLAINED = ("dp", "tp", "pp", "zero")


# ---------------------------------------------------------------- exercise A: memory
@dataclass(frozen=True)
class MemoryCase:
    plan: Plan
    model: ModelSpec

    def describe(self, n: int) -> str:
        return f"the {self.model.name} model (seq {self.model.seq}) under {self.plan}"


def _variant(plan: Plan, model: ModelSpec, *, held=None, per_stage=True, shard=True, t=None,
             recompute=None, stage=None, optim=12) -> float:
    """The memory model with one piece changed, to recognise a mistake by its value."""
    zero = plan.zero if stage is None else stage
    psi = model.params / (plan.tp * plan.pp) if shard else model.params
    states = cost.zero_memory_per_gpu(psi, plan.dp, zero, optim_bytes=optim)
    act = cost.activation_bytes_per_layer(model.seq, plan.micro_batch, model.hidden, model.heads,
                                          t=plan.tp if t is None else t,
                                          recompute=plan.recompute if recompute is None else recompute)
    layers = model.layers / plan.pp if per_stage else model.layers
    if held is None:
        held = cost.activations_held(plan.pp, plan.accum, "1f1b", rank=0)
    return states + act * layers * held


def _memory_mistakes(case: MemoryCase) -> list[tuple[float, str]]:
    p, m = case.plan, case.model
    parts = planner.memory_breakdown(p, m)
    out = [(parts["weights"] + parts["grads"] + parts["optimizer"],
            "The activations are missing: add activation_bytes_per_layer × layers per stage × "
            "micro-batches in flight."),
           (planner.memory_per_gpu(p, m) - parts["optimizer"],
            "The optimizer states (12 bytes per parameter: fp32 master weights, momentum, variance) "
            "are missing."),
           (_variant(p, m, optim=8), "Adam's 12 bytes include the fp32 master weights (4 + 4 + 4)."),
           (_variant(p, m, held=p.accum), "Under 1F1B stage 0 holds min(accum, pp) micro-batches, not "
            "all accum of them (cost.activations_held)."),
           (_variant(p, m, held=1), "Stage 0 holds the activations of min(accum, pp) micro-batches "
            "under 1F1B, not one."),
           (_variant(p, m, per_stage=False), "A pipeline stage holds only its layers / pp layers' "
            "activations."),
           (_variant(p, m, shard=False), "Each GPU holds only its Ψ / (tp·pp) share of the parameters "
            "before ZeRO divides by dp."),
           (_variant(p, m, t=1), "Tensor parallelism also splits most activations: pass t=tp to "
            "activation_bytes_per_layer."),
           (_variant(p, m, recompute=not p.recompute),
            "plan.recompute decides the activations: 2sbh per layer with recomputation "
            "(activation_bytes_per_layer(..., recompute=True))."),
           (planner.memory_per_gpu(p, m) / 1e9, "Return bytes, not GB.")]
    for s in cost.ZERO_STAGES:
        if s != p.zero:
            out.append((_variant(p, m, stage=s), f"That is ZeRO-{s}'s model-state memory; the plan "
                        f"asks for ZeRO-{p.zero}."))
    return out


def _run_memory(fn, case: MemoryCase, i: int, spy) -> object:
    with spy.watch():
        return plain_number(fn(case.plan, case.model))


def _grade_memory(g: Graded) -> str | None:
    for i, case in enumerate(g.cases[:len(g.results[0])]):
        message = number_message(g.results[0][i], planner.memory_per_gpu(case.plan, case.model),
                                 f"memory_per_gpu(plan, model) for {case.describe(1)}",
                                 _memory_mistakes(case), unit="bytes")
        if message:
            return message
    return None


_1B3 = ModelSpec("1.3B", 1.3e9, 24, 2048, 16, 2048)
_7B = ModelSpec("7B", 7e9, 32, 4096, 32, 4096)
_70B = ModelSpec("70B", 70e9, 80, 8192, 64, 4096)
_13B = ModelSpec("13B", 13e9, 40, 5120, 40, 4096)

MEMORY = Exercise(
    key="lab06.memory", answer="memory_per_gpu", run=_run_memory, grade=_grade_memory, solo=True,
    visible=((1, (MemoryCase(Plan(dp=4, tp=2, pp=1, zero=1, micro_batch=1, accum=64), _7B),
                  MemoryCase(Plan(dp=2, tp=2, pp=16, zero=0, micro_batch=1, accum=512, recompute=True), _70B),
                  MemoryCase(Plan(dp=8, tp=1, pp=1, zero=3, micro_batch=4, accum=16), _1B3),
                  MemoryCase(Plan(dp=2, tp=4, pp=4, zero=2, micro_batch=2, accum=3), _70B))),),
    hidden=((1, (MemoryCase(Plan(dp=5, tp=8, pp=2, zero=3, micro_batch=1, accum=1), _13B),
                 MemoryCase(Plan(dp=3, tp=1, pp=5, zero=1, micro_batch=3, accum=7, recompute=True), _13B),
                 MemoryCase(Plan(dp=1, tp=1, pp=1, zero=0, micro_batch=2, accum=2), _1B3),
                 MemoryCase(Plan(dp=16, tp=4, pp=2, zero=2, micro_batch=1, accum=40), _70B))),))


# ---------------------------------------------------------------- exercise B: choose
@dataclass(frozen=True)
class ChooseCase:
    name: str
    work: Workload

    def describe(self, n: int) -> str:
        m, c = self.work.model, self.work.cluster
        gpus = f"{c.gpus} GPU" + ("s" if c.gpus > 1 else "")
        return (f"\"{self.name}\" ({m.name}, seq {m.seq}, {gpus} in nodes of {c.gpus_per_node}, "
                f"global batch {self.work.global_batch})")


def _plain_plan(plan) -> object:
    if plan is None or not isinstance(plan, Plan):
        return plain_number(plan)
    return {f.name: getattr(plan, f.name) for f in fields(Plan) if f.name != "why"}


def _reference_codes() -> dict:
    return {getattr(planner, name).__code__: name for name in REFERENCE}


def _run_choose(fn, case: ChooseCase, i: int, spy) -> object:
    codes, called = _reference_codes(), []

    def hook(frame, event, arg):
        if event == "call" and frame.f_code in codes and frame.f_back.f_code not in codes:
            called.append(codes[frame.f_code])

    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        plan = fn(case.work)
    finally:
        sys.setprofile(previous)
    spy.note("reference", called=sorted(set(called)))
    spy.note("why", problem=_why_problem(plan))
    return _plain_plan(plan)


@lru_cache(maxsize=None)
def best(work: Workload):
    return planner.search(work)


def _why_nothing_fits(work: Workload) -> str:
    m, c = work.model, work.cluster
    states = cost.training_bytes(m.params).total
    if states > c.gpus * c.memory:
        return (f"its model states alone are {states / 1e9:.0f} GB (16 bytes per parameter), more than "
                f"the {c.gpus * c.memory / 1e9:.0f} GB of all {c.gpus} GPUs together")
    return "every layout needs more memory per GPU than it has, or breaks a rule"


def _memory_hint(plan: Plan, work: Workload) -> str:
    """Name the terms whose omission would have made ``plan`` look as if it fits."""
    parts, cap = planner.memory_breakdown(plan, work.model), work.cluster.memory
    total = sum(parts.values())
    hints = [f" Without the {words} ({parts[key] / 1e9:.1f} GB) it would fit: does your "
             f"memory_per_gpu count them?"
             for key, words in (("activations", "activations"), ("optimizer", "optimizer states"))
             if total - parts[key] <= cap]
    return "".join(hints) or " Check your memory_per_gpu against this breakdown."


def _grade_choose(g: Graded) -> str | None:
    for i, case in enumerate(g.cases[:len(g.results[0])]):
        got, work, where = g.results[0][i], case.work, case.describe(1)
        top = best(work)
        if top is None:
            if got is not None:
                return (f"choose returned a plan for {where}, but no plan fits: "
                        f"{_why_nothing_fits(work)}. Return None when nothing fits.")
            continue
        if got is None:
            hint = (" Only plans that recompute the activations fit: does your search try "
                    "recompute=True?" if top.plan.recompute else "")
            return (f"choose returned None for {where}, but {top.plan} fits "
                    f"({sum(top.memory.values()) / 1e9:.1f} GB per GPU).{hint}")
        if not isinstance(got, dict) or "dp" not in got:
            text = got.get("repr") if isinstance(got, dict) else repr(got)
            return f"choose returned {text} for {where}; return a planner.Plan (or None)."
        plan = Plan(**got)
        problems = planner.problems(plan, work)
        if problems:
            hint = _memory_hint(plan, work) if "GB per GPU" in problems[-1] else ""
            return (f"choose picked {plan} for {where}, which cannot run: " + "; ".join(problems)
                    + "." + hint)
        mine = planner.predict(plan, work).tokens_per_second
        if mine < top.tokens_per_second * (1 - 1e-9):
            return (f"choose picked {plan} for {where}: it fits, but its predicted throughput is "
                    f"{mine:,.0f} tokens/s against {top.tokens_per_second:,.0f} for {top.plan}. "
                    "Search every dp·tp·pp factorisation, ZeRO stage, micro-batch size and "
                    "recomputation, and keep the fastest plan that fits.")
    return None


def _called_reference(records, case, n) -> str | None:
    for event in records[0]["events"]:
        if event["event"] == "reference" and event["called"]:
            names = ", ".join(f"planner.{c}" for c in event["called"])
            return f"it calls {names}, the reference this exercise asks you to write."
    return None


def _why_problem(plan) -> str | None:
    """What is wrong with a returned plan's ``why``, or None."""
    if not isinstance(plan, Plan):
        return None  # None (nothing fits) needs no reasons; a wrong type is the grader's business
    if not isinstance(plan.why, dict):
        return f"its why is a {type(plan.why).__name__}, not a dict from axis to one line"
    missing = [a for a in AXES_EXPLAINED if not (isinstance(plan.why.get(a), str) and plan.why[a].strip())]
    if missing:
        return f"its why has no line for {', '.join(missing)}"
    long = [a for a in AXES_EXPLAINED if "\n" in plan.why[a].strip()]
    if long:
        return f"its why for {', '.join(long)} is more than one line"
    return None


def _explains_each_axis(records, case, n) -> str | None:
    for event in records[0]["events"]:
        if event["event"] == "why" and event["problem"]:
            return event["problem"] + "."
    return None


#: The lecture's scenarios, and a cluster whose nodes hold 6 GPUs (as Summit's did), where a TP
#: group of 4 would straddle two nodes.
SCENARIOS = tuple(ChooseCase(name, work) for name, work in planner.SCENARIOS.items()) + (
    ChooseCase("13B on 12 GPUs in nodes of 6", Workload(_13B, Cluster(12, gpus_per_node=6), 96)),)
HIDDEN = (
    ChooseCase("13B on 24 GPUs in nodes of 6", Workload(_13B, Cluster(24, gpus_per_node=6), 48)),
    ChooseCase("7B on 2 nodes of 4 GPUs", Workload(_7B, Cluster(8, gpus_per_node=4), 64)),
    ChooseCase("70B on one 141 GB GPU", Workload(_70B, Cluster(1, memory=141e9), 8)),
    ChooseCase("13B, 16k tokens on 32 GPUs", Workload(ModelSpec("13B", 13e9, 40, 5120, 40, 16384),
                                                     Cluster(32), 32)),
)


CHOOSE = Exercise(
    key="lab06.choose", answer="choose", run=_run_choose, grade=_grade_choose, solo=True,
    visible=((1, SCENARIOS),), hidden=((1, HIDDEN),),
    rules=(Rule("`choose` does not call `planner.search`, `planner.candidates`, `planner.problems`, "
                "`planner.predict`, `planner.explained`, `planner.memory_breakdown` or "
                "`planner.memory_per_gpu`: it uses your `memory_per_gpu` and `planner.step_time`.",
                _called_reference),
           Rule("The plan's `why` is a dict with one line for each of `dp`, `tp`, `pp` and `zero`.",
                _explains_each_axis)),
    timeout=120)

check_memory_per_gpu = checker(MEMORY, """Exercise 4: ``memory_per_gpu(plan, model)`` -> bytes the GPU
holding pipeline stage 0 needs (model states under ZeRO plus activations under 1F1B).""")
check_choose = checker(CHOOSE, """Exercise 5: ``choose(work)`` -> the fastest ``planner.Plan`` that fits
``work`` (a ``planner.Workload``), with a one-line reason per axis, or None when nothing fits.""")
