"""Autograder checks for Lab 02: data parallelism.

Every ``check_*`` runs the student's code on several ranks through ONE
``parlab.launch`` per world size (2 ranks visible, 3 ranks hidden, with
batches divisible by 3), trains a tiny model for a few SGD steps, and
compares each rank, after EVERY step, with a single-process full-batch run
(``parlab.reference.reference_steps``).  SGD, not AdamW: multi-rank
gradients agree with the reference to about 1e-8, and AdamW would magnify
that noise (shared FACTS.md, "Accuracy").

    check_broadcast_parameters(broadcast_parameters)    # ex. 1a
    check_my_batch(my_batch)                            # ex. 1b
    check_allreduce_gradients(allreduce_gradients)      # ex. 2
    check_accumulate(accumulate_and_sync)               # ex. 3
    check_bucketed(BucketedDP)                          # ex. 4
    check_ddp(make_ddp)                                 # ex. 6
    check_train_hf(train_data_parallel)                 # ex. 7

The models are awkward on purpose: parlab's GPT ties ``lm_head`` to
``tok_emb`` (one Parameter used twice), and some cases freeze a parameter
(``requires_grad=False``, so its ``.grad`` stays None).

``run_checks`` grades many answers in one launch per world size; the test
suite uses it to run every wrong answer cheaply.
"""
from __future__ import annotations

import contextlib
import functools
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import check, trace
from ..data import get_batch, microbatches, shard_batch
from ..errors import LaunchError, LaunchTimeout
from ..models import build, lm_loss

__all__ = ["check_broadcast_parameters", "check_my_batch", "check_allreduce_gradients",
           "check_accumulate", "check_bucketed", "check_ddp", "check_train_hf",
           "bucket_plan", "run_checks", "Case", "TIMEOUT"]

#: Seconds per launch.  The process-group timeout is half of it, so an answer
#: whose ranks wait for each other fails in about 45 s instead of hanging.
TIMEOUT = 90.0
#: Rank r builds its model from seed INIT_SEED + r where ranks must start
#: DIFFERENT (so only a broadcast can make them agree); the reference is
#: rank 0's model.  Elsewhere every rank builds from seed 0.
INIT_SEED = 100
DATA_SEED = 3
SMALL = (("n_layer", 2), ("d_model", 32), ("n_head", 2))


@dataclass(frozen=True)
class Case:
    """One test input: a model, which parameters are frozen, and the batch layout."""

    model: str = "gpt"
    overrides: tuple = SMALL
    frozen: tuple = ()
    batch: int = 8  # global batch (all ranks together)
    seq: int = 16
    steps: int = 3
    micro: int = 1  # micro-batches per rank (gradient accumulation)
    bucket_bytes: int = 0
    lr: float = 0.1

    def build(self, seed: int) -> nn.Module:
        model = build(self.model, seed=seed, **dict(self.overrides))
        params = dict(model.named_parameters())
        for name in self.frozen:
            params[name].requires_grad_(False)
        return model

    def describe(self, n: int) -> str:
        what = dict(self.overrides)
        parts = [self.model + (" (tied lm_head/tok_emb)" if self.model == "gpt"
                               and what.get("tie_weights", True) else "")]
        if self.frozen:
            parts.append(f"frozen {', '.join(self.frozen)}")
        parts.append(f"global batch {self.batch}")
        if self.micro > 1:
            parts.append(f"{self.micro} micro-batches per rank")
        if self.bucket_bytes:
            parts.append(f"bucket_bytes {self.bucket_bytes}")
        return ", ".join(parts) + f", world_size {n}"


def bucket_plan(model: nn.Module, bucket_bytes: int) -> list[list[str]]:
    """The buckets of exercise 4, as lists of parameter names.

    The rule: take the parameters that require a gradient, each Parameter
    once (``model.parameters()`` order), REVERSED (backward produces the
    last layers' gradients first).  Put them into buckets in that order; a
    bucket is closed as soon as its gradients total ``bucket_bytes`` or
    more, so a parameter larger than ``bucket_bytes`` gets a bucket of its
    own, and the last bucket may be smaller.  One all-reduce per bucket.
    """
    names = {id(p): n for n, p in model.named_parameters()}
    buckets, current, size = [], [], 0
    for p in reversed([p for p in model.parameters() if p.requires_grad]):
        current.append(names[id(p)])
        size += p.numel() * p.element_size()
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


