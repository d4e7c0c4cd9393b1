"""Lab 00, exercises 2-5: four memory and time formulas, graded in one process.

``weight_bytes``, ``training_state_bytes``, ``gpus_to_hold_state`` and
``days_to_train`` are plain functions, run in the kernel's own process (in the
sandbox during autograde) and compared with the ``parlab.cost`` formulas
(sources in each cost function's docstring and in docs/).  Each keeps a table
of the values the usual mistakes give (bits instead of bytes, GB or GiB
instead of bytes, a forgotten factor) and names the mistake when the answer
equals one of them on every case (``numbers.numbers_message``);
``days_to_train`` is also called with each input doubled, to say which term
a wrong answer no known mistake explains gets wrong.
"""
from __future__ import annotations

import math
from fractions import Fraction
from functools import partial

from ... import cost
from ..diagnosis import Term, which_term
from ..harness import Exercise, Graded
from ..numbers import distinct, numbers_message
from ..plain import plain_number
from .call import Call, typed

GB, GIB = 1e9, 2.0**30


# ---------------------------------------------------------------- runner and grader
def run(answer, case: Call, i: int, spy):
    with spy.watch():
        got = answer(*case.args)
    return plain_number(got)


def run_varied(terms: tuple[Term, ...], answer, case: Call, i: int, spy) -> list:
    """``[answer(*args), answer(*args with each term's input doubled), ...]`` as plain numbers; a
    varied call that raises gives None (it says nothing of the case itself)."""
    out = [run(answer, case, i, spy)]
    for term in terms:
        try:
            with spy.watch():
                out.append(plain_number(answer(*term.vary(case.args))))
        except Exception:  # noqa: BLE001 - an input the answer cannot take doubled says nothing
            out.append(None)
    return out


def grade(expect, unit: str, integer: bool, differs, terms: tuple[Term, ...], graded: Graded) -> str | None:
    """Every case's returned number against ``expect(*args) -> (want, mistakes)``: a mistake is
    named only when it explains every case (``numbers.numbers_message``); with ``terms``, a wrong
    number no known mistake explains is told which term is wrong (``diagnosis.which_term``)."""
    rows, varied = [], []
    for i, case in enumerate(graded.cases):
        want, mistakes = expect(*case.args)
        got = graded.at(i)[0]
        if terms:
            got, others = (got[0], got[1:]) if isinstance(got, list) else (got, [None] * len(terms))
            varied.append([(t, v, expect(*t.vary(case.args))[0]) for t, v in zip(terms, others)])
        rows.append((got, want, case.describe(1), mistakes))

    def what_differs(got, want, i):
        changes = varied[i] if terms else []
        if changes and all(isinstance(v, (int, float)) for _, v, _ in changes):
            return which_term(got, want, changes)
        return differs(got, *graded.cases[i].args) if differs else ""
    return numbers_message(rows, unit=unit, integer=integer,
                           differs=what_differs if differs or terms else None)


def formula(name: str, expect, unit: str, visible: list, hidden: list,
            integer: bool = False, differs=None, terms: tuple[Term, ...] = ()) -> Exercise:
    """``differs(got, *args)`` says what differs when no single mistake explains the answer; with
    ``terms`` the answer is also called with each term's input doubled, to say which term is wrong."""
    return Exercise(key=f"lab00.{name}", answer=name, run=partial(run_varied, terms) if terms else run,
                    grade=partial(grade, expect, unit, integer, differs, terms),
                    visible=((1, tuple(Call(name, args) for args in visible)),),
                    hidden=((1, tuple(Call(name, args) for args in hidden)),), solo=True)


# ---------------------------------------------------------------- references and their mistakes
def unit_mistakes(want: float) -> list[tuple[float, str]]:
    """Wrong answers that come from mixing up units of an amount in bytes."""
    return [
        (want * 8, "That is 8 times too large: you counted bits, not bytes (1 byte = 8 bits; "
                   "bf16 is 16 bits = 2 bytes)."),
        (want / GB, "That looks like gigabytes: return plain bytes and divide by 1e9 only when printing."),
        (want / GIB, "That looks like GiB (2**30 bytes): return plain bytes; the course uses "
                     "decimal GB (1 GB = 1e9 bytes) only for printing."),
        (want / 2**20, "That looks like MiB: return plain bytes."),
    ]


