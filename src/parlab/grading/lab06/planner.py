"""Checks for Lab 06's strategy planner (sections 5-6), on the grading harness.

    lab06.check_memory_per_gpu(memory_per_gpu)   # bytes the busiest GPU holds under a plan
    lab06.check_choose(choose)                   # the fastest plan that fits, or None

Both are plain functions graded in one process (no ranks).  The reference
is planner v3 (``parlab.planner``): ``memory_per_gpu`` must equal its memory
model on the busiest stage (``planner.memory_per_gpu``, the largest
``planner.stage_memory``), and ``choose`` must return a plan that
``planner.problems`` accepts (which includes fitting in headroom × HBM and
dp·micro_batch·accum = global batch) whose predicted throughput equals the
best that ``planner.search`` finds (any of several equally fast plans passes:
equal up to a relative 1e-9).  While either runs, a profiler hook notes calls
to the reference's functions (``MEMORY_REFERENCE`` for ``memory_per_gpu``,
``REFERENCE`` for ``choose``), so an answer that hands the work to the
reference is told so.  When two known mistakes give the same wrong value,
the memory message names both.

One module: the two planner exercises share their cases, the profiler hook that notes calls to
the reference and the messages that name a known mistake; splitting them would duplicate those.
"""
from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, fields
from functools import lru_cache

from ... import cost, planner, planner_frameworks
from ...planner import Cluster, ModelSpec, Plan, Workload
from ..diagnosis import Term, diagnose
from ..harness import Exercise, Graded, Rule, checker
from ..plain import plain_number
from ..predictions import prediction_grader
from ..records import events

__all__ = ["check_memory_per_gpu", "check_choose", "MEMORY", "CHOOSE", "SCENARIOS", "HIDDEN"]

#: What ``choose`` may not call: the reference answers the exercise asks for.
REFERENCE = ("search", "candidates", "problems", "predict", "memory_breakdown", "memory_per_gpu",
             "explained")
#: What ``memory_per_gpu`` may not call: the functions that hold its answer.
MEMORY_REFERENCE = ("memory_per_gpu", "stage_memory", "memory_breakdown")
AXES_EXPLAINED = ("dp", "tp", "pp", "zero")


def _calling_reference(names: tuple, fn, *args) -> tuple[object, list[str]]:
    """``fn(*args)`` and the sorted names in ``names`` of the planner functions it called directly
    (a profiler hook; calls made from inside ``parlab.planner`` itself are not counted)."""
    codes, called = {getattr(planner, name).__code__: name for name in names}, []

    def hook(frame, event, arg):
        if event == "call" and frame.f_code in codes and frame.f_back.f_globals is not vars(planner):
            called.append(codes[frame.f_code])

    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        result = fn(*args)
    finally:
        sys.setprofile(previous)
    return result, sorted(set(called))


# ---------------------------------------------------------------- exercise A: memory
@dataclass(frozen=True)
class MemoryCase:
    plan: Plan
    model: ModelSpec

    def describe(self, n: int) -> str:
        return f"the {self.model.name} model (seq {self.model.seq}) under {self.plan}"