# ---------------------------------------------------------------- test sets
_FROZEN = ("pos_emb.weight",)
_UNTIED = SMALL + (("tie_weights", False),)
_SETS = {  # exercise: (visible cases at 2 ranks, hidden cases at 3 ranks)
    "broadcast": ([Case(), Case(frozen=_FROZEN)],
                  [Case(overrides=_UNTIED), Case(overrides=(("n_layer", 1), ("d_model", 16)))]),
    "shard": ([Case(batch=8, seq=16), Case(batch=2, seq=4)],
              [Case(batch=6, seq=16), Case(batch=3, seq=5), Case(batch=12, seq=8)]),
    "allreduce": ([Case(batch=8), Case(batch=4, frozen=_FROZEN)],
                  [Case(batch=6), Case(batch=12, overrides=_UNTIED,
                                       frozen=("ln_f.weight", "blocks.0.attn.q.bias"))]),
    "accum": ([Case(batch=8, micro=2), Case(batch=8, micro=4, frozen=_FROZEN)],
              [Case(batch=12, micro=2), Case(batch=6, micro=1),
               Case(batch=12, micro=4, overrides=_UNTIED, frozen=_FROZEN)]),
    "bucketed": ([Case(batch=8, frozen=_FROZEN, bucket_bytes=b) for b in (1 << 30, 16_384, 1)],
                 [Case(batch=6, overrides=_UNTIED, bucket_bytes=b) for b in (4096, 50_000)]
                 + [Case(batch=6, bucket_bytes=256, frozen=_FROZEN)]),  # ln_f.bias + ln_f.weight = 256 B exactly
    "ddp": ([Case(batch=8), Case(batch=4, frozen=_FROZEN)], [Case(batch=6)]),
    "train": ([Case(model="llama", overrides=(), batch=8)],
              [Case(model="llama", overrides=(), batch=6),
               Case(model="gpt2", overrides=(), batch=6, steps=2)]),
}
_NAMES = {"broadcast": "broadcast_parameters", "shard": "my_batch",
          "allreduce": "allreduce_gradients", "accum": "accumulate_and_sync",
          "bucketed": "BucketedDP", "ddp": "make_ddp", "train": "train_data_parallel"}
_HANG_HINT = {
    "allreduce": "every rank must make the same collectives, in the same order, with the same "
                 "sizes; skip a parameter whose .grad is None (frozen) on EVERY rank",
    "accum": "every rank must call sync(model) the same number of times",
    "bucketed": "every rank must launch the same buckets in the same order, and finish() must "
                "wait for every bucket it launched (including a last, partly filled one)",
}


def _rank() -> tuple[int, int]:
    return dist.get_rank(), dist.get_world_size()


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters()}


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Gradients of the trainable parameters (None recorded as None)."""
    return {n: None if p.grad is None else p.grad.detach().cpu().clone()
            for n, p in model.named_parameters() if p.requires_grad}


def _local(case: Case, step: int):
    rank, n = _rank()
    return shard_batch(get_batch(step, case.batch, case.seq, DATA_SEED), rank, n)


def _sgd(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)


# ---------------------------------------------------------------- on the ranks
def _run_broadcast(fn, case: Case):
    model = case.build(INIT_SEED + _rank()[0])
    fn(model)
    return _params(model)


def _run_shard(fn, case: Case):
    x, y = get_batch(0, case.batch, case.seq, DATA_SEED)
    got = fn(x.clone(), y.clone())
    if isinstance(got, (tuple, list)):
        got = tuple(g.detach().cpu().clone() if isinstance(g, torch.Tensor) else g for g in got)
    return got


def _run_allreduce(fn, case: Case):
    model = case.build(0)
    opt, out = _sgd(model, case.lr), []
    for step in range(case.steps):
        x, y = _local(case, step)
        opt.zero_grad(set_to_none=True)
        lm_loss(model, x, y).backward()
        fn(model)
        grads = _grads(model)
        opt.step()
        out.append({"grads": grads, "params": _params(model)})
    return out


def _run_accum(fn, case: Case):
    model = case.build(0)
    opt, out = _sgd(model, case.lr), []
    per_sync = []

    def sync(m: nn.Module) -> None:
        """The course's sync: average every gradient (one all_reduce per parameter)."""
        calls = 0
        for p in m.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
                calls += 1
        per_sync.append(calls)

    for step in range(case.steps):
        x, y = _local(case, step)
        opt.zero_grad(set_to_none=True)
        per_sync.clear()
        with trace.count_collectives() as counter:
            fn(model, microbatches((x, y), case.micro), sync)
        calls = counter.summary().get("all_reduce", {}).get("calls", 0)
        grads = _grads(model)
        opt.step()
        out.append({"grads": grads, "params": _params(model), "syncs": len(per_sync),
                    "all_reduce": calls, "per_sync": per_sync[0] if per_sync else None})
    return out


