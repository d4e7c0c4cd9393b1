"""Lab 04, exercises 1-3: one micro-batch, GPipe and 1F1B, their cases, runner, grader and hints.

Rank r runs stage r of an untied parlab GPT cut into world_size stages
(``parlab.parallel.pp_stages.gpt_stage``).  The answer gets this rank's stage,
the micro-batches as (x, y) pairs (one pair for exercise 1) and ``shape``, one
activation's shape.  The runner trains a few SGD steps; after every step each
stage's gradients and parameters, and the last stage's loss, are compared with
``parlab.reference.reference_steps`` on the whole batch (its ``grad_accum``
splits the batch into the same micro-batches).  Hints name the common
mistakes: a loss not divided by m, gradients that hold only the last
micro-batch (not accumulated), a stage whose parameters got none, and, when a
stage's gradients are wrong, which stages are, and what the gradient that
reached the first wrong one on the way back was, when one known mistake gives
exactly its gradients (another stage's gradient passed on, another
micro-batch's gradient: ``_received``); a changed parameter names the
optimizer step the answer made.

The runner also notes, for ``rules``, the start of each step, each forward
(with how many finished micro-batches were still referenced) and the
activation bytes held.  Hints read plain results only and never raise,
whatever a rank returned.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch

from ... import check
from ...data import get_batch, microbatches
from ...launch.runtime import device
from ...models import lm_loss, tiny_gpt
from ...parallel.pp_stages import gpt_stage, held_activations
from ..harness import Graded
from ..diagnosis import diagnose, ratio_words, scale_fits
from ..numbers import number_message
from ..plain import plain
from ..records import events
from ..records import steps as cut_steps

# The seeds of every lab 04 case: the model's initial weights and the batches.
INIT_SEED, DATA_SEED = 5, 11

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
        """(b/m, s, d): one micro-batch's activation, as it travels between stages."""
        return (self.batch // self.m, self.seq, self.d_model)

    def batches(self, step: int) -> list:
        """m pairs (x, y), each (b/m, s) token ids: this step's batch cut into micro-batches."""
        x, y = get_batch(step, self.batch, self.seq, DATA_SEED)  # (b, s) each
        return [(a.clone(), b.clone()) for a, b in microbatches((x, y), self.m)]

    def describe(self, n: int) -> str:
        mb = f"{self.m} micro-batch{'es' if self.m > 1 else ''} of shape {self.shape()}"
        steps = f", {self.steps} SGD steps" if self.steps > 1 else ""
        return f"{n} stages ({self.n_layer} blocks), {mb}{steps}, world_size {n}"


# ---------------------------------------------------------------- test sets
# Visible sets on 4 stages hold the commonest traps: an uneven split of the
# blocks (5 over 4), fewer micro-batches than stages (the 1F1B warm-up is
# cut short), and as many as stages.
# Hidden sets use one world size each (one launch per check): 2 stages for Exercises 1 and 2,
# 3 for Exercise 3.
SINGLE_VISIBLE = ((4, (Case(), Case(n_layer=5, batch=3))),)
SINGLE_HIDDEN = ((2, (Case(n_layer=3, batch=2), Case(n_layer=2, batch=1, seq=5))),)
GPIPE_VISIBLE = ((4, (Case(m=4, batch=8, steps=3), Case(m=2, batch=4, steps=2, n_layer=5))),)
GPIPE_HIDDEN = ((2, (Case(m=3, batch=6, steps=3), Case(m=1, batch=2, steps=2), Case(m=5, batch=5, n_layer=3))),)
ONE_F_ONE_B_VISIBLE = ((4, (Case(m=8, batch=8, steps=3), Case(m=3, batch=6, steps=2),
                            Case(m=4, batch=4, n_layer=5))),)
ONE_F_ONE_B_HIDDEN = ((3, (Case(m=6, batch=6, steps=2, n_layer=3), Case(m=2, batch=4), Case(m=1, batch=2),
                           Case(m=5, batch=5, steps=2))),)


# ---------------------------------------------------------------- on the ranks
def _flat_cpu(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).float().cpu() for t in tensors])