def _variant(plan: Plan, model: ModelSpec, *, held=None, per_stage=True, shard=True, t=None,
             recompute=None, stage=None, optim=None, precision=None, embed=True, logits=True,
             working=True, stage0=False, zero_over_cp=True, untie=False, tied_once=False,
             gathered=True) -> float:
    """Planner v3's memory model (``planner.stage_memory``, busiest stage) with one piece changed,
    to recognise a mistake by its value."""
    zero = plan.zero if stage is None else stage
    mode = plan.recompute if recompute is None else recompute
    w, g, o = cost.PRECISIONS[precision or plan.precision]
    o = o if optim is None else optim
    d = plan.dp * plan.cp if zero_over_cp else plan.dp
    layers = planner.stage_layers(plan, model)
    tp_act = plan.tp if t is None else t

    def act(m):
        return cost.activation_bytes_per_layer(model.seq / plan.cp, plan.micro_batch, model.hidden,
                                               model.heads, t=tp_act, sp=plan.sp, recompute=m,
                                               scores=model.scores, **model.shape,
                                               sp_gathered=gathered and planner_frameworks.sp_keeps_gathered(plan))

    totals = []
    for r in ((0,) if stage0 else range(plan.pp)):
        n = layers[r] if per_stage else model.layers
        params = n * model.layer_params
        if embed and r == 0:
            params += model.vocab * model.hidden
        if embed and r == plan.pp - 1 and (not model.tied or untie or plan.pp > 1 and not tied_once):
            params += model.vocab * model.hidden
        psi = params / plan.tp if shard else model.params
        states = (w * psi / (d if zero >= 3 else 1) + g * psi / (d if zero >= 2 else 1)
                  + o * psi / (d if zero >= 1 else 1))
        if held is None:
            inflight = (cost.activations_held(plan.pp, plan.accum, "interleaved", rank=r, v=plan.v)
                        if plan.v > 1 else cost.activations_held(plan.pp, plan.accum, "1f1b", rank=r))
        else:
            inflight = plan.accum if held == "all" else held
        acts = act(mode) * n * inflight
        if working and mode == "full":
            acts += act("none")
        elif working and mode == "selective" and model.scores:
            acts += act("none") - act("selective")
        if logits and r == plan.pp - 1:
            acts += planner.LOGIT_BYTES * plan.micro_batch * model.seq / plan.cp * model.vocab / plan.tp
        totals.append(states + acts)
    return max(totals)


def _memory_mistakes(case: MemoryCase) -> list[tuple[float, str]]:
    p, m = case.plan, case.model
    parts = planner.memory_breakdown(p, m)
    other = "zero16" if p.precision == "fp32_grads" else "fp32_grads"
    out = [(_variant(p, m, held=0, working=False, logits=False),
            "The activations are missing: add activation_bytes_per_layer × the stage's layers × "
            "micro-batches in flight, plus the logits on the last stage."),
           (planner.memory_per_gpu(p, m) - parts["optimizer"],
            "The optimizer states (12 bytes per parameter: fp32 master weights, momentum, variance) "
            "are missing."),
           (_variant(p, m, optim=8), "Adam's 12 bytes include the fp32 master weights (4 + 4 + 4)."),
           (_variant(p, m, held="all"), "Under 1F1B stage r holds min(accum, pp - r) micro-batches, "
            "not all accum of them (cost.activations_held)."),
           (_variant(p, m, held=1), "Under 1F1B stage r holds the activations of min(accum, pp - r) "
            "micro-batches (cost.activations_held), not one."),
           (_variant(p, m, per_stage=False), "A pipeline stage holds only its own layers' "
            "activations (planner.stage_layers)."),
           (_variant(p, m, shard=False), "Each GPU holds only its stage's parameters ÷ tp "
            "before ZeRO divides by dp·cp."),
           (_variant(p, m, t=1), "Tensor parallelism also splits most activations: pass t=tp (and "
            "sp=plan.sp) to activation_bytes_per_layer."),
           (_variant(p, m, embed=False), "The first stage also holds the embedding and the last the "
            "output layer (vocab × hidden parameters each, ÷ tp)."),
           (_variant(p, m, stage0=True), "The busiest GPU is not always stage 0's: the last stage "
            "holds the output layer and the logits; take the largest stage."),
           (_variant(p, m, logits=False), "The last stage also holds the fp32 logits of one "
            "micro-batch: 4·micro_batch·(seq/cp)·vocab/tp bytes."),
           (_variant(p, m, working=False),
            "Under selective recomputation the layer whose attention is being recomputed holds that "
            "part on top: one layer's recompute=\"none\" minus \"selective\" activations."
            if p.recompute == "selective" else "Under full recomputation the layer being recomputed "
            "holds its whole working set (its recompute=\"none\" activations) on top.",
            f"working set under {p.recompute}"),
           (_variant(p, m, tied_once=True), "model.tied, and pp > 1: the first stage holds the embedding, "
            "and the last stage keeps its own copy of it as the output layer (vocab × hidden "
            "parameters, ÷ tp), so count it on the last stage too."),
           (_variant(p, m, untie=True), "model.tied: the output layer is the embedding matrix, so a "
            "single stage (pp = 1) holds V·h once; with pp > 1 the last stage keeps its own copy."),
           (_variant(p, m, precision=other), f"plan.precision is \"{p.precision}\": use its bytes "
            f"(cost.PRECISIONS[\"{p.precision}\"]), not {other}'s.", f"uses {other}"),
           (_variant(p, m, zero_over_cp=False), "ZeRO shards the model states over dp·cp ranks, "
            "not dp alone."),
           (planner.memory_per_gpu(p, m) / 1e9, "Return bytes, not GB.")]
    if planner_frameworks.sp_keeps_gathered(p):
        out.append((_variant(p, m, gathered=False), "torchtitan runs this plan (ZeRO-2/3 with TP): its sequence "
                    "parallelism keeps the all-gathered inputs of attention and the MLP; pass "
                    "sp_gathered=planner_frameworks.sp_keeps_gathered(plan) to activation_bytes_per_layer."))
    for mode in planner.RECOMPUTE:
        if mode != p.recompute:
            out.append((_variant(p, m, recompute=mode), f"plan.recompute is \"{p.recompute}\": "
                        f"that is the memory under \"{mode}\" (activation_bytes_per_layer(..., "
                        f"recompute=plan.recompute)).", f"recompute {mode}"))
    for s in cost.ZERO_STAGES:
        if s != p.zero:
            out.append((_variant(p, m, stage=s), f"That is ZeRO-{s}'s model-state memory; the plan "
                        f"asks for ZeRO-{p.zero}.", f"ZeRO-{s}"))
    want = planner.memory_per_gpu(p, m)
    return [(v, why, named[0] if named else _name(why))
            for v, why, *named in out if not math.isclose(v, want, rel_tol=1e-6)]