class _Work:
    """Wraps an async Work and notes whether anyone waited for it."""

    def __init__(self, work, log: dict):
        self._work, self._log = work, log

    def wait(self, *args, **kwargs):
        self._log["waited"] = True
        return self._work.wait(*args, **kwargs)

    def get_future(self):
        self._log["waited"] = True
        return self._work.get_future()

    def __getattr__(self, name):
        return getattr(self._work, name)


@contextlib.contextmanager
def _spy_all_reduce():
    """Record each ``dist.all_reduce``: async or not, launched during backward, waited."""
    original, state = dist.all_reduce, {"in_backward": False, "calls": []}

    def all_reduce(tensor, *args, **kwargs):
        async_op = kwargs.get("async_op", args[2] if len(args) > 2 else False)
        log = {"async": bool(async_op), "in_backward": state["in_backward"], "waited": False}
        state["calls"].append(log)
        work = original(tensor, *args, **kwargs)
        return _Work(work, log) if work is not None else work

    dist.all_reduce = all_reduce
    try:
        yield state
    finally:
        dist.all_reduce = original


def _run_bucketed(cls, case: Case):
    model = case.build(0)
    opt, out = _sgd(model, case.lr), []
    with trace.count_collectives() as counter, _spy_all_reduce() as spy:
        ddp = cls(model, case.bucket_bytes)
        for step in range(case.steps):
            x, y = _local(case, step)
            opt.zero_grad(set_to_none=True)
            spy["calls"].clear()
            before = counter.summary().get("all_reduce", {}).get("calls", 0)
            loss = lm_loss(model, x, y)
            spy["in_backward"] = True
            try:
                loss.backward()
            finally:
                spy["in_backward"] = False
            ddp.finish()
            grads = _grads(model)
            opt.step()
            calls = counter.summary().get("all_reduce", {}).get("calls", 0) - before
            out.append({"grads": grads, "params": _params(model), "all_reduce": calls,
                        "log": [dict(c) for c in spy["calls"]]})
    return out


def _run_ddp(fn, case: Case):
    model = case.build(INIT_SEED + _rank()[0])
    wrapped = fn(model)
    if not isinstance(wrapped, nn.Module):
        raise TypeError(f"make_ddp returned a {type(wrapped).__name__}, not a module")
    opt, out = _sgd(model, case.lr), []
    for step in range(case.steps):
        x, y = _local(case, step)
        opt.zero_grad(set_to_none=True)
        lm_loss(wrapped, x, y).backward()
        grads = _grads(model)
        opt.step()
        out.append({"grads": grads, "params": _params(model)})
    return out


def _run_train(fn, case: Case):
    model = case.build(INIT_SEED + _rank()[0])
    opt, out, rows = _sgd(model, case.lr), [], [0]

    def seen(module, args, kwargs):  # rows this rank's forward passes receive
        idx = args[0] if args else kwargs.get("input_ids", kwargs.get("idx"))
        rows[0] += idx.size(0)

    def before_step(*_):
        out.append({"grads": _grads(model), "rows": rows[0]})
        rows[0] = 0

    model.register_forward_pre_hook(seen, with_kwargs=True)
    opt.register_step_pre_hook(before_step)
    opt.register_step_post_hook(lambda *_: out[-1].update(params=_params(model)))
    fn(model, opt, case.steps, case.batch, case.seq, DATA_SEED)
    return out


_RUNNERS = {"broadcast": _run_broadcast, "shard": _run_shard, "allreduce": _run_allreduce,
            "accum": _run_accum, "bucketed": _run_bucketed, "ddp": _run_ddp, "train": _run_train}