def _plain_loss(x):
    """The returned loss: a float (from a number or a one-element tensor), None, or "<TypeName>"."""
    return plain(x, keep=(float,), tensors="number", containers=(), as_float=True, other="name")


def _one_microbatch_bytes(stage, case: Case) -> int:
    """Bytes autograd holds for one micro-batch on this stage (measured on a copy of its input)."""
    x, y = case.batches(0)[0]  # (b/m, s) token ids each
    inp = (x.to(device()) if stage.is_first else  # (b/m, s, d): the previous stage's activation
           torch.zeros(case.shape(), device=device(), requires_grad=True))
    with held_activations(*stage.parameters()) as held:
        out = stage(inp)  # (b/m, s, d), or (b/m, s, vocab) logits on the last stage
        if stage.is_last:
            out = stage.loss(out, y.to(device()))
        bytes_ = held.bytes
        del out
    return bytes_


def run(fn, case: Case, i: int, spy, single: bool = False) -> list:
    """Exercises 2 and 3 (and 1, with ``single``): ``case.steps`` SGD steps of this rank's stage."""
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
        micro = [(x.to(device()), y.to(device())) for x, y in case.batches(step)]  # m × ((b/m, s), (b/m, s))
        opt.zero_grad(set_to_none=True)
        spy.note("step")
        with held_activations(*stage.parameters()) as held, spy.watch(), _callers_own(spy):
            got = fn(stage, *micro[0], case.shape()) if single else fn(stage, micro, case.shape())
        named = list(stage.named_parameters())
        grads = {"flat": _flat_cpu(torch.zeros_like(p) if p.grad is None else p.grad for _, p in named),
                 "none": [k for k, p in named if p.grad is None]}
        spy.note("held", peak=held.peak, per_mb=per_mb)
        opt.step()
        out.append({"loss": _plain_loss(got), "grads": grads, "params": _flat_cpu(p for _, p in named)})
    return out


@contextlib.contextmanager
def _callers_own(spy):
    """Note every ``zero_grad`` (of a module or an optimizer) and every optimizer step the answer
    makes: the caller zeroes the gradients and steps."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    step_hook = register_optimizer_step_pre_hook(
        lambda opt, args, kwargs: spy.note("optimizer_step", what=type(opt).__name__))
    originals = {cls: cls.zero_grad for cls in (torch.nn.Module, torch.optim.Optimizer)}

    def noting(cls):
        def zero_grad(self, *args, **kwargs):
            spy.note("zero_grad", what=f"{type(self).__name__}.zero_grad")
            return originals[cls](self, *args, **kwargs)
        return zero_grad

    for cls in originals:
        cls.zero_grad = noting(cls)
    try:
        yield
    finally:
        step_hook.remove()
        for cls, original in originals.items():
            cls.zero_grad = original


def run_single(fn, case, i, spy):
    """Exercise 1: one micro-batch, ``fn(stage, x, y, shape)``."""
    return run(fn, case, i, spy, single=True)


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


# ---------------------------------------------------------------- hints
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


#: What the three schedule exercises share besides their runner and grader: hints and time limit.
OPTIONS = dict(on_hang=_ON_HANG, on_mismatch=_ON_MISMATCH, on_error=_on_error, timeout=TIMEOUT)


# ---------------------------------------------------------------- the grader
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


def _flat_named(named: dict, layout) -> torch.Tensor:
    return torch.cat([named[k].reshape(-1).float() for k, _ in layout])


def _unflat(vector, layout) -> dict:
    sizes = [shape.numel() for _, shape in layout]
    if not isinstance(vector, torch.Tensor) or vector.numel() != sum(sizes):
        return {}
    return {k: t.view(shape) for (k, shape), t in zip(layout, torch.split(vector, sizes))}


def step_of(record: dict, s: int) -> dict:
    """Step ``s`` (from 0) of a rank's record, cut at the "step" event the runner notes at each start."""
    cut = cut_steps(record, "step", opens=True)
    return cut[s] if s < len(cut) else {"events": [], "calls": [], "backward": 0}


