"""Lab 04's graders: values compared with single-process references, and the solo exercises.

- ``grade_schedule``: after every SGD step, each stage's gradients and
  parameters against ``parlab.reference.reference_steps`` on the whole batch
  (its ``grad_accum`` splits the batch into the same micro-batches), and the
  last stage's loss against the reference's mean loss.  Hints name the
  common mistakes: a loss not divided by m, gradients that hold only the
  last micro-batch (not accumulated), a stage whose parameters got none.
- ``grade_bubble``: Exercise 4, against ``parlab.trace.bubble_fraction`` on
  span sets built from ``parlab.parallel.pp_schedule``'s ideal timetables.
- ``grade_prediction``: Exercise 5, against ``parlab.cost``'s formulas.
Hints read plain results only and never raise, whatever a rank returned.
"""
from __future__ import annotations

import functools
import random

import torch

from ... import check, cost
from ...models import lm_loss
from ...parallel.pp_schedule import ideal_schedule
from ...parallel.pp_stages import gpt_stage
from ..harness import Graded
from ..numbers import number_message, plain_number, shown

# The seeds of every lab 04 case: the model's initial weights and the batches.
INIT_SEED, DATA_SEED = 5, 11


# ---------------------------------------------------------------- schedules
@functools.lru_cache(maxsize=64)
def _reference(case):
    from ...reference import reference_steps

    return reference_steps(case.build, steps=case.steps, batch_size=case.batch, lr=case.lr,
                           seed=DATA_SEED, seq_len=case.seq, grad_accum=case.m)


@functools.lru_cache(maxsize=64)
def _names(case, n: int) -> tuple:
    """Each stage's parameter names and shapes, in ``named_parameters`` order."""
    model = case.build()
    return tuple(tuple((k, p.shape) for k, p in gpt_stage(model, n, r).named_parameters())
                 for r in range(n))


@functools.lru_cache(maxsize=64)
def _last_only(case) -> dict:
    """Step 1's gradients if only the last micro-batch had counted (loss / m)."""
    model = case.build()
    x, y = case.batches(0)[-1]
    (lm_loss(model, x, y) / case.m).backward()
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def _flat(named: dict, layout) -> torch.Tensor:
    return torch.cat([named[k].reshape(-1).float() for k, _ in layout])


def _unflat(vector, layout) -> dict:
    sizes = [shape.numel() for _, shape in layout]
    if not isinstance(vector, torch.Tensor) or vector.numel() != sum(sizes):
        return {}
    return {k: t.view(shape) for (k, shape), t in zip(layout, torch.split(vector, sizes))}


def _stage_message(case, n: int, s: int, r: int, st: dict, layout) -> str | None:
    ref = _reference(case).steps[s]
    want_g, want_p = _flat(ref.grads, layout), _flat(ref.params, layout)
    none = st["grads"]["none"]
    if not none and check.same_values(st["grads"]["flat"], want_g):
        if check.same_values(st["params"], want_p):
            return None
        return (f"stage {r}'s gradients of step {s + 1} are right but its parameters after the step "
                "are not: leave the optimizer and the parameters to the caller.")
    where = f"stage {r} (rank {r}), step {s + 1}"
    if none:
        return (f"{where}: {len(none)} parameters of this stage have no gradient (None), e.g. "
                f"'{none[0]}': backward never reached them. Every stage runs backward for every "
                "micro-batch: the last one on its loss, the others on their output with the "
                "gradient received from the next stage.")
    got = _unflat(st["grads"]["flat"], layout)
    want = {k: ref.grads[k] for k, _ in layout}
    scale = check.grad_scale(got, want)
    if scale and case.m > 1 and abs(scale / case.m - 1) < 1e-3:
        return (f"{where}: every gradient is {case.m}x the reference. Divide each micro-batch's loss "
                f"by m = {case.m} before backward: the step's loss is the MEAN over micro-batches.")
    if scale and case.m > 1 and abs(scale * case.m - 1) < 1e-3:
        return f"{where}: every gradient is 1/{case.m} of the reference: you divided by m twice."
    if s == 0 and case.m > 1:
        last = {k: v for k, v in _last_only(case).items() if k in want}
        if check.grad_scale(got, last) is not None:
            return (f"{where}: the gradients hold only the LAST micro-batch's contribution. "
                    "backward adds into p.grad: do not zero the gradients (or overwrite p.grad) "
                    "between micro-batches, let them accumulate over all m.")
    try:
        check.assert_grads_match(got, want, rank=r)
    except AssertionError as err:
        hint = ""
        if r < n - 1:
            hint = ("\nHint: a stage before the last gets its gradients from the gradient the next "
                    "stage sends back: is it the gradient of the next stage's INPUT (the tensor "
                    "you received and called requires_grad_() on), for the same micro-batch?")
        return f"{where}: the gradients do not match the single-process reference.\n{err}{hint}"
    return f"{where}: the gradients do not match the single-process reference."