def _on_ranks(tasks: list, catch: bool) -> dict:
    """Run each task (key, exercise, student object, cases); {key: results or error text}."""
    out: dict = {}
    for key, exercise, obj, cases in tasks:
        try:
            out[key] = [_RUNNERS[exercise](obj, case) for case in cases]
        except Exception:  # noqa: BLE001 - only in batch mode; see run_checks
            if not catch:
                raise
            out[key] = "raised " + traceback.format_exc(limit=-4)
    return out


# ---------------------------------------------------------------- in the parent
@functools.lru_cache(maxsize=64)
def _reference(case: Case, seed: int):
    """The single-process run a case is compared with (cached: many answers share it)."""
    from ..reference import reference_steps

    return reference_steps(lambda: case.build(seed), steps=case.steps, batch_size=case.batch,
                           lr=case.lr, seed=DATA_SEED, seq_len=case.seq)


def _scale(got: Mapping, exp: Mapping) -> float | None:
    """Least-squares factor r with got ≈ r·exp over all gradients, or None."""
    names = [k for k in exp if got.get(k) is not None]
    if not names:
        return None
    g = torch.cat([got[k].reshape(-1).double() for k in names])
    e = torch.cat([exp[k].reshape(-1).double() for k in names])
    if not bool((g - (r := float(g @ e / (e @ e))) * e).abs().max() <= 1e-4 * e.abs().max()):
        return None
    return r


def _compare_steps(per_rank: list, ref, n: int, hint: Callable[[int, int, list], str]) -> str | None:
    """First difference between the ranks' per-step grads/params and the reference."""
    for r, steps in enumerate(per_rank):
        if len(steps) != len(ref.steps):
            return (f"rank {r} took {len(steps)} optimizer steps, expected {len(ref.steps)}.")
    for s, want in enumerate(ref.steps):
        for r, steps in enumerate(per_rank):
            for what in ("grads", "params"):
                got = steps[s].get(what)
                if got is None:
                    continue
                try:
                    if what == "grads":
                        missing = [k for k, v in got.items() if v is None and k in want.grads]
                        if missing:
                            raise AssertionError(f"rank {r}: {len(missing)} trainable parameters "
                                                 f"have no gradient (None), e.g. '{missing[0]}'. "
                                                 "Write the result back into p.grad.")
                        got = {k: v for k, v in got.items() if v is not None}
                        check.assert_grads_match(got, want.grads, rank=r, world_size=n)
                    else:
                        check.assert_params_match(got, want.params, rank=r)
                except AssertionError as err:
                    label = "gradients used by" if what == "grads" else "parameters after"
                    extra = hint(s, r, per_rank)
                    return (f"the {label} step {s + 1} do not match the single-process "
                            f"full-batch reference.\n{err}" + (f"\nHint: {extra}" if extra else ""))
    return None


def _differs(a: Mapping, b: Mapping) -> bool:
    return any(not torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-6) for k in b if k in a)


@functools.lru_cache(maxsize=64)
def _initial(case: Case, seed: int) -> dict[str, torch.Tensor]:
    return _params(case.build(seed))


def _grade_broadcast(name, n, cases, per_rank):
    for i, case in enumerate(cases):
        inits = [_initial(case, INIT_SEED + r) for r in range(n)]
        for r in range(n):
            got = per_rank[r][i]
            try:
                check.assert_params_match(got, inits[0], rank=r)
            except AssertionError as err:
                if not _differs(got, inits[r]) and r:
                    hint = (f"rank {r} still holds its own initial parameters: nothing reached it "
                            "(every rank must call dist.broadcast(p.data, src=0) for every parameter).")
                elif any(not _differs(got, inits[s]) for s in range(1, n)):
                    src = next(s for s in range(1, n) if not _differs(got, inits[s]))
                    hint = (f"rank {r} holds rank {src}'s initial parameters: the broadcast came "
                            f"from rank {src}, but the source must be rank 0 (src=0).")
                elif all(not _differs(per_rank[s][i], per_rank[0][i]) for s in range(n)):
                    hint = ("all ranks agree, but not with rank 0's initial values: averaged "
                            "(all_reduce) instead of copying rank 0's parameters (broadcast)?")
                else:
                    hint = "copy rank 0's values into every parameter, in place."
                return f"{name} is wrong for {case.describe(n)}.\n{err}\nHint: {hint}"
    return None


