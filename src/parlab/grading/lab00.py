"""Checks for Lab 00 (setup and motivation).

The references are ``parlab.cost`` formulas (sources in /work/shared/FACTS.md
and in each cost function's docstring) and, for ``hello``, the expected
string built from the rank and world size.  Each check knows the answers
that the usual mistakes produce and names the mistake when it sees one.
"""
from __future__ import annotations

import math
from fractions import Fraction

from parlab import cost
from parlab.grading import assert_number

GB, GIB = 1e9, 2.0**30


def _n(x: float) -> str:
    """A number as a student would type it: 70e9, 7.5e9, 15e12, 2, 123456789."""
    if isinstance(x, int) or abs(x) < 1e4:
        return f"{x:g}" if not isinstance(x, int) else str(x)
    e = 3 * math.floor(math.log10(abs(x)) / 3)
    return f"{x / 10**e:g}e{e}"

# ------------------------------------------------------------------- hello


def expected_hello(rank: int, world_size: int) -> str:
    return f"hello from rank {rank} of {world_size}"


def judge_hello(results: list, world_size: int) -> None:
    """Check what ``hello`` returned on each rank (a list in rank order)."""
    for rank, got in enumerate(results):
        want = expected_hello(rank, world_size)
        if got == want:
            continue
        if got is None:
            raise AssertionError(f"rank {rank} returned None: your hello() prints but does not "
                                 "return the message. Add `return message` at the end.")
        if not isinstance(got, str):
            raise AssertionError(f"rank {rank} returned {got!r} ({type(got).__name__}); "
                                 f"hello() should return the string {want!r}.")
        if world_size > 1 and len(set(results)) == 1:
            raise AssertionError(f"every rank returned {got!r}: each rank must report its own rank. "
                                 "Ask torch.distributed with dist.get_rank() instead of using a fixed number.")
        if got == expected_hello(rank + 1, world_size):
            raise AssertionError(f"rank {rank} returned {got!r}, expected {want!r}: ranks count from 0, "
                                 "so use dist.get_rank() as it is, without adding 1.")
        if got.startswith(f"hello from rank {rank} of "):
            raise AssertionError(f"rank {rank} returned {got!r}, expected {want!r}: the job has "
                                 f"{world_size} ranks; take N from dist.get_world_size().")
        raise AssertionError(f"rank {rank} returned {got!r}, expected exactly {want!r} "
                             "(check spelling, spaces and capitals).")


def check_hello(student_fn, hidden: bool = False) -> None:
    """Launch ``student_fn`` on 2 ranks (visible) or 3 ranks (hidden) and check each rank's string."""
    import parlab

    world_size = 3 if hidden else 2
    results = parlab.launch(student_fn, nproc=world_size)
    judge_hello(results, world_size)
    print(f"ok: hello() on {world_size} ranks returned {results}")


# ------------------------------------------------------------------- memory


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


WEIGHT_CASES = [(70e9, 2)]  # FACTS.md: 70B parameters in bf16 need 140 GB
WEIGHT_CASES_HIDDEN = [(7e9, 4), (1.5e9, 1), (405e9, 2), (123_456_789, 2), (0, 2)]


def check_weight_bytes(student_fn, hidden: bool = False) -> None:
    """weight_bytes(n_params, bytes_per_param) must be n_params × bytes_per_param bytes."""
    for n, b in WEIGHT_CASES_HIDDEN if hidden else WEIGHT_CASES:
        want = cost.weights_bytes(n, b)
        mistakes = _unit_mistakes(want) + [
            (n * 2, "You ignored bytes_per_param and always used 2 bytes: use the argument."),
            (n * b * 4, "You multiplied by 4 extra: bytes_per_param already is the size of one parameter."),
        ]
        assert_number(student_fn(n, b), want, f"weight_bytes({_n(n)}, {b})", mistakes, unit="bytes")
    print("ok: weight_bytes" + (" (hidden cases)" if hidden else ""))


