"""Checks for Lab 00 (setup and motivation), declared on ``parlab.grading.harness``.

Five exercises: ``hello`` runs on real ranks (2 visible, 3 hidden); the four
memory and time formulas are plain functions, graded in the kernel's own
process (or in the sandbox during autograde).  The references are
``parlab.cost`` formulas (sources in each cost function's docstring and in
docs/), and for ``hello`` the greeting built from the rank and world size.

Each numeric exercise keeps a table of the values that the usual mistakes
give (bits instead of bytes, GB or GiB instead of bytes, a forgotten factor)
and names the mistake when the answer equals one of them.  ``hello`` has one
rule beyond its return value, judged on what each rank printed.

    lab00.check_weight_bytes(weight_bytes)               # visible cases
    lab00.check_weight_bytes(weight_bytes, hidden=True)  # other inputs, graded only
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import partial

from ... import cost
from .. import harness
from ..harness import Exercise, Rule
from ..numbers import distinct, number_message, plain_number, shown

__all__ = ["check_hello", "check_weight_bytes", "check_training_state_bytes",
           "check_gpus_to_hold_state", "check_days_to_train", "EXERCISES", "expected_hello"]

GB, GIB = 1e9, 2.0**30


def _n(x) -> str:
    """A number as a student would type it: 70e9, 7.5e9, 15e12, 2, 0.4, 123456789."""
    if isinstance(x, int) or abs(x) < 1e4:
        return str(x) if isinstance(x, int) else f"{x:g}"
    e = 3 * math.floor(math.log10(abs(x)) / 3)
    return f"{x / 10**e:g}e{e}"


@dataclass(frozen=True)
class Call:
    """One call of the student's function, shown the way a student would type it."""

    name: str
    args: tuple = ()
    on_ranks: bool = False

    def describe(self, n: int) -> str:
        call = f"{self.name}({', '.join(_n(a) for a in self.args)})"
        return f"{call} on {n} rank{'s' if n != 1 else ''}" if self.on_ranks else call


# ------------------------------------------------------------------- hello
def expected_hello(rank: int, world_size: int) -> str:
    return f"hello from rank {rank} of {world_size}"


def _run_hello(answer, case: Call, i: int, spy) -> object:
    with spy.watch():
        got = answer()
    return got if type(got) is str else plain_number(got)


def _hello_message(rank: int, got, results: list, n: int) -> str | None:
    """What is wrong with rank ``rank``'s return value, or None."""
    want = expected_hello(rank, n)
    if got == want:
        return None
    if got is None:
        return (f"rank {rank} returned None: your hello() does not return the message. "
                "Add `return message` at the end.")
    if not isinstance(got, str):
        text, kind = shown(got)
        return f"rank {rank} returned {text} ({kind}); hello() should return the string {want!r}."
    if n > 1 and all(isinstance(r, str) for r in results) and len(set(results)) == 1:
        return (f"every rank returned {got!r}: each rank must report its own rank. "
                "Ask torch.distributed with dist.get_rank() instead of using a fixed number.")
    if got == expected_hello(rank + 1, n):
        return (f"rank {rank} returned {got!r}, expected {want!r}: ranks count from 0, "
                "so use dist.get_rank() as it is, without adding 1.")
    if got.strip() == want:
        return (f"rank {rank} returned {got!r}, expected {want!r}: remove the spaces or newline "
                "around the message.")
    if got.startswith(f"hello from rank {rank} of "):
        return (f"rank {rank} returned {got!r}, expected {want!r}: the job has {n} ranks; "
                "take N from dist.get_world_size().")
    return (f"rank {rank} returned {got!r}, expected exactly {want!r} "
            "(check spelling, spaces and capitals).")


def _grade_hello(graded: harness.Graded) -> str | None:
    results = graded.at(0)
    for rank, got in enumerate(results):
        message = _hello_message(rank, got, results, graded.n)
        if message:
            return f"{graded.name}() on {graded.n} rank{'s' if graded.n != 1 else ''}: {message}"
    return None


def _hello_not_printed(records: list, case: Call, n: int) -> str | None:
    """Which rank did not print its greeting on a line of its own, or None."""
    for rank, record in enumerate(records):
        want = expected_hello(rank, n)
        printed = str(record.get("printed", ""))
        lines = [line.strip() for line in printed.splitlines()]
        if want in lines:
            continue
        if not printed.strip():
            return (f"rank {rank} printed nothing on standard output: hello() must also "
                    "`print(message)`.")
        near = next((line for line in lines if want in line), None)
        if near is not None:
            return (f"rank {rank} printed {near!r}, with more than the greeting on that line: print "
                    "the message alone (the launcher itself adds the [rank r] prefix or box).")
        first = repr(lines[0]) if len(lines) == 1 else f"{len(lines)} lines, starting {lines[0]!r},"
        return f"rank {rank} printed {first} but no line {want!r}: print the message you return."
    return None