def _grade_shard(name, n, cases, per_rank):
    for i, case in enumerate(cases):
        x, y = get_batch(0, case.batch, case.seq, DATA_SEED)
        for r in range(n):
            got, (wx, wy) = per_rank[r][i], shard_batch((x, y), r, n)
            where = f"{name}(x, y) for {case.describe(n)}, on rank {r}"
            if not (isinstance(got, tuple) and len(got) == 2
                    and all(isinstance(t, torch.Tensor) for t in got)):
                return f"{where} returned {type(got).__name__}; it should return a pair (x_local, y_local)."
            gx, gy = got
            if gx.shape == x.shape and n > 1:
                return (f"{where} returned the whole batch ({tuple(gx.shape)}): every rank "
                        f"would train on all {case.batch} rows. Give rank r only its "
                        f"{case.batch // n} rows.")
            if gx.shape != wx.shape or gy.shape != wy.shape:
                return f"{where} returned x of shape {tuple(gx.shape)}, expected {tuple(wx.shape)}."
            if torch.equal(gx, wx) and torch.equal(gy, wy):
                continue
            if torch.equal(gx, x[r::n]):
                hint = ("you took every n-th row (strided, like DistributedSampler); this lab uses "
                        "contiguous blocks: rank r gets rows r*B/n .. (r+1)*B/n.")
            elif torch.equal(gx, wx):
                hint = "x is right but y is not: split y exactly like x."
            elif any(torch.equal(gx, shard_batch(x, s, n)) for s in range(n)):
                s = next(s for s in range(n) if torch.equal(gx, shard_batch(x, s, n)))
                hint = f"that is rank {s}'s block; rank {r} gets block number {r}."
            else:
                hint = "rank r gets rows r*B/n .. (r+1)*B/n of x and of y."
            return f"{where} returned the wrong rows. Hint: {hint}"
    return None


def _grade_trained(exercise: str):
    seed = INIT_SEED if exercise in ("ddp", "train") else 0

    def grade(name, n, cases, per_rank):
        for i, case in enumerate(cases):
            runs = [out[i] for out in per_rank]
            pre = _pre_checks(exercise, case, n, runs)
            if pre is None:
                ref = _reference(case, seed)
                pre = _compare_steps(runs, ref, n, _hints(exercise, case, n, ref))
            if pre:
                return f"{name} is wrong for {case.describe(n)}: {pre}"
        return None
    return grade


def _pre_checks(exercise: str, case: Case, n: int, runs: list) -> str | None:
    """Collective counts and waits, checked before the numbers."""
    if exercise == "accum":
        for r, steps in enumerate(runs):
            st = steps[0]
            if st["syncs"] == 0 and st["all_reduce"] == 0:
                return ("sync(model) was never called: the ranks' gradients were never averaged. "
                        "Call it once, after the LAST micro-batch's backward.")
            if st["syncs"] != 1:
                return (f"rank {r} called sync(model) {st['syncs']} times in one step with "
                        f"{case.micro} micro-batches; sync only on the last micro-step (once per "
                        "step): syncing on every micro-step sends the gradients "
                        f"{st['syncs']} times for nothing.")
            if st["all_reduce"] != st["per_sync"]:
                return (f"rank {r} made {st['all_reduce']} all_reduce calls in one step, but one "
                        f"sync makes {st['per_sync']}: do not all-reduce anything yourself, "
                        "call sync(model) once.")
    if exercise == "train":
        for r, steps in enumerate(runs):
            for s, st in enumerate(steps):
                if st["rows"] != case.batch // n:
                    return (f"in step {s + 1}, rank {r}'s forward passes saw {st['rows']} rows of "
                            f"the global batch of {case.batch}; its share is {case.batch // n} "
                            "rows (use my_batch: each rank trains on its own block).")
    if exercise == "bucketed":
        model = case.build(0)
        plan = bucket_plan(model, case.bucket_bytes)
        for r, steps in enumerate(runs):
            for s, st in enumerate(steps):
                where = f"rank {r}, step {s + 1}"
                if st["all_reduce"] != len(plan):
                    sizes = [sum(dict(model.named_parameters())[p].numel() * 4 for p in b)
                             for b in plan]
                    return (f"{where}: {st['all_reduce']} all_reduce calls, expected {len(plan)} "
                            f"(one per bucket; with bucket_bytes={case.bucket_bytes} the rule "
                            f"gives buckets of {sizes[:8]}{' ...' if len(sizes) > 8 else ''} "
                            "bytes). Hint: trainable parameters in reverse order; close a bucket "
                            "as soon as it holds >= bucket_bytes; frozen parameters never get a "
                            "gradient and belong to no bucket."
                            + (" On step 1 it was right: reset your bucket state after each step "
                               "(in finish())." if s and steps[0]["all_reduce"] == len(plan) else ""))
                log = st["log"]
                if any(not c["async"] for c in log):
                    return (f"{where}: all_reduce was called without async_op=True, so backward "
                            "stops until each bucket is sent. Launch it with async_op=True and "
                            "keep the returned work to wait on in finish().")
                late = sum(not c["in_backward"] for c in log)
                if late:
                    return (f"{where}: {late} of {len(log)} bucket all-reduces were launched after "
                            "backward returned (in finish()?). Launch each bucket from the gradient "
                            "hook as soon as its last gradient arrives, so the communication "
                            "overlaps the rest of backward.")
                if any(not c["waited"] for c in log):
                    return (f"{where}: {sum(not c['waited'] for c in log)} async all-reduces were "
                            "never waited on: finish() must call work.wait() on every bucket before "
                            "the optimizer uses the gradients, or it may read half-reduced values.")
    return None


