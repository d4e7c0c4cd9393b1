"""Lab 04's rules for exercises 1-3, as the notebook states them, judged on the spy's records.

A record holds every dist call (op, peer, elements) and the events the
runner noted: "step" at the start of each training step, "forward" each
time the stage's forward ran and "held" after the step's passes, each
carrying the number of backward passes (and dist calls) seen so far.
``parlab.grading.records.steps`` cuts a record at each "step"; from a step the
rules read the messages sent and the order of forwards and backwards.
"""
from __future__ import annotations

import math

from ...cost import activations_held
from ...parallel.pp_schedule import warmup_forwards
from ..harness import Rule
from ..records import calls, describe, events, first, steps
from ..spy import COLLECTIVES


def _steps(record: dict) -> list[dict]:
    """The record's training steps, each opened by its "step" event (``records.steps``)."""
    return steps(record, "step", opens=True)


def _forwards(step: dict) -> list[int]:
    """For each forward of the step, how many of the step's backward passes had begun before it."""
    start = step["events"][0]["backward"]  # the "step" event that opens it
    return [e["backward"] - start for e in events(step, "forward")]


def no_collective(records, case, n):
    for r, rec in enumerate(records):
        if hit := first(rec, *COLLECTIVES):
            return f"stage {r} called {describe(rec, hit)}."
    return None


def messages(records, case, n):
    numel = math.prod(case.shape())
    for r, rec in enumerate(records):
        for s, step in enumerate(_steps(rec)):
            sends = calls(step, "send", "isend")
            for c in sends:
                if c["numel"] != numel:
                    what = " (the loss?)" if c["numel"] == 1 else ""
                    return (f"stage {r} sent {c['numel']} elements{what} to stage {c['peer']}; every "
                            f"message is one activation or gradient of shape {case.shape()} "
                            f"({numel} elements), and the loss stays on the last stage.")
                neighbours = [q for q in (r - 1, r + 1) if 0 <= q < n]
                if c["peer"] not in neighbours:
                    return (f"stage {r} sent a message to stage {c['peer']}; a stage talks only to "
                            f"its neighbour{'s' if len(neighbours) > 1 else ''} "
                            f"{' and '.join(map(str, neighbours))}.")
            ahead = sum(c["peer"] == r + 1 for c in sends)
            back = sum(c["peer"] == r - 1 for c in sends)
            want_ahead = 0 if r == n - 1 else case.m
            want_back = 0 if r == 0 else case.m
            if ahead != want_ahead:
                return (f"in step {s + 1}, stage {r} sent {ahead} messages to stage {r + 1}, expected "
                        f"{want_ahead} (one activation per micro-batch"
                        + (", and the last stage sends nothing forward)." if r == n - 1 else ")."))
            if back != want_back:
                return (f"in step {s + 1}, stage {r} sent {back} messages back to stage {r - 1}, expected "
                        f"{want_back} (one input gradient per micro-batch"
                        + (", and stage 0 has no stage before it)." if r == 0 else ")."))
    return None


def _order(records, case, n, schedule: str):
    what = {"gpipe": "in GPipe", "1f1b": "in 1F1B"}[schedule]
    for r, rec in enumerate(records):
        w = warmup_forwards(n, case.m, r, schedule)
        want = [max(0, k - w) for k in range(case.m)]
        for s, step in enumerate(_steps(rec)):
            got = _forwards(step)
            if len(got) != case.m:
                return f"in step {s + 1}, stage {r} ran its forward {len(got)} times for {case.m} micro-batches."
            if step["backward"] != case.m:
                return (f"in step {s + 1}, stage {r} ran {step['backward']} backward passes for "
                        f"{case.m} micro-batches: call backward once per micro-batch.")
            if got != want:
                before = sum(1 for b in got if b == 0)
                expected = min(case.m, w + 1)
                if before != expected:
                    return (f"stage {r} ran {before} forwards before its first backward; {what} on "
                            f"{n} stages with m = {case.m}, stage {r} runs {expected}"
                            + (f" (p − r − 1 = {n - r - 1} warm-up forwards, then the first forward "
                               "of the steady phase)." if schedule == "1f1b" else ".")
                            + f" Its forwards came after {got} backwards.")
                k = next(k for k in range(case.m) if got[k] != want[k])
                return (f"after the warm-up, stage {r} must alternate one forward and one backward: its "
                        f"forward of micro-batch {k} came after {got[k]} backwards, expected {want[k]}.")
    return None