def _name(why: str) -> str:
    """A mistake's name, the same on every case: its sentence up to the first number or quote."""
    return re.split(r"[\d\"]", why, maxsplit=1)[0]


#: The inputs memory_per_gpu is also called with doubled, to say which term is wrong.
_ACTIVATIONS = "the activations (the last stage's logits among them)"
MEMORY_TERMS = (Term("model.seq", _ACTIVATIONS, 0, "model.seq"),
                Term("plan.micro_batch", _ACTIVATIONS, 0, "plan.micro_batch"),
                Term("model.vocab", "the embedding, the output layer and the logits", 0, "model.vocab"),
                Term("plan.dp", "the division of the model states by ZeRO over dp·cp", 0, "plan.dp"))


def _run_memory(fn, case: MemoryCase, i: int, spy) -> list:
    """The answer's bytes for the case, then for the case with each of ``MEMORY_TERMS`` doubled."""
    out, called = [], []
    with spy.watch():
        for varied in [case] + [term.vary((case,))[0] for term in MEMORY_TERMS]:
            try:
                got, more = _calling_reference(MEMORY_REFERENCE, fn, varied.plan, varied.model)
            except Exception:  # noqa: BLE001 - the case itself raises again below, as it would alone
                if varied is case:
                    raise
                got, more = None, []
            out.append(plain_number(got))
            called += more
    spy.note("reference", called=sorted(set(called)))
    return out


_grade_memory = prediction_grader(lambda case: f"memory_per_gpu(plan, model) for {case.describe(1)}",
                                  lambda case: planner.memory_per_gpu(case.plan, case.model),
                                  _memory_mistakes, unit="bytes", terms=MEMORY_TERMS)


def _called_reference(records, case, n) -> str | None:
    for event in events(records[0], "reference"):
        if event["called"]:
            names = ", ".join(f"planner.{c}" for c in event["called"])
            return f"it calls {names}, the reference this exercise asks you to write."
    return None