def _hints(exercise: str, case: Case, n: int, ref) -> Callable:
    def hint(s: int, r: int, per_rank: list) -> str:
        st = per_rank[r][s]
        ratio = _scale(st.get("grads") or {}, ref.steps[s].grads) if st.get("grads") else None
        k = case.micro
        if ratio is not None and k > 1 and abs(ratio - k) < 1e-3 * k:
            return (f"every gradient is {k}x the reference: divide each micro-batch loss by the "
                    f"number of micro-batches ({k}) before backward.")
        if ratio is not None and k > 1 and abs(ratio * k - 1) < 1e-3:
            return (f"every gradient is 1/{k} of the reference: you divided by the number of "
                    f"micro-batches ({k}) twice.")
        if ratio is not None and abs(ratio - n) < 1e-3 * n:
            return (f"summed, not averaged: after the all_reduce (a SUM) divide by the world size "
                    f"{n}, or use ReduceOp.AVG.")
        if ratio is not None and abs(ratio * n - 1) < 1e-3:
            return (f"every gradient is 1/{n} of the reference: divided by the world size twice "
                    "(ReduceOp.AVG already divides).")
        grads = [p[s].get("grads") or {} for p in per_rank]
        if n > 1 and any(_differs(g, grads[0]) for g in grads[1:] if g and grads[0]):
            if exercise in ("ddp", "train"):
                return ("the ranks used different gradients: were they synchronised (all-reduced)"
                        " at all?")
            missing = "the ranks used different gradients: some were never all-reduced"
            if exercise == "bucketed":
                return (missing + ", or the reduced values never reached p.grad: torch.cat makes "
                        "a copy, so copy the bucket back into each p.grad after work.wait().")
            if exercise == "allreduce":
                return (missing + ", or the reduced values never reached p.grad: torch.cat makes "
                        "a copy, so copy the result back into each p.grad.")
            return missing + "."
        if s == 0 and exercise in ("ddp", "train"):
            return ("the ranks start from different random weights: only rank 0's initial "
                    "parameters are the reference, so they must be broadcast first.")
        return ""
    return hint


_GRADERS = {"broadcast": _grade_broadcast, "shard": _grade_shard}
_GRADERS.update({ex: _grade_trained(ex) for ex in ("allreduce", "accum", "bucketed", "ddp", "train")})


def _launch(fn, **kw):
    from ..launcher import launch

    return launch(fn, **kw)