def _loss_message(case, s: int, got) -> str | None:
    want = _reference(case).steps[s].loss
    call = f"the loss your function returned on the last stage in step {s + 1}"
    if got is None:
        return f"{call} is None: return the mean loss over the micro-batches on the last stage."
    if isinstance(got, str):
        return f"{call} is a {got.strip('<>')}: return a number or a 0-d tensor."
    mistakes = [(want * case.m, f"That is the SUM of the {case.m} micro-batch losses: return their mean.")]
    return number_message(got, want, call, mistakes if case.m > 1 else (), rtol=1e-5)


def grade_schedule(g: Graded) -> str | None:
    for i, case in enumerate(g.cases):
        if i >= min(len(r) for r in g.results):
            break
        layouts, runs = _names(case, g.n), g.at(i)
        for r, steps in enumerate(runs):
            if not isinstance(steps, list) or len(steps) != case.steps:
                return f"{g.name} is wrong for {case.describe(g.n)}: stage {r} did not finish its steps."
        for s in range(case.steps):
            for r in range(g.n):
                msg = _stage_message(case, g.n, s, r, runs[r][s], layouts[r])
                if msg:
                    return f"{g.name} is wrong for {case.describe(g.n)}.\n{msg}"
            msg = _loss_message(case, s, runs[g.n - 1][s]["loss"])
            if msg:
                return f"{g.name} is wrong for {case.describe(g.n)}: {msg}"
    return None


# ---------------------------------------------------------------- Exercise 4: the bubble
def _spans(p: int, m: int, schedule: str, v: int = 1, forward: float = 1.0, backward: float = 2.0,
           comm: float = 0.0, jitter: float = 0.0, seed: int = 0, edges: float = 0.0) -> tuple:
    """A span set as plain dicts: an ideal timetable, optionally with send/recv spans and jitter.

    ``edges`` adds a recv span of that length on stage 0 before the first forward (waiting for
    the batch) and a send span on the last stage after the last backward, so that a window taken
    over spans of any kind is longer than the compute's.
    """
    rng = random.Random(seed)
    out = []
    if edges:
        out.append({"name": "recv", "rank": 0, "start": -edges, "end": 0.0})
    for sp in ideal_schedule(p, m, schedule, v, forward, backward):
        a = sp["start"] + rng.uniform(0, jitter)
        b = max(a + 0.05, sp["end"] + rng.uniform(-jitter / 2, jitter / 2))
        out.append({"name": sp["kind"], "rank": sp["rank"], "start": a, "end": b})
        if comm and sp["kind"] == "forward" and sp["rank"] < p - 1:
            out.append({"name": "send", "rank": sp["rank"], "start": b, "end": b + comm})
        if comm and sp["kind"] == "forward" and sp["rank"] > 0:
            out.append({"name": "recv", "rank": sp["rank"], "start": max(0.0, a - comm), "end": a})
    if edges:
        end = max(d["end"] for d in out)
        out.append({"name": "send", "rank": p - 1, "start": end, "end": end + edges})
    return tuple(tuple(sorted(d.items())) for d in out)