_1B3 = ModelSpec("1.3B", 1.3e9, 24, 2048, 16, 2048)
_7B = ModelSpec("7B", 7e9, 32, 4096, 32, 4096)
_70B = ModelSpec("70B", 70e9, 80, 8192, 64, 4096)
_13B = ModelSpec("13B", 13e9, 40, 5120, 40, 4096)
_7B_32K = ModelSpec("7B", 7e9, 32, 4096, 32, 32768, ffn=11008)
_1B3_TIED = ModelSpec("1.3B tied", 1.3e9, 24, 2048, 16, 2048, tied=True)
_1B3_SCORES = ModelSpec("1.3B, scores stored", 1.3e9, 24, 2048, 16, 2048, scores=True)

MEMORY = Exercise(
    key="lab06.memory", answer="memory_per_gpu", run=_run_memory, grade=_grade_memory, solo=True,
    visible=((1, (MemoryCase(Plan(dp=4, tp=2, pp=1, zero=1, micro_batch=1, accum=64), _7B),
                  MemoryCase(Plan(dp=2, tp=2, pp=16, zero=0, micro_batch=1, accum=512, recompute="full"),
                             _70B),
                  MemoryCase(Plan(dp=8, tp=1, pp=1, zero=3, micro_batch=4, accum=16, precision="zero16"),
                             _1B3),
                  MemoryCase(Plan(dp=2, tp=4, pp=3, zero=2, micro_batch=2, accum=6, sp=False), _70B),
                  MemoryCase(Plan(dp=4, tp=2, pp=8, zero=2, micro_batch=1, accum=256), _70B),
                  MemoryCase(Plan(dp=16, tp=1, pp=1, cp=2, zero=1, micro_batch=1, accum=4), _7B_32K),
                  MemoryCase(Plan(dp=2, tp=2, pp=2, zero=1, micro_batch=4, accum=1), _1B3),
                  MemoryCase(Plan(dp=8, tp=1, pp=1, zero=1, micro_batch=2, accum=4), _1B3_TIED),
                  MemoryCase(Plan(dp=2, tp=2, pp=2, zero=1, micro_batch=1, accum=4), _1B3_TIED),
                  # a tied model whose LAST stage is the busiest: counting the embedding once fails
                  MemoryCase(Plan(dp=1, tp=1, pp=4, zero=0, micro_batch=1, accum=1), _1B3_TIED),
                  MemoryCase(Plan(dp=2, tp=2, pp=2, zero=1, micro_batch=1, accum=8, recompute="selective"),
                             _1B3_SCORES))),),
    hidden=((1, (MemoryCase(Plan(dp=5, tp=8, pp=2, zero=3, micro_batch=1, accum=1), _13B),
                 MemoryCase(Plan(dp=3, tp=1, pp=5, zero=1, micro_batch=3, accum=7, recompute="full"), _13B),
                 MemoryCase(Plan(dp=1, tp=1, pp=1, zero=0, micro_batch=2, accum=2), _1B3),
                 MemoryCase(Plan(dp=16, tp=4, pp=2, zero=2, micro_batch=1, accum=40, precision="zero16"),
                            _70B),
                 MemoryCase(Plan(dp=2, tp=8, pp=3, zero=1, micro_batch=1, accum=12, recompute="full",
                                 sp=False), _70B),
                 MemoryCase(Plan(dp=4, tp=2, pp=4, zero=1, micro_batch=1, accum=8, v=2), _13B),
                 MemoryCase(Plan(dp=4, tp=1, pp=2, cp=4, zero=3, micro_batch=1, accum=2), _7B_32K),
                 MemoryCase(Plan(dp=4, tp=2, pp=1, zero=1, micro_batch=2, accum=2), _1B3_TIED),
                 MemoryCase(Plan(dp=2, tp=1, pp=3, zero=1, micro_batch=1, accum=6), _1B3_TIED),
                 MemoryCase(Plan(dp=2, tp=1, pp=4, zero=1, micro_batch=1, accum=1), _1B3_TIED),
                 MemoryCase(Plan(dp=4, tp=2, pp=1, zero=2, micro_batch=2, accum=2, recompute="selective"),
                            _1B3_SCORES))),),
    rules=(Rule("`memory_per_gpu` does not call `planner.memory_per_gpu`, `planner.stage_memory` or "
                "`planner.memory_breakdown`: it adds up the terms itself, with `planner.stage_layers` and "
                "the `parlab.cost` functions.", _called_reference),))


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