def expect_weights(n: float, b: float):
    want = cost.weights_bytes(n, b)
    return want, unit_mistakes(want) + [
        (n * 2, "You ignored bytes_per_param and always used 2 bytes: use the argument."),
        (n * b * 4, "You multiplied by 4 extra: bytes_per_param already is the size of one parameter."),
    ] + ([(n * math.floor(b), f"bytes_per_param is {b:g} here, not a whole number: use it as it is, "
                              "without rounding it.", "rounded"),
          (n * math.ceil(b), f"bytes_per_param is {b:g} here, not a whole number: use it as it is, "
                             "without rounding it.", "rounded")] if b != int(b) else [])


STATE_TERMS = ("2 (fp16 weights) + 2 (fp16 gradients) + 4 (fp32 master weights) + 4 (Adam's "
               "momentum) + 4 (Adam's variance) = 16 bytes per parameter")


def expect_state(n: float):
    """The mistakes that give a whole number of bytes per parameter; two that give the same
    number (12: the optimizer state alone, or everything but the fp32 master) name neither."""
    want = cost.training_bytes(n).total
    return want, unit_mistakes(want) + [
        (12 * n, "You counted only the optimizer state (12 bytes per parameter); the fp16 weights "
                 "(2 bytes) and fp16 gradients (2 bytes) are held too.", "optimizer only"),
        (12 * n, "The fp32 master weights (4 bytes) are missing.", "no master"),
        (4 * n, "You counted only the fp16 weights and gradients; Adam also keeps an fp32 master "
                "copy, momentum and variance (4 + 4 + 4 bytes).", "weights and grads"),
        (2 * n, "That is the weights alone; add gradients and Adam's optimizer state.", "weights"),
        (8 * n, "You counted Adam's momentum and variance alone.", "moments only"),
        (8 * n, "Adam's momentum and variance (4 + 4) are missing.", "no moments"),
        (14 * n, "You left out one fp16 copy: 2 (weights) + 2 (grads) + 12 (optimizer) = 16.",
         "one fp16 copy"),
        (18 * n, "You used fp32 gradients (4 bytes); in mixed precision they are fp16 (2 bytes).",
         "fp32 grads"),
        (18 * n, "You used fp32 weights (4 bytes); the model's own copy is fp16 (2 bytes), the "
                 "fp32 copy is the master in the optimizer state.", "fp32 weights"),
        (20 * n, "You counted the fp32 master weights twice: they are part of the 12 optimizer bytes.",
         "master twice"),
    ]


def state_differs(got: float, n: float) -> str:
    """Bytes per parameter, against the sum of the terms: what differs, naming no term."""
    if not n:
        return ""
    return f"That is {distinct(got / n, 16.0)[0]} bytes per parameter; the training state is {STATE_TERMS}."


def exact_gpus(n: float, memory: float, bytes_per_param: int = 16) -> int:
    return math.ceil(Fraction(n) * bytes_per_param / Fraction(memory))


def expect_gpus(n: float, memory: float):
    want = exact_gpus(n, memory)
    share = 16 * n / memory
    needs = f"The state needs {distinct(share, math.floor(share))[0]} GPUs' worth of memory"
    mistakes = [
        (math.floor(share), f"{needs} and you rounded down: a fraction of a GPU still needs a whole "
                            "GPU, so round up (math.ceil).", "floor"),
        (exact_gpus(n, memory, 2), "You fitted only the weights (2 bytes per parameter); training "
                                   "holds 16 bytes per parameter."),
        (exact_gpus(n, memory, 4), "You fitted weights and gradients only; add Adam's 12 bytes."),
        (exact_gpus(n, memory, 12), "You fitted only the optimizer state; add weights and gradients.",
         "optimizer only"),
        (exact_gpus(n, memory, 12), "The fp32 master weights (4 bytes per parameter) are missing.",
         "no master"),
    ]
    if round(share) != want:
        mistakes.append((round(share), f"{needs} and you rounded to the nearest whole number: "
                                       "round up (math.ceil).", "nearest"))
    return want, mistakes