def _overlapping(seed: int) -> tuple:
    """Two stages whose traced spans overlap (a forward span recorded inside a longer one)."""
    base = [dict(d) for d in _spans(2, 3, "1f1b", seed=seed, jitter=0.3)]
    inner = base[0]
    base.append({"name": "forward", "rank": inner["rank"], "start": inner["start"] + 0.1,
                 "end": inner["start"] + 0.4})
    return tuple(tuple(sorted(d.items())) for d in base)


BUBBLE_VISIBLE = ((1, (_spans(4, 4, "gpipe"), _spans(2, 3, "1f1b", comm=0.2, edges=0.5),
                       _spans(4, 6, "1f1b", jitter=0.4, seed=1), _overlapping(2))),)
BUBBLE_HIDDEN = ((1, (_spans(4, 8, "interleaved", v=2),
                      _spans(3, 5, "gpipe", comm=0.1, jitter=0.3, seed=3, edges=0.7),
                      _spans(4, 1, "gpipe"), _overlapping(4))),)


def _as_spans(case) -> list:
    from ...trace import Span

    return [Span(d["name"], d["rank"], d["start"], d["end"]) for d in map(dict, case)]


def run_bubble(fn, case, i, spy):
    with spy.watch():
        got = fn(_as_spans(case))
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    return plain_number(got)


def _alternatives(spans) -> list[tuple[float, str]]:
    """(value, mistake) for the usual wrong ways to measure the bubble."""
    from ... import trace

    busy = ("forward", "backward")
    ranks = sorted({s.rank for s in spans})
    rows = {r: [s for s in spans if s.rank == r and s.name in busy] for r in ranks}
    t0 = min(s.start for s in spans if s.name in busy)
    t1 = max(s.end for s in spans if s.name in busy)
    own = [1 - sum(_union(rows[r])) / (max(s.end for s in rows[r]) - min(s.start for s in rows[r]))
           for r in ranks]
    summed = [1 - sum(s.duration for s in rows[r]) / (t1 - t0) for r in ranks]
    idle = [(t1 - t0) - sum(_union(rows[r])) for r in ranks]
    with_comm = trace.bubble_fraction(spans, busy=("forward", "backward", "send", "recv"),
                                      window=(t0, t1))
    a0, a1 = min(s.start for s in spans), max(s.end for s in spans)
    any_kind = trace.bubble_fraction(spans, window=(a0, a1)) if (a0, a1) != (t0, t1) else -1.0
    return [(sum(own) / len(own), "Each stage's idle share must be measured over the SAME window, "
             "from the first stage's first forward to the last backward on any stage, not over "
             "that stage's own first and last span."),
            (any_kind, "The window runs from the first forward to the last backward, over the "
             "compute spans only: a recv before the first forward or a send after the last backward "
             "is outside the step being measured, so taking the first and last span of any kind "
             "makes the window too long."),
            (with_comm, "Only forward and backward spans count as busy: time in send and recv is "
             "idle (waiting), the very bubble being measured."),
            (sum(summed) / len(summed), "Spans of one stage can overlap: take the union of its "
             "busy intervals, not the sum of their lengths."),
            (sum(idle) / sum((t1 - t0) - i for i in idle), "That is idle time divided by busy time "
             "(Megatron's ratio); this exercise asks for idle time as a share of the step."),
            (max(1 - sum(_union(rows[r])) / (t1 - t0) for r in ranks), "That is the largest stage's "
             "idle share: report the mean over stages.")]