def run_checks(batch: Mapping[str, Mapping[str, object]], *, hidden: bool = False,
               timeout: float = TIMEOUT, catch: bool = True) -> dict[tuple[str, str], str | None]:
    """Grade many answers, ``{exercise: {name: student object}}``, in one launch.

    Exercises: "broadcast", "shard", "allreduce", "accum", "bucketed", "ddp",
    "train".  Returns {(exercise, name): None if it passed, else the message}.
    With ``catch`` an exception in one answer is recorded instead of ending
    the launch.  A hang or crash of the launch raises ``AssertionError``.
    """
    n = 3 if hidden else 2
    tasks = [((ex, name), ex, obj, _SETS[ex][1 if hidden else 0])
             for ex, objs in batch.items() for name, obj in objs.items()]
    report = {key: None for key, *_ in tasks}
    try:
        per_rank = _launch(_on_ranks, args=(tasks, catch), nproc=n, timeout=timeout)
    except LaunchError as err:
        hang = isinstance(err, LaunchTimeout) or "Timed out" in str(err) \
            or "Connection closed" in str(err) or "doesn't match expected size" in str(err)
        names = ", ".join(name for (_, name), *_ in tasks)
        hints = [_HANG_HINT[ex] for ex in batch if ex in _HANG_HINT]
        if hang:
            what = "did not finish: the ranks waited for each other (or one gave up waiting)"
        else:
            what = "raised an error"
            text = str(err) + getattr(err, "remote_traceback", "")
            if "NoneType" in text or "None" in text and "grad" in text:
                hints = ["a frozen parameter (requires_grad=False) has p.grad None: skip it"]
        raise AssertionError(f"{names} {what} on {n} ranks.\n"
                             + "".join(f"Hint: {h}.\n" for h in (hints if hang or hints else []))
                             + f"\n{err}") from None
    for key, ex, _, cases in tasks:
        results = [out[key] for out in per_rank]
        raised = [(r, t) for r, t in enumerate(results) if isinstance(t, str)]
        if raised:
            r, text = raised[0]
            hint = ""
            if "NoneType" in text and ex in ("allreduce", "bucketed", "accum"):
                hint = ("\nHint: a frozen parameter (requires_grad=False) has p.grad None: skip "
                        "it (and register no hook on it).")
            report[key] = f"{key[1]} {text.splitlines()[0]} on rank {r}:\n{text}{hint}"
        else:
            report[key] = _GRADERS[ex](key[1], n, cases, results)
    return report


def _check(exercise: str, obj, hidden: bool, timeout: float) -> None:
    if not callable(obj):
        raise AssertionError(f"expected your {_NAMES[exercise]}, got a {type(obj).__name__}")
    name = getattr(obj, "__name__", _NAMES[exercise])
    msg = run_checks({exercise: {name: obj}}, hidden=hidden, timeout=timeout,
                     catch=False)[(exercise, name)]
    if msg:
        raise AssertionError(msg)
    cases = _SETS[exercise][1 if hidden else 0]
    print(f"{name}: {len(cases)} {'hidden' if hidden else 'visible'} cases passed on "
          f"{3 if hidden else 2} ranks")


# ---------------------------------------------------------------- public checks
def check_broadcast_parameters(fn: Callable, *, hidden: bool = False, timeout: float = TIMEOUT) -> None:
    """Ex. 1a: ``fn(model)`` copies rank 0's parameters into every rank's model, in place."""
    _check("broadcast", fn, hidden, timeout)


def check_my_batch(fn: Callable, *, hidden: bool = False, timeout: float = TIMEOUT) -> None:
    """Ex. 1b: ``fn(x, y)`` returns this rank's contiguous block of rows of x and of y."""
    _check("shard", fn, hidden, timeout)


def check_allreduce_gradients(fn: Callable, *, hidden: bool = False, timeout: float = TIMEOUT) -> None:
    """Ex. 2: after backward, ``fn(model)`` leaves the average over ranks in every ``p.grad``."""
    _check("allreduce", fn, hidden, timeout)


def check_accumulate(fn: Callable, *, hidden: bool = False, timeout: float = TIMEOUT) -> None:
    """Ex. 3: ``fn(model, micro_batches, sync)`` accumulates and calls ``sync`` once, at the end."""
    _check("accum", fn, hidden, timeout)


def check_bucketed(cls: Callable, *, hidden: bool = False, timeout: float = TIMEOUT) -> None:
    """Ex. 4: ``cls(model, bucket_bytes)`` all-reduces buckets from gradient hooks; ``finish()`` waits."""
    _check("bucketed", cls, hidden, timeout)


def check_ddp(fn: Callable, *, hidden: bool = False, timeout: float = TIMEOUT) -> None:
    """Ex. 6: ``fn(model)`` returns the model wrapped in torch's DistributedDataParallel."""
    _check("ddp", fn, hidden, timeout)


def check_train_hf(fn: Callable, *, hidden: bool = False, timeout: float = TIMEOUT) -> None:
    """Ex. 7: ``fn(model, optimizer, steps, batch_size, seq_len, seed)`` trains data-parallel."""
    _check("train", fn, hidden, timeout)
