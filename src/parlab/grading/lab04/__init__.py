"""Checks for Lab 04: pipeline parallelism, on the grading harness.

    lab04.check_pipeline_forward_backward(pipeline_forward_backward)   # Exercise 1
    lab04.check_gpipe(gpipe_step)                                      # Exercise 2
    lab04.check_1f1b(one_f_one_b_step)                                 # Exercise 3
    lab04.check_bubble(measured_bubble)                                # Exercise 4
    lab04.check_prediction(predict_pipeline)                           # Exercise 5

Rank r runs stage r of an untied parlab GPT cut into world_size stages
(``parlab.parallel.pp_stages.gpt_stage``).  The schedule exercises train a
few SGD steps; after every step each stage's gradients and parameters, and
the last stage's loss, are compared with a single-process run on the whole
batch (``graders``).  The schedule itself is judged on the spy's
records (``rules``): which messages each stage sent, and when each
forward ran relative to the backward passes, so that an "1F1B" that runs
every forward first loses its points even though its numbers are right.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...data import get_batch, microbatches
from ...models import tiny_gpt
from ...parallel.pp_stages import gpt_stage, held_activations
from ...launch.runtime import device
from . import graders
from . import rules
from ..calls import NO_COST_SAYS, no_cost_calls
from ..harness import Exercise, Rule, checker
from .graders import DATA_SEED, INIT_SEED

__all__ = ["check_pipeline_forward_backward", "check_gpipe", "check_1f1b", "check_bubble",
           "check_prediction", "Case", "EXERCISES"]

TIMEOUT = 120.0


@dataclass(frozen=True)
class Case:
    """One schedule test: m micro-batches of the global batch, through a small untied GPT."""

    m: int = 1
    batch: int = 2  # global batch: m micro-batches of batch // m rows
    seq: int = 8
    n_layer: int = 4
    d_model: int = 16
    steps: int = 1

    lr = 0.1

    def build(self):
        return tiny_gpt(seed=INIT_SEED, n_layer=self.n_layer, d_model=self.d_model, n_head=2,
                        seq_len=self.seq, tie_weights=False)

    def shape(self) -> tuple[int, int, int]:
        return (self.batch // self.m, self.seq, self.d_model)

    def batches(self, step: int) -> list:
        x, y = get_batch(step, self.batch, self.seq, DATA_SEED)
        return [(a.clone(), b.clone()) for a, b in microbatches((x, y), self.m)]

    def describe(self, n: int) -> str:
        mb = f"{self.m} micro-batch{'es' if self.m > 1 else ''} of shape {self.shape()}"
        steps = f", {self.steps} SGD steps" if self.steps > 1 else ""
        return f"{n} stages ({self.n_layer} blocks), {mb}{steps}, world_size {n}"


# ---------------------------------------------------------------- on the ranks
def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).float().cpu() for t in tensors])


def _plain_loss(x):
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        return float(x.detach().cpu())
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    return None if x is None else f"<{type(x).__name__}>"


def _one_microbatch_bytes(stage, case: Case) -> int:
    """Bytes autograd holds for one micro-batch on this stage (measured on a copy of its input)."""
    x, y = case.batches(0)[0]
    inp = (x.to(device()) if stage.is_first else
           torch.zeros(case.shape(), device=device(), requires_grad=True))
    with held_activations(*stage.parameters()) as held:
        out = stage(inp)
        if stage.is_last:
            out = stage.loss(out, y.to(device()))
        bytes_ = held.bytes
        del out
    return bytes_


def _run_schedule(fn, case: Case, i: int, spy, single: bool = False) -> list:
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    stage = gpt_stage(case.build(), n, rank).to(device())
    opt = torch.optim.SGD(stage.parameters(), lr=case.lr)
    per_mb = _one_microbatch_bytes(stage, case)
    alive = _Released(spy)
    stage.register_forward_pre_hook(alive.before_forward)
    stage.register_forward_hook(alive.after_forward)
    out = []
    for step in range(case.steps):
        micro = [(x.to(device()), y.to(device())) for x, y in case.batches(step)]
        opt.zero_grad(set_to_none=True)
        spy.note("step")
        with held_activations(*stage.parameters()) as held, spy.watch():
            got = fn(stage, *micro[0], case.shape()) if single else fn(stage, micro, case.shape())
        named = list(stage.named_parameters())
        grads = {"flat": _flat(torch.zeros_like(p) if p.grad is None else p.grad for _, p in named),
                 "none": [k for k, p in named if p.grad is None]}
        spy.note("held", peak=held.peak, per_mb=per_mb)
        opt.step()
        out.append({"loss": _plain_loss(got), "grads": grads, "params": _flat(p for _, p in named)})
    return out


class _Released:
    """Weak references to each micro-batch's input activation and output on this stage.

    Before each forward the spy notes "forward" with how many micro-batches whose backward has
    run (the gradient reached their output) are still alive: still referenced by the answer.
    """

    def __init__(self, spy):
        self.spy, self.seen = spy, []

    def finished_alive(self) -> int:
        return sum(1 for refs, done in self.seen if done[0] and any(r() is not None for r in refs))

    def before_forward(self, module, args):
        self.spy.note("forward", finished_alive=self.finished_alive())

    def after_forward(self, module, args, out):
        import weakref

        if not isinstance(out, torch.Tensor):
            return
        refs = [weakref.ref(out)] + [weakref.ref(a) for a in args
                                     if isinstance(a, torch.Tensor) and a.requires_grad]
        done = [False]
        if out.requires_grad:
            def reached(grad, done=done):
                done[0] = True
            out.register_hook(reached)
        self.seen.append((refs, done))


def _run_single(fn, case, i, spy):
    return _run_schedule(fn, case, i, spy, single=True)


# ---------------------------------------------------------------- test sets
# Visible sets on 4 stages hold the commonest traps: an uneven split of the
# blocks (5 over 4), fewer micro-batches than stages (the 1F1B warm-up is
# cut short), and as many as stages.
# Hidden sets use one world size each (one launch per check): 2 stages for Exercises 1 and 2,
# 3 for Exercise 3.
_SINGLE = (((4, (Case(), Case(n_layer=5, batch=3))),),
           ((2, (Case(n_layer=3, batch=2), Case(n_layer=2, batch=1, seq=5))),))
_GPIPE = (((4, (Case(m=4, batch=8, steps=3), Case(m=2, batch=4, steps=2, n_layer=5))),),
          ((2, (Case(m=3, batch=6, steps=3), Case(m=1, batch=2, steps=2), Case(m=5, batch=5, n_layer=3))),))
_1F1B = (((4, (Case(m=8, batch=8, steps=3), Case(m=3, batch=6, steps=2), Case(m=4, batch=4, n_layer=5))),),
         ((3, (Case(m=6, batch=6, steps=2, n_layer=3), Case(m=2, batch=4), Case(m=1, batch=2),
               Case(m=5, batch=5, steps=2))),))

_P2P_SAYS = ("Use only `dist.send`, `dist.recv`, `dist.isend` and `dist.irecv` (or "
             "`dist.batch_isend_irecv`): no collective.")
_MSG_SAYS = ("Per micro-batch, stage r sends its output to stage r + 1 and the gradient of its "
             "input to stage r − 1, one message of `shape` each, and sends nothing else.")
_COMMON = (Rule(_P2P_SAYS, rules.no_collective), Rule(_MSG_SAYS, rules.messages))

_ON_HANG = ("a stage waited for a message that never came, or two neighbouring stages both sat in "
            "a blocking dist.send to each other (gloo's send waits until the peer posts the "
            "matching recv). Rank r runs stage r: the 'Where each rank was' lines name the stage "
            "and the call it was stuck in. Post sends with dist.isend (and wait on them at the "
            "end), or order the calls so that one side of every pair receives first.")
_ON_MISMATCH = ("a message and its receive buffer differ in size or dtype: every activation and "
                "gradient message has exactly `shape` (float32); the loss is not sent anywhere.")


def _on_error(text: str) -> str:
    if "NoneType" in text or "None" in text and ("grad" in text or "send" in text):
        return ("the gradient to send back is None: autograd only fills .grad of a tensor that "
                "requires grad. Call requires_grad_() on the activation you received (after "
                "dist.recv, before the stage's forward), and send its .grad after backward.")
    if "does not require grad" in text or "element 0 of tensors" in text:
        return ("backward ran on a tensor with no graph: keep the stage's output (not a detached "
                "copy) to call backward on, and send a detached copy instead.")
    return ""


_SCHEDULE_OPTS = dict(on_hang=_ON_HANG, on_mismatch=_ON_MISMATCH, on_error=_on_error, timeout=TIMEOUT)

SINGLE = Exercise(key="lab04.single", answer="pipeline_forward_backward", run=_run_single,
                  grade=graders.grade_schedule, visible=_SINGLE[0], hidden=_SINGLE[1],
                  rules=_COMMON, **_SCHEDULE_OPTS)

GPIPE = Exercise(key="lab04.gpipe", answer="gpipe_step", run=_run_schedule,
                 grade=graders.grade_schedule, visible=_GPIPE[0], hidden=_GPIPE[1],
                 rules=_COMMON + (Rule("Run all m forward passes before the first backward, then "
                                       "one backward per micro-batch.", rules.gpipe_order),),
                 **_SCHEDULE_OPTS)

ONE_F_ONE_B = Exercise(
    key="lab04.1f1b", answer="one_f_one_b_step", run=_run_schedule, grade=graders.grade_schedule,
    visible=_1F1B[0], hidden=_1F1B[1], **_SCHEDULE_OPTS,
    rules=_COMMON + (
        Rule("Stage r runs min(p − r − 1, m) warm-up forwards, then alternates one forward and one "
             "backward, then runs the remaining backwards: one backward per micro-batch.",
             rules.one_f_one_b_order),
        Rule("Stage r never holds the activations of more than min(p − r, m) micro-batches at once.",
             rules.memory_bound),
        Rule("Release each micro-batch after its backward: drop your references to its input and "
             "output (pop them from your queue), so that at each forward at most one finished "
             "micro-batch is still referenced (by a loop variable).", rules.released_after_backward)))


# ---------------------------------------------------------------- solo exercises
BUBBLE = Exercise(key="lab04.bubble", answer="measured_bubble", run=graders.run_bubble,
                  grade=graders.grade_bubble, visible=graders.BUBBLE_VISIBLE,
                  hidden=graders.BUBBLE_HIDDEN, solo=True)

PREDICTION = Exercise(key="lab04.prediction", answer="predict_pipeline", run=graders.run_prediction,
                      grade=graders.grade_prediction, visible=graders.PREDICT_VISIBLE,
                      hidden=graders.PREDICT_HIDDEN, rules=(Rule(NO_COST_SAYS, no_cost_calls),),
                      solo=True)

EXERCISES = {"single": SINGLE, "gpipe": GPIPE, "1f1b": ONE_F_ONE_B, "bubble": BUBBLE,
             "prediction": PREDICTION}

check_pipeline_forward_backward = checker(SINGLE, """Exercise 1: ``fn(stage, x, y, shape)`` runs
one micro-batch forward and backward through the pipeline; returns the loss on the last stage.""")
check_gpipe = checker(GPIPE, """Exercise 2: ``fn(stage, micro_batches, shape)``, GPipe: every
forward, then every backward; returns the mean loss on the last stage.""")
check_1f1b = checker(ONE_F_ONE_B, """Exercise 3: ``fn(stage, micro_batches, shape)``, 1F1B
(PipeDream-Flush); returns the mean loss on the last stage.""")
check_bubble = checker(BUBBLE, """Exercise 4: ``fn(spans) -> float``, the idle share of a pipeline
step (mean over stages), from traced forward and backward spans.""")
check_prediction = checker(PREDICTION, """Exercise 5: ``fn(p, m, schedule, rank, mb_bytes) ->
(bubble, held_bytes)``.""")