PRINTS = Rule("Each rank prints its greeting, the same string it returns, on a line of its own "
              "(other lines may be printed too).", _hello_not_printed)

HELLO = Exercise(key="lab00.hello", answer="hello", run=_run_hello, grade=_grade_hello,
                 visible=((2, (Call("hello", on_ranks=True),)),),
                 hidden=((3, (Call("hello", on_ranks=True),)),),
                 rules=(PRINTS,), timeout=60.0)


# ------------------------------------------------------------------- plain formulas
def _run_call(answer, case: Call, i: int, spy):
    with spy.watch():
        got = answer(*case.args)
    return plain_number(got)


def _grade_numbers(expect, unit: str, integer: bool, graded: harness.Graded) -> str | None:
    """Each case's returned number against ``expect(*args) -> (want, mistakes)``."""
    for i, case in enumerate(graded.cases):
        want, mistakes = expect(*case.args)
        message = number_message(graded.at(i)[0], want, case.describe(1), mistakes,
                                 unit=unit, integer=integer)
        if message:
            return message
    return None


def _formula(name: str, expect, unit: str, visible: list, hidden: list,
             integer: bool = False) -> Exercise:
    return Exercise(key=f"lab00.{name}", answer=name, run=_run_call,
                    grade=partial(_grade_numbers, expect, unit, integer),
                    visible=((1, tuple(Call(name, args) for args in visible)),),
                    hidden=((1, tuple(Call(name, args) for args in hidden)),), solo=True)


def _unit_mistakes(want: float) -> list[tuple[float, str]]:
    """Wrong answers that come from mixing up units of an amount in bytes."""
    return [
        (want * 8, "That is 8 times too large: you counted bits, not bytes (1 byte = 8 bits; "
                   "bf16 is 16 bits = 2 bytes)."),
        (want / GB, "That looks like gigabytes: return plain bytes and divide by 1e9 only when printing."),
        (want / GIB, "That looks like GiB (2**30 bytes): return plain bytes; the course uses "
                     "decimal GB (1 GB = 1e9 bytes) only for printing."),
        (want / 2**20, "That looks like MiB: return plain bytes."),
    ]


def _weights(n: float, b: float):
    want = cost.weights_bytes(n, b)
    return want, _unit_mistakes(want) + [
        (n * 2, "You ignored bytes_per_param and always used 2 bytes: use the argument."),
        (n * b * 4, "You multiplied by 4 extra: bytes_per_param already is the size of one parameter."),
    ]


def _state(n: float):
    want = cost.training_bytes(n).total
    return want, _unit_mistakes(want) + [
        (12 * n, "You counted only the optimizer state (12 bytes per parameter); the fp16 weights "
                 "(2 bytes) and fp16 gradients (2 bytes) are held too."),
        (4 * n, "You counted only the fp16 weights and gradients; Adam also keeps an fp32 master "
                "copy, momentum and variance (4 + 4 + 4 bytes)."),
        (2 * n, "That is the weights alone; add gradients and Adam's optimizer state."),
        (8 * n, "You counted Adam's momentum and variance (4 + 4) but missed something: "
                "2 (weights) + 2 (grads) + 4 (fp32 master) + 4 + 4 = 16 bytes per parameter."),
        (14 * n, "You left out one fp16 copy: 2 (weights) + 2 (grads) + 12 (optimizer) = 16."),
        (18 * n, "You used fp32 gradients (4 bytes); in mixed precision they are fp16 (2 bytes)."),
        (20 * n, "You counted the fp32 master weights twice: they are part of the 12 optimizer bytes."),
    ]


def _exact_gpus(n: float, memory: float, bytes_per_param: int = 16) -> int:
    return math.ceil(Fraction(n) * bytes_per_param / Fraction(memory))