STATE_CASES = [70e9]
STATE_CASES_HIDDEN = [7.5e9, 1.7e9, 1, 0]  # 7.5e9: ZeRO's example, 120 GB


def check_training_state_bytes(student_fn, hidden: bool = False) -> None:
    """training_state_bytes(n_params): weights + grads + Adam state = 16 bytes per parameter (ZeRO §3.1)."""
    for n in STATE_CASES_HIDDEN if hidden else STATE_CASES:
        want = cost.training_bytes(n).total
        mistakes = _unit_mistakes(want) + [
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
        assert_number(student_fn(n), want, f"training_state_bytes({_n(n)})", mistakes, unit="bytes")
    print("ok: training_state_bytes" + (" (hidden cases)" if hidden else ""))


GPU_CASES = [(70e9, 80e9)]
# 7.5e9 and 6e9 need 1.5 and 1.2 GPUs (rounding down or to nearest fails); 141e9 is an H200.
GPU_CASES_HIDDEN = [(7.5e9, 80e9), (6e9, 80e9), (3e9, 80e9), (70e9, 141e9), (405e9, 80e9)]


def _exact_gpus(n: float, memory: float, bytes_per_param: int = 16) -> int:
    return math.ceil(Fraction(n) * bytes_per_param / Fraction(memory))


def check_gpus_to_hold_state(student_fn, hidden: bool = False) -> None:
    """gpus_to_hold_state(n_params, gpu_memory_bytes): ceil(16·n_params / memory) GPUs."""
    for n, mem in GPU_CASES_HIDDEN if hidden else GPU_CASES:
        want = _exact_gpus(n, mem)
        share = 16 * n / mem
        mistakes = [
            (math.floor(share), f"The state needs {share:.3g} GPUs' worth of memory and you rounded down: "
                                "a fraction of a GPU still needs a whole GPU, so round up (math.ceil)."),
            (_exact_gpus(n, mem, 2), "You fitted only the weights (2 bytes per parameter); training "
                                     "holds 16 bytes per parameter."),
            (_exact_gpus(n, mem, 4), "You fitted weights and gradients only; add Adam's 12 bytes."),
            (_exact_gpus(n, mem, 12), "You fitted only the optimizer state; add weights and gradients."),
        ]
        if round(share) != want:
            mistakes.append((round(share), f"The state needs {share:.3g} GPUs' worth of memory and you "
                                           "rounded to the nearest whole number: round up (math.ceil)."))
        assert_number(student_fn(n, mem), want, f"gpus_to_hold_state({_n(n)}, {_n(mem)})", mistakes,
                      unit="GPUs", integer=True)
    print("ok: gpus_to_hold_state" + (" (hidden cases)" if hidden else ""))


# ------------------------------------------------------------------- time

H100 = cost.H100_BF16_PEAK
DAYS_CASES = [(70e9, 15e12, 1024, H100, 0.4)]
DAYS_CASES_HIDDEN = [(70e9, 15e12, 8, H100, 0.4), (8e9, 15e12, 8, H100, 0.5),
                     (1.7e9, 1e12, 64, H100, 0.38), (70e9, 15e12, 1, H100, 0.4),
                     (7e9, 2e12, 256, 312e12, 0.45)]  # the last one: an A100 (312 TFLOP/s bf16)


def check_days_to_train(student_fn, hidden: bool = False) -> None:
    """days_to_train(...) = 6·N·tokens / (GPUs × peak × MFU) / 86 400 (FACTS.md, 'Compute')."""
    for n, tokens, gpus, peak, util in DAYS_CASES_HIDDEN if hidden else DAYS_CASES:
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
        call = f"days_to_train({_n(n)}, {_n(tokens)}, {gpus}, {_n(peak)}, {util})"
        assert_number(student_fn(n, tokens, gpus, peak, util), want, call, mistakes, unit="days")
    print("ok: days_to_train" + (" (hidden cases)" if hidden else ""))