def gpus_differs(got: float, n: float, memory: float) -> str:
    """The count the state needs, worked out: what differs, naming no term."""
    share = 16 * n / memory
    return (f"The training state is 16 bytes per parameter, {typed(16 * n)} bytes: "
            f"{distinct(share, round(share))[0]} GPUs' worth of memory, rounded up.")


def expect_days(n: float, tokens: float, gpus: int, peak: float, util: float):
    want = cost.time_to_train(n, tokens, gpus, peak, util) / cost.SECONDS_PER_DAY
    mistakes = [
        (want / 6, "That is 6 times too small: training costs 6 FLOPs per parameter per token "
                   "(2 forward + 4 backward); you left out the 6."),
        (want / 3, "That is 3 times too small: you used 2·N FLOPs per token (forward only); "
                   "training needs 6·N (forward + backward)."),
        (want * util, f"You left out the MFU: GPUs reach only {util:.0%} of their peak, so "
                      "divide by peak × MFU.", "no mfu"),
        (want * util**2, "You multiplied by the MFU instead of dividing by it: a lower MFU must "
                         "make training take LONGER."),
        (want * cost.SECONDS_PER_DAY, "That is in seconds: divide by 86 400 for days."),
        (want * 24, "That is in hours: divide by 24 once more for days."),
        (want * 24 * 60, "That is in minutes: convert to days."),
    ]
    if gpus > 1:
        mistakes.append((want * gpus, f"That is {gpus} times too large: the work is shared by "
                                      "n_gpus GPUs, so divide by n_gpus.", "one gpu"))
    return want, mistakes


# ---------------------------------------------------------------- the four exercises
H100 = cost.H100_BF16_PEAK
WEIGHTS = formula("weight_bytes", expect_weights, "bytes",
                  visible=[(70e9, 2), (7e9, 4)],  # 70B in bf16: 140 GB; fp32 is 4 bytes
                  # 0.5: 4-bit weights; bytes_per_param need not be whole (the notebook says so)
                  hidden=[(1.5e9, 1), (405e9, 2), (13e9, 4), (123_456_789, 2), (0, 2), (7e9, 0.5)])
STATE = formula("training_state_bytes", expect_state, "bytes",
                visible=[(70e9,)],
                hidden=[(7.5e9,), (1.7e9,), (1,), (0,)], differs=state_differs)  # 7.5e9: ZeRO's example, 120 GB
# (7.5e9, 80e9) needs 1.5 GPUs, so rounding down fails visibly; 6e9 needs 1.2, so
# rounding to the nearest fails the hidden cases; 141e9 is an H200.
GPUS = formula("gpus_to_hold_state", expect_gpus, "GPUs",
               visible=[(70e9, 80e9), (7.5e9, 80e9)],
               hidden=[(6e9, 80e9), (3e9, 80e9), (70e9, 141e9), (405e9, 80e9), (1e9, 80e9)],
               integer=True, differs=gpus_differs)
#: days_to_train's inputs, each doubled alone to find the term a wrong answer gets wrong.
DAYS_TERMS = (Term("n_params", "the 6·N FLOPs per token (N, the parameters)", 0),
              Term("tokens", "the tokens trained on", 1),
              Term("n_gpus", "the division by the number of GPUs", 2),
              Term("peak_flops", "the division by peak × MFU", 3),
              Term("mfu", "the division by peak × MFU", 4))
DAYS = formula("days_to_train", expect_days, "days", terms=DAYS_TERMS,
               visible=[(70e9, 15e12, 1024, H100, 0.4)],
               hidden=[(70e9, 15e12, 8, H100, 0.4), (8e9, 15e12, 8, H100, 0.5),
                       (1.7e9, 1e12, 64, H100, 0.38), (70e9, 15e12, 1, H100, 0.4),
                       (7e9, 2e12, 256, 312e12, 0.45)])  # the last one: an A100 (312 TFLOP/s bf16)