def _run_choose(fn, case: ChooseCase, i: int, spy) -> object:
    plan, called = _calling_reference(REFERENCE, fn, case.work)
    spy.note("reference", called=called)
    spy.note("why", problem=_why_problem(plan))
    return _plain_plan(plan)


@lru_cache(maxsize=None)
def best(work: Workload):
    return planner.search(work)


def _why_nothing_fits(work: Workload) -> str:
    m, c = work.model, work.cluster
    per_param = sum(cost.PRECISIONS[work.precision])
    states = per_param * m.params
    if states > c.gpus * c.usable_memory:
        return (f"its model states alone are {states / 1e9:.0f} GB ({per_param} bytes per parameter, "
                f"{work.precision}), more than the {c.gpus * c.usable_memory / 1e9:.0f} GB a plan may use "
                f"on all {c.gpus} GPUs together")
    return "every layout needs more memory per GPU than it has, or breaks a rule"


def _logits(plan: Plan, model: ModelSpec) -> float:
    return planner.LOGIT_BYTES * plan.micro_batch * model.seq / plan.cp * model.vocab / plan.tp


@lru_cache(maxsize=None)
def _fastest_memory_aside(work: Workload) -> dict | None:
    """The fastest candidate that breaks no rule but memory (the simplest among ties), as plain fields:
    what a search that never checks memory picks."""
    best = None
    for plan in planner.candidates(work):
        if any(p.kind != "memory" for p in planner.problems(plan, work)):
            continue
        guess = planner.predict(plan, work)
        if best is None or guess.tokens_per_second > best.tokens_per_second * (1 + 1e-12) or (
                math.isclose(guess.tokens_per_second, best.tokens_per_second, rel_tol=1e-12)
                and planner.simplicity(plan) < planner.simplicity(best.plan)):
            best = guess
    return None if best is None else _plain_plan(best.plan)


def _memory_fits(plan: Plan, work: Workload) -> dict[str, str]:
    """``{mistake: sentence}`` of the memory mistakes that alone would have made ``plan`` fit."""
    return _memory_terms(plan, work)[0]


def _memory_terms(plan: Plan, work: Workload):
    """(the fitting mistakes, the breakdown, the last stage's logits, the terms left out)."""
    model, cap = work.model, work.cluster.usable_memory
    parts = planner.memory_breakdown(plan, model)
    total, logits = sum(parts.values()), _logits(plan, model)
    stages = [sum(planner.stage_memory(plan, model, r).values()) for r in range(plan.pp)]
    left_out = {"activations": (total - parts["activations"], "the activations", parts["activations"]),
                "optimizer": (total - parts["optimizer"], "the optimizer states", parts["optimizer"]),
                "logits": (max(s - (logits if r == plan.pp - 1 else 0) for r, s in enumerate(stages)),
                           "the last stage's fp32 logits", logits)}
    fits = {key: f" Without {words} ({part / 1e9:.1f} GB) it would fit: does your memory_per_gpu count them?"
            for key, (need, words, part) in left_out.items() if need <= cap}
    if total <= work.cluster.memory:
        fits["headroom"] = (f" It fits in the {work.cluster.memory / 1e9:.0f} GB of HBM, but a plan may "
                            f"use only {work.cluster.headroom:.0%} of it (work.cluster.usable_memory).")
    if _plain_plan(plan) == _fastest_memory_aside(work):
        fits["unchecked"] = (" It is the fastest of all the layouts when memory is left aside: does your "
                             "search compare each plan's memory_per_gpu with work.cluster.usable_memory?")
    return fits, parts, logits, left_out