def gpipe_order(records, case, n):
    return _order(records, case, n, "gpipe")


def one_f_one_b_order(records, case, n):
    return _order(records, case, n, "1f1b")


def memory_bound(records, case, n):
    for r, rec in enumerate(records):
        allowed = activations_held(n, case.m, "1f1b", r)  # min(p − r, m)
        for s, step in enumerate(_steps(rec)):
            noted = events(step, "held")
            if not noted or not noted[-1]["per_mb"]:
                continue
            held = noted[-1]
            if held["peak"] > allowed * held["per_mb"]:
                return (f"in step {s + 1}, stage {r} held {held['peak']} bytes of activations at once, "
                        f"{held['peak'] / held['per_mb']:.2f} micro-batches' worth ({held['per_mb']} bytes "
                        f"each); 1F1B holds at most min(p − r, m) = {allowed}. Free each micro-batch's "
                        "graph with its backward (no retain_graph=True).")
    return None


def released_after_backward(records, case, n):
    """1F1B: before each forward, at most one micro-batch whose backward ran is still referenced."""
    for r, rec in enumerate(records):
        for e in events(rec, "forward"):
            if e.get("finished_alive", 0) > 1:
                return (f"stage {r} still referenced {e['finished_alive']} micro-batches whose "
                        "backward had already run when it started a forward: their inputs and "
                        "outputs stay in memory, so the stage holds up to m micro-batches, as in "
                        "GPipe, although its order of passes is 1F1B's. Pop each micro-batch's "
                        "input and output from your lists (or set them to None) after its backward.")
    return None


# ---------------------------------------------------------------- the rules as the notebook states them
_P2P_SAYS = ("Use only `dist.send`, `dist.recv`, `dist.isend` and `dist.irecv` (or "
             "`dist.batch_isend_irecv`): no collective.")
_MSG_SAYS = ("Per micro-batch, stage r sends its output to stage r + 1 and the gradient of its "
             "input to stage r − 1, one message of `shape` each, and sends nothing else.")

#: Every schedule exercise's: point-to-point messages only, one each way per micro-batch.
def callers_own(records, case, n):
    for r, rec in enumerate(records):
        for s, step in enumerate(_steps(rec)):
            made = events(step, "zero_grad") + events(step, "optimizer_step")
            if made:
                e = min(made, key=step["events"].index)
                what = e["what"] if e["event"] == "zero_grad" else f"{e['what']}.step"
                after = e["backward"] - step["events"][0]["backward"]
                return (f"in step {s + 1}, stage {r} called {what}() (after {after} of its backward "
                        "passes): the caller zeroes the gradients before each step and steps the "
                        "optimizer after it.")
    return None


CALLERS_OWN_SAYS = "Leave the gradients and the optimizer to the caller: no `zero_grad` and no optimizer step."
COMMON = (Rule(_P2P_SAYS, no_collective), Rule(_MSG_SAYS, messages), Rule(CALLERS_OWN_SAYS, callers_own))
GPIPE = COMMON + (Rule("Run all m forward passes before the first backward, then one backward per "
                       "micro-batch.", gpipe_order),)
ONE_F_ONE_B = COMMON + (
    Rule("Stage r runs min(p − r − 1, m) warm-up forwards, then alternates one forward and one "
         "backward, then runs the remaining backwards: one backward per micro-batch.",
         one_f_one_b_order),
    Rule("Stage r never holds the activations of more than min(p − r, m) micro-batches at once.",
         memory_bound),
    Rule("Release each micro-batch after its backward: drop your references to its input and "
         "output (pop them from your queue), so that at each forward at most one finished "
         "micro-batch is still referenced (by a loop variable).", released_after_backward))