def _gpus(n: float, memory: float):
    want = _exact_gpus(n, memory)
    share = 16 * n / memory
    needs = f"The state needs {distinct(share, math.floor(share))[0]} GPUs' worth of memory"
    mistakes = [
        (math.floor(share), f"{needs} and you rounded down: a fraction of a GPU still needs a whole "
                            "GPU, so round up (math.ceil)."),
        (_exact_gpus(n, memory, 2), "You fitted only the weights (2 bytes per parameter); training "
                                    "holds 16 bytes per parameter."),
        (_exact_gpus(n, memory, 4), "You fitted weights and gradients only; add Adam's 12 bytes."),
        (_exact_gpus(n, memory, 12), "You fitted only the optimizer state; add weights and gradients."),
    ]
    if round(share) != want:
        mistakes.append((round(share), f"{needs} and you rounded to the nearest whole number: "
                                       "round up (math.ceil)."))
    return want, mistakes


def _days(n: float, tokens: float, gpus: int, peak: float, util: float):
    want = cost.time_to_train(n, tokens, gpus, peak, util) / cost.SECONDS_PER_DAY
    mistakes = [
        (want / 6, "That is 6 times too small: training costs 6 FLOPs per parameter per token "
                   "(2 forward + 4 backward); you left out the 6."),
        (want / 3, "That is 3 times too small: you used 2·N FLOPs per token (forward only); "
                   "training needs 6·N (forward + backward)."),
        (want * util, f"You left out the MFU: GPUs reach only {util:.0%} of their peak, so "
                      "divide by peak × MFU."),
        (want * util**2, "You multiplied by the MFU instead of dividing by it: a lower MFU must "
                         "make training take LONGER."),
        (want * cost.SECONDS_PER_DAY, "That is in seconds: divide by 86 400 for days."),
        (want * 24, "That is in hours: divide by 24 once more for days."),
        (want * 24 * 60, "That is in minutes: convert to days."),
    ]
    if gpus > 1:
        mistakes.append((want * gpus, f"That is {gpus} times too large: the work is shared by "
                                      "n_gpus GPUs, so divide by n_gpus."))
    return want, mistakes


H100 = cost.H100_BF16_PEAK
WEIGHTS = _formula("weight_bytes", _weights, "bytes",
                   visible=[(70e9, 2), (7e9, 4)],  # 70B in bf16: 140 GB; fp32 is 4 bytes
                   hidden=[(1.5e9, 1), (405e9, 2), (13e9, 4), (123_456_789, 2), (0, 2)])
STATE = _formula("training_state_bytes", _state, "bytes",
                 visible=[(70e9,)],
                 hidden=[(7.5e9,), (1.7e9,), (1,), (0,)])  # 7.5e9: ZeRO's example, 120 GB
# (7.5e9, 80e9) needs 1.5 GPUs, so rounding down fails visibly; 6e9 needs 1.2, so
# rounding to the nearest fails the hidden cases; 141e9 is an H200.
GPUS = _formula("gpus_to_hold_state", _gpus, "GPUs",
                visible=[(70e9, 80e9), (7.5e9, 80e9)],
                hidden=[(6e9, 80e9), (3e9, 80e9), (70e9, 141e9), (405e9, 80e9), (1e9, 80e9)],
                integer=True)
DAYS = _formula("days_to_train", _days, "days",
                visible=[(70e9, 15e12, 1024, H100, 0.4)],
                hidden=[(70e9, 15e12, 8, H100, 0.4), (8e9, 15e12, 8, H100, 0.5),
                        (1.7e9, 1e12, 64, H100, 0.38), (70e9, 15e12, 1, H100, 0.4),
                        (7e9, 2e12, 256, 312e12, 0.45)])  # the last one: an A100 (312 TFLOP/s bf16)

EXERCISES = (HELLO, WEIGHTS, STATE, GPUS, DAYS)

check_hello = harness.checker(HELLO, "Launch hello() on 2 ranks (hidden: 3) and check what each rank "
                                     "returned and printed.")
check_weight_bytes = harness.checker(WEIGHTS, "weight_bytes(n_params, bytes_per_param) must be "
                                              "n_params × bytes_per_param bytes.")
check_training_state_bytes = harness.checker(
    STATE, "training_state_bytes(n_params): weights + grads + Adam state = 16 bytes per parameter "
           "(ZeRO §3.1).")
check_gpus_to_hold_state = harness.checker(
    GPUS, "gpus_to_hold_state(n_params, gpu_memory_bytes): ceil(16·n_params / memory) GPUs, as an int.")
check_days_to_train = harness.checker(
    DAYS, "days_to_train(...) = 6·N·tokens / (GPUs × peak × MFU) / 86 400 (PaLM, appendix B).")