def _memory_hint(plan: Plan, work: Workload, others=()) -> str:
    """The one mistake that alone would have made ``plan`` look as if it fits (a term left out: the
    activations, the optimizer states, the last stage's logits; the headroom ignored; memory never
    checked), when only one would, here and on ``others`` (the other cases' plans that do not fit,
    ``(plan, work)``); otherwise the busiest stage's terms and which would each have, naming no cause."""
    fits, parts, logits, left_out = _memory_terms(plan, work)
    cap, total = work.cluster.usable_memory, sum(parts.values())
    named = diagnose([fits] + [_memory_fits(*other) for other in others])
    if named:
        return named
    terms = ", ".join(f"{key} {value / 1e9:.1f} GB" for key, value in parts.items())
    each = [f"{left_out[k][1]} ({left_out[k][2] / 1e9:.1f} GB)" for k in fits if k in left_out]
    alone = (" Leaving out any one of " + ", ".join(each) + " would bring it under that"
             + (", and so would comparing with all of the HBM" if "headroom" in fits else "") + "."
             if each else "")
    alone += " It is also the fastest of all the layouts when memory is left aside." if "unchecked" in fits else ""
    return (f" Its busiest GPU holds {terms} (the last stage's fp32 logits, {logits / 1e9:.1f} GB, "
            f"are among its activations), {total / 1e9:.1f} GB in all against {cap / 1e9:.1f} GB usable."
            f"{alone} Compare your memory_per_gpu with each term.")


def _fits_without_recompute(work: Workload) -> bool:
    """Whether some plan that recomputes nothing fits (then recomputation is not why None is wrong)."""
    usable, m = work.cluster.usable_memory, work.model
    return any(plan.recompute == "none" and sum(planner.memory_breakdown(plan, m).values()) <= usable
               and not planner.problems(plan, work) for plan in planner.candidates(work))


def _batch_hint(plan: Plan, work: Workload) -> str:
    """Name a micro-batch that divides the global batch but not a replica's rows."""
    done, rows = plan.dp * plan.micro_batch * plan.accum, work.global_batch / plan.dp
    if done == work.global_batch:
        return ""
    fewer = "fewer" if done < work.global_batch else "more"
    return (f" That is {done} sequences per step, {fewer} than the global batch of {work.global_batch}: "
            f"micro_batch must divide a replica's rows (global_batch / dp = {rows:g}), so that "
            f"dp·micro_batch·accum = global_batch.")


def _slower_hint(plan: Plan, top: Plan, model: ModelSpec) -> str:
    """Name the axes the fastest plan uses that the answer's search may not try."""
    hints = []
    if top.recompute != plan.recompute and top.recompute != "none":
        hints.append(f"recompute=\"{top.recompute}\"")
    if top.cp != plan.cp and top.cp > 1:
        hints.append(f"cp={top.cp}")
    if top.v != plan.v and top.v > 1:
        hints.append(f"interleaving v={top.v}")
    if top.pp > 1 and model.layers % top.pp:
        hints.append(f"uneven pipeline stages ({model.layers} layers on pp={top.pp})")
    return f" The fastest plan uses {', '.join(hints)}: does your search try it?" if hints else ""


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
            hint = (f" Only plans that recompute the activations fit: does your search try "
                    f"recompute=\"{top.plan.recompute}\"?"
                    if top.plan.recompute != "none" and not _fits_without_recompute(work) else "")
            return (f"choose returned None for {where}, but {top.plan} fits "
                    f"({sum(top.memory.values()) / 1e9:.1f} GB per GPU).{hint}")
        if not isinstance(got, dict) or "dp" not in got:
            text = got.get("repr") if isinstance(got, dict) else repr(got)
            return f"choose returned {text} for {where}; return a planner.Plan (or None)."
        plan = Plan(**got)
        problems = planner.problems(plan, work)
        if problems:
            hint = (_memory_hint(plan, work, _over_memory(g, i)) if "GB per GPU" in problems[-1]
                    else "")
            return (f"choose picked {plan} for {where}, which cannot run: " + "; ".join(problems)
                    + "." + hint + _batch_hint(plan, work))
        mine = planner.predict(plan, work).tokens_per_second
        if mine < top.tokens_per_second * (1 - 1e-9):
            return (f"choose picked {plan} for {where}: it fits, but its predicted throughput is "
                    f"{mine:,.0f} tokens/s against {top.tokens_per_second:,.0f} for {top.plan}. "
                    "Search every dp·cp·tp·pp factorisation, ZeRO stage, micro-batch size, "
                    "recomputation and interleaving, and keep the fastest plan that fits."
                    + _slower_hint(plan, top.plan, work.model))
    return None