def _stage_message(case, n: int, s: int, r: int, st: dict, layout, stages: list | None = None,
                   record: dict | None = None) -> str | None:
    ref = _reference(case).steps[s]
    want_g, want_p = _flat_named(ref.grads, layout), _flat_named(ref.params, layout)
    none = st["grads"]["none"]
    if not none and check.same_values(st["grads"]["flat"], want_g):
        if check.same_values(st["params"], want_p):
            return None
        stepped = [e["what"] for e in events(step_of(record, s), "optimizer_step")] if record else []
        return (f"stage {r}'s gradients of step {s + 1} are right but its parameters after the step "
                "are not" + (f" (stage {r} called {stepped[0]}.step() during step {s + 1})" if stepped else "")
                + ": leave the optimizer and the parameters to the caller.")
    where = f"stage {r} (rank {r}), step {s + 1}"
    if none:
        return (f"{where}: {len(none)} parameters of this stage have no gradient (None), e.g. "
                f"'{none[0]}': backward never reached them. Every stage runs backward for every "
                "micro-batch: the last one on its loss, the others on their output with the "
                "gradient received from the next stage.")
    got = _unflat(st["grads"]["flat"], layout)
    want = {k: ref.grads[k] for k, _ in layout}
    scale = check.grad_scale(got, want)
    if scale and abs(scale - 1) > 1e-3:
        # a factor names a mistake only when no other known mistake gives it (m = p, or m = 1)
        named = diagnose([scale_fits(scale, [
            ("not divided", case.m, f"Divide each micro-batch's loss by m = {case.m} before backward: "
                                    "the step's loss is the MEAN over micro-batches."),
            ("m twice", 1 / case.m, "you divided by m twice."),
            ("by p", case.m / n, f"you divided each micro-batch's loss by the number of stages p = {n}, "
                                 f"not by the m = {case.m} micro-batches.")] if case.m > 1 else [])])
        if named:
            return f"{where}: every gradient is {ratio_words(scale)} the reference. {named[0].upper()}{named[1:]}"
        if case.m > 1:
            return (f"{where}: every gradient is {ratio_words(scale)} the single-process reference: the "
                    "same direction, a different scale (how each micro-batch's loss is scaled before "
                    "its backward sets it).")
    if s == 0 and case.m > 1:
        last = {k: v for k, v in _last_only(case).items() if k in want}
        if check.grad_scale(got, last) is not None:
            return (f"{where}: the gradients hold only the LAST micro-batch's contribution. "
                    "backward adds into p.grad: do not zero the gradients (or overwrite p.grad) "
                    "between micro-batches, let them accumulate over all m.")
    try:
        check.assert_grads_match(got, want, rank=r)
    except AssertionError as err:
        return (f"{where}: the gradients do not match the single-process reference.\n{err}"
                + _origin(case, n, s, stages))
    return f"{where}: the gradients do not match the single-process reference."


def _origin(case, n: int, s: int, stages: list | None) -> str:
    """Which stages' gradients are wrong in step ``s``, and what the gradient that reached the last of
    them (the first on the way back) was, when one known mistake explains it (``_received``)."""
    if not stages:
        return ""
    ref, layouts = _reference(case).steps[s], _names(case, n)
    wrong = [q for q, st in enumerate(stages)
             if not check.same_values(st["grads"]["flat"], _flat_named(ref.grads, layouts[q]))]
    if not wrong:
        return ""
    q = wrong[-1]
    text = (f"\nIn step {s + 1}, the gradients of {_stages_phrase(wrong)} differ from the reference and "
            f"those of {_stages_phrase([k for k in range(n) if k not in wrong]) or 'no stage'} match: the "
            f"first wrong stage on the way back is stage {q}")
    if q == n - 1 or s > 0:  # the last stage's gradients come from its own loss, not from a message
        return text + "."
    named = diagnose([_received(case, n, q, stages[q]["grads"]["flat"])])
    return text + (f": {named}" if named else
                   ", so the gradient it received for its output, or its own backward, differs.")


def _stages_phrase(stages: list) -> str:
    return check.ranks_phrase(stages).replace("rank", "stage") if stages else ""