def _union(spans) -> list[float]:
    """Lengths of the union of the spans' intervals."""
    out: list[list[float]] = []
    for a, b in sorted((s.start, s.end) for s in spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [b - a for a, b in out]


def grade_bubble(g: Graded) -> str | None:
    from ... import trace

    for i, case in enumerate(g.cases[:len(g.results[0])]):
        spans = _as_spans(case)
        p = len({s.rank for s in spans})
        got, want = g.results[0][i], trace.bubble_fraction(spans)
        if isinstance(got, dict) and "repr" in got and got.get("type") in ("dict", "list"):
            return (f"{g.name}(spans) for {p} stages returned {shown(got)[0][:80]}; return ONE "
                    "number, the mean over stages of each stage's idle share.")
        msg = number_message(got, want, f"{g.name}(spans) for {p} stages and {len(spans)} spans",
                             _alternatives(spans), rtol=1e-6)
        if msg:
            return msg
    return None


# ---------------------------------------------------------------- Exercise 5: prediction
PREDICT_VISIBLE = ((1, ((4, 8, "gpipe", 0, 1000), (4, 8, "1f1b", 0, 1000), (4, 8, "1f1b", 2, 4096),
                        (4, 2, "1f1b", 0, 512))),)
PREDICT_HIDDEN = ((1, ((8, 32, "1f1b", 3, 3 * 2**20), (2, 1, "gpipe", 1, 64), (3, 7, "1f1b", 1, 100),
                       (16, 4, "1f1b", 5, 10), (6, 12, "gpipe", 5, 7))),)


def run_prediction(fn, case, i, spy):
    from ..calls import watched_cost_call

    got = watched_cost_call(spy, fn, *case)
    if isinstance(got, (tuple, list)) and len(got) == 2:
        return [plain_number(v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v)
                for v in got]
    return {"not_a_pair": repr(got)[:200]}


def grade_prediction(g: Graded) -> str | None:
    for i, (p, m, schedule, rank, mb) in enumerate(g.cases[:len(g.results[0])]):
        got = g.results[0][i]
        call = f"{g.name}(p={p}, m={m}, schedule={schedule!r}, rank={rank}, mb_bytes={mb})"
        if isinstance(got, dict) and "not_a_pair" in got:
            if got["not_a_pair"] == "None":
                return f"{call} returned None: did you forget the `return` statement?"
            return f"{call} should return a pair (bubble, held_bytes), got {got['not_a_pair']}"
        bubble = cost.bubble_fraction(p, m, schedule)
        held = cost.activations_held(p, m, schedule, rank) * mb
        bubble_mistakes = [
            (cost.bubble_fraction(p, m, schedule, definition="megatron"),
             "That is (p − 1)/m, idle time relative to the IDEAL time (Megatron's definition); "
             "this asks for idle time as a share of the whole step, (p − 1)/(m + p − 1)."),
            (0.0, "1F1B reorders the passes but keeps GPipe's bubble: (p − 1)/(m + p − 1)."),
            ((p - 1) / (m + p), "The step lasts m + p − 1 slots, not m + p.")]
        held_mistakes = [
            (m * mb, "That is GPipe's m micro-batches; 1F1B holds at most p − rank of them."),
            (p * mb, f"Stage {rank} holds min(p − rank, m) micro-batches, p only on stage 0 (and only "
                     "when m ≥ p)."),
            ((p - rank) * mb, f"With m = {m} < p − rank, only m micro-batches exist to hold."),
            ((p - rank - 1) * mb, "That is the warm-up forwards only: the forward of the steady phase "
                                  "is held too, min(p − rank, m) in all."),
            (held / mb if mb != 1 else -1.0, "That is a number of micro-batches: multiply by mb_bytes."),
            (min(p, m) * mb, f"Later stages hold fewer: stage {rank} holds min(p − rank, m).")]
        msg = (number_message(got[0], bubble, f"the bubble of {call}", bubble_mistakes)
               or number_message(got[1], held, f"the bytes held by {call}",
                                 [(v, w) for v, w in held_mistakes if v != held], unit="bytes"))
        if msg:
            return msg
    return None