def _over_memory(g: Graded, i: int) -> list[tuple[Plan, Workload]]:
    """The other cases' returned plans that break only the memory rule, with their workloads: the
    evidence a memory mistake must explain too."""
    out = []
    for j, case in enumerate(g.cases[:len(g.results[0])]):
        got = g.results[0][j]
        if j == i or not isinstance(got, dict) or "dp" not in got:
            continue
        try:
            plan = Plan(**got)
            kinds = {p.kind for p in planner.problems(plan, case.work)}
        except (TypeError, ValueError, ZeroDivisionError):
            continue
        if kinds == {"memory"}:
            out.append((plan, case.work))
    return out


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
    for event in events(records[0], "why"):
        if event["problem"]:
            return event["problem"] + "."
    return None


#: The lecture's scenarios; clusters whose nodes hold 6 GPUs (as Summit's did), where a TP
#: group of 4 would straddle two nodes (and for 70B would be predicted fastest); nodes of 2 with a batch whose replica rows (36 / dp)
#: not every divisor of the batch divides (issue 20, contract 10); 40 GB A100s, where only full
#: recomputation is fastest.
SCENARIOS = tuple(ChooseCase(name, work) for name, work in planner.SCENARIOS.items()) + (
    ChooseCase("13B on 12 GPUs in nodes of 6", Workload(_13B, Cluster(12, gpus_per_node=6), 96)),
    ChooseCase("13B on 6 GPUs in nodes of 2", Workload(_13B, Cluster(6, gpus_per_node=2), 36)),
    ChooseCase("13B on 8 A100s (40 GB)", Workload(_13B, planner.A100_40GB(8), 64)),
    ChooseCase("70B on 48 GPUs in nodes of 6", Workload(_70B, Cluster(48, gpus_per_node=6), 96)),)
HIDDEN = (
    ChooseCase("13B on 24 GPUs in nodes of 6", Workload(_13B, Cluster(24, gpus_per_node=6), 48)),
    ChooseCase("7B on 2 nodes of 4 GPUs", Workload(_7B, Cluster(8, gpus_per_node=4), 64)),
    ChooseCase("70B on one 141 GB GPU", Workload(_70B, Cluster(1, memory=141e9), 8)),
    ChooseCase("13B, 16k tokens on 32 GPUs", Workload(ModelSpec("13B", 13e9, 40, 5120, 40, 16384),
                                                     Cluster(32), 32)),
    ChooseCase("13B on 10 GPUs in nodes of 2", Workload(_13B, Cluster(10, gpus_per_node=2), 60)),
    ChooseCase("7B on 4 A100s (40 GB)", Workload(_7B, planner.A100_40GB(4), 64)),
    ChooseCase("70B on 36 GPUs in nodes of 6", Workload(_70B, Cluster(36, gpus_per_node=6), 72)),
    ChooseCase("13B, 32k tokens on 32 GPUs", Workload(ModelSpec("13B", 13e9, 40, 5120, 40, 32768),
                                                     Cluster(32), 32)),
    # the fastest plan with ZeRO-3 under PP, which no framework runs (planner_frameworks)
    ChooseCase("70B on 32 H100s", Workload(_70B, Cluster(32), 256)),
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

check_memory_per_gpu = checker(MEMORY, """Exercise 4: ``memory_per_gpu(plan, model)`` -> bytes the busiest
GPU needs under planner v3's model (``planner.stage_memory`` of the busiest stage: model states of the
stage's layers, embedding and output layer under ZeRO over dp·cp, activations under 1F1B with the
recomputation's working set, and the last stage's fp32 logits).""")
check_choose = checker(CHOOSE, """Exercise 5: ``choose(work)`` -> the fastest ``planner.Plan`` that fits
``work`` (a ``planner.Workload``) within ``work.cluster.usable_memory``, with dp·micro_batch·accum equal to
the global batch, and a one-line reason per axis, or None when nothing fits.""")