def _received(case, n: int, q: int, flat) -> dict:
    """The known mistakes in the gradient stage ``q`` (not the last) received for its output whose
    result, in step 1, is ``flat``, its gradients: another stage's gradient passed on, or another
    micro-batch's gradient; ``{name: sentence}`` of those that give exactly ``flat``."""
    model = case.build()
    parts = [gpt_stage(model, n, k) for k in range(n)]
    outs, grads = [], []  # per micro-batch: stage q's output, and the gradient at each stage's output
    for x, y in case.batches(0):
        acts, a = [], x  # x: (b/m, s) token ids; each stage's output: (b/m, s, d)
        for stage in parts[:-1]:
            a = stage(a)
            acts.append(a)
        loss = parts[-1].loss(parts[-1](a), y) / case.m
        grads.append(torch.autograd.grad(loss, acts, retain_graph=True))
        outs.append(acts[q])
    layout, params = _names(case, n)[q], dict(parts[q].named_parameters())

    def backward_with(pick) -> torch.Tensor:
        """Stage q's gradients when micro-batch j's output gets the gradient ``pick(j)``."""
        total = {k: torch.zeros_like(p) for k, p in params.items()}
        for j, out in enumerate(outs):
            got = torch.autograd.grad(out, list(params.values()), pick(j), retain_graph=True, allow_unused=True)
            for k, g in zip(params, got):
                if g is not None:
                    total[k] += g
        return _flat_named(total, layout)

    fits = {}
    for k in range(q + 1, n - 1):  # the gradient at stage k's output, passed on by stages q+1 .. k
        if check.same_values(flat, backward_with(lambda j: grads[j][k])):
            fits["passed on"] = (f"its gradients are what backward gives when the gradient it received is "
                                 f"the one at stage {k}'s output, not at its own: "
                                 f"{_stages_phrase(list(range(q + 1, k + 1)))} sent back the gradient "
                                 "{} received instead of the gradient of {} INPUT (the tensor received and "
                                 "called requires_grad_() on).".format(*(("it", "its") if k == q + 1
                                                                         else ("they", "their"))))
    m = case.m
    orders = {}
    for name, perm in (("in reverse order", [m - 1 - j for j in range(m)]),
                       ("one micro-batch later", [(j + 1) % m for j in range(m)]),
                       ("one micro-batch earlier", [(j - 1) % m for j in range(m)])):
        orders.setdefault(tuple(perm), name)
    for perm, name in orders.items():
        if m > 1 and check.same_values(flat, backward_with(lambda j: grads[perm[j]][q])):
            fits["other micro-batch"] = (f"its gradients are what backward gives when each micro-batch's "
                                         f"output gets another micro-batch's gradient ({name}: micro-batch "
                                         f"{perm[0]}'s for micro-batch 0): run each backward with the "
                                         "gradient the next stage sent for the same micro-batch, in the "
                                         "order it sends them.")
    return fits


def _loss_message(case, s: int, got) -> str | None:
    want = _reference(case).steps[s].loss
    call = f"the loss your function returned on the last stage in step {s + 1}"
    if got is None:
        return f"{call} is None: return the mean loss over the micro-batches on the last stage."
    if isinstance(got, str):
        return f"{call} is a {got.strip('<>')}: return a number or a 0-d tensor."
    mistakes = [(want * case.m, f"That is the SUM of the {case.m} micro-batch losses: return their mean.")]
    return number_message(got, want, call, mistakes if case.m > 1 else (), rtol=1e-5)


def grade(g: Graded) -> str | None:
    for i, case in enumerate(g.cases):
        if i >= min(len(r) for r in g.results):
            break
        layouts, runs = _names(case, g.n), g.at(i)
        for r, steps in enumerate(runs):
            if not isinstance(steps, list) or len(steps) != case.steps:
                return f"{g.name} is wrong for {case.describe(g.n)}: stage {r} did not finish its steps."
        for s in range(case.steps):
            for r in range(g.n):
                msg = _stage_message(case, g.n, s, r, runs[r][s], layouts[r], [run[s] for run in runs],
                                     g.records[r][i] if g.records else None)
                if msg:
                    return f"{g.name} is wrong for {case.describe(g.n)}.\n{msg}"
            msg = _loss_message(case, s, runs[g.n - 1][s]["loss"])
            if msg:
                return f"{g.name} is wrong for {case.describe(g.n)}: {msg}"
    return None
