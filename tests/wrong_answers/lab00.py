"""Typical wrong answers to Lab 00's exercises, and right ones written differently.

The tables of tests/answer_suite.py, keyed by ``parlab.grading.lab00.EXERCISES``:
``CORRECT`` (right answers that differ from the notebook's solution), ``WRONG``
(each with the words the check's message must contain) and ``WRONG_HIDDEN``
(right on the visible cases, wrong on the hidden ones).  ``hello``'s answers run
on ranks; five of its wrong ones return the right greeting but break the rule
the notebook states about printing it.  tests/ranks/test_lab00.py grades them
all with the checks the notebook calls.
"""
import math
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

from parlab import cost
from wrong_answers import says

_TWELVE = says("That is 12 bytes per parameter", never=("only the optimizer state", "master weights (4 bytes) are missing"),
               differs=True)

# ------------------------------------------------------------ hello (run on ranks)


def hello_no_return():
    print(f"hello from rank {dist.get_rank()} of {dist.get_world_size()}")


def hello_fixed_rank():
    return f"hello from rank 0 of {dist.get_world_size()}"


def hello_counts_from_one():
    return f"hello from rank {dist.get_rank() + 1} of {dist.get_world_size()}"


def hello_fixed_world():
    return f"hello from rank {dist.get_rank()} of 4"


def hello_typo():
    return f"Hello from rank {dist.get_rank()} of {dist.get_world_size()}"


def hello_not_str():
    return dist.get_rank()


def hello_fixed_world_of_two():
    # Right on the 2 visible ranks, wrong on the 3 hidden ones.
    message = f"hello from rank {dist.get_rank()} of 2"
    print(message)
    return message


def hello_trailing_newline():
    message = f"hello from rank {dist.get_rank()} of {dist.get_world_size()}\n"
    print(message, end="")
    return message


def _greeting():
    return f"hello from rank {dist.get_rank()} of {dist.get_world_size()}"


# ------------------------------------------------------------ hello: the printing rule


def hello_returns_without_printing():
    return _greeting()


def hello_prints_own_prefix():
    print(f"[rank {dist.get_rank()}] {_greeting()}")
    return _greeting()


def hello_prints_on_rank0_only():
    if dist.get_rank() == 0:
        print(_greeting())
    return _greeting()


def hello_prints_something_else():
    print("hello!")
    return _greeting()


def hello_prints_to_stderr():
    print(_greeting(), file=sys.stderr)
    return _greeting()


# ------------------------------------------------------------ weight_bytes


def weight_bits(n, b):
    return n * b * 8


def weight_gb(n, b):
    return n * b / 1e9


def weight_gib(n, b):
    return n * b / 2**30


def weight_always_bf16(n, b):
    return n * 2


def weight_no_return(n, b):
    n * b


def weight_as_text(n, b):
    return f"{n * b / 1e9:.0f} GB"


def weight_as_tensor(n, b):
    return torch.tensor(float(n)) * b


def weight_whole_bytes(n, b):
    return n * int(b)  # right for 1, 2 and 4 bytes; 4-bit weights (0.5) give 0


# ------------------------------------------------------------ training_state_bytes


def state_optimizer_only(n):
    return 12 * n


def state_no_master(n):
    return (2 + 2 + 4 + 4) * n  # momentum and variance, but no fp32 master: 12, as above


def state_weights_grads_only(n):
    return 4 * n


def state_fp32_grads(n):
    return (2 + 4 + 12) * n


def state_master_twice(n):
    return (2 + 2 + 4 + 12) * n


def state_bits(n):
    return 16 * 8 * n


def state_gib(n):
    return 16 * n / 2**30


def _weight_bytes(n, b):
    return n * b


def state_reuses_weight_bytes_wrongly(n):
    return _weight_bytes(n) * 8  # TypeError: the helper takes two arguments


def state_weights_only(n):
    return 2 * n


# ------------------------------------------------------------ gpus_to_hold_state


def gpus_floor(n, mem):
    return int(16 * n / mem)


def gpus_round(n, mem):
    return round(16 * n / mem)


def gpus_float(n, mem):
    return 16 * n / mem


def gpus_weights_only(n, mem):
    return math.ceil(2 * n / mem)


def gpus_weights_and_grads(n, mem):
    return math.ceil(4 * n / mem)


def gpus_no_master(n, mem):
    return math.ceil((2 + 2 + 4 + 4) * n / mem)  # the same count as the optimizer state alone


def gpus_ceil_division_float(n, mem):
    return -(-16 * n // mem)  # the ceiling idiom, but on floats it gives 14.0


# ------------------------------------------------------------ days_to_train


def days_no_six(n, tokens, gpus, peak, mfu):
    return n * tokens / (gpus * peak * mfu) / 86_400


def days_forward_only(n, tokens, gpus, peak, mfu):
    return 2 * n * tokens / (gpus * peak * mfu) / 86_400


def days_no_mfu(n, tokens, gpus, peak, mfu):
    return 6 * n * tokens / (gpus * peak) / 86_400


def days_times_mfu(n, tokens, gpus, peak, mfu):
    return 6 * n * tokens * mfu / (gpus * peak) / 86_400


def days_in_seconds(n, tokens, gpus, peak, mfu):
    return 6 * n * tokens / (gpus * peak * mfu)


def days_in_hours(n, tokens, gpus, peak, mfu):
    return 6 * n * tokens / (gpus * peak * mfu) / 3600


def days_one_gpu(n, tokens, gpus, peak, mfu):
    return 6 * n * tokens / (peak * mfu) / 86_400


def days_in_minutes(n, tokens, gpus, peak, mfu):
    return 6 * n * tokens / (gpus * peak * mfu) / 60


def days_times_peak(n, tokens, gpus, peak, mfu):
    """Multiplies by peak × MFU where it should divide: the units (FLOPs / FLOP/s) read backwards."""
    return 6 * n * tokens / gpus * peak * mfu / 86_400


def days_gpus_squared(n, tokens, gpus, peak, mfu):
    """Divides by the GPUs twice: once for the work, once more 'for the communication'."""
    return 6 * n * tokens / (gpus * gpus * peak * mfu) / 86_400


def days_as_timedelta(n, tokens, gpus, peak, mfu):
    import datetime

    return datetime.timedelta(seconds=6 * n * tokens / (gpus * peak * mfu))


# ------------------------------------------------------------ right, written differently


def hello_flushes():
    message = "hello from rank {} of {}".format(dist.get_rank(), dist.get_world_size())
    print(message, flush=True)
    return message


def hello_from_environment():
    # torchrun sets RANK and WORLD_SIZE for every rank.
    message = "hello from rank %s of %s" % (os.environ["RANK"], os.environ["WORLD_SIZE"])
    print("starting")  # other lines may be printed too
    print(message)
    return message


def hello_print_with_commas():
    rank, n = dist.get_rank(), dist.get_world_size()
    print("hello from rank", rank, "of", n)
    return " ".join(["hello from rank", str(rank), "of", str(n)])


def hello_writes_stdout():
    message = _greeting()
    sys.stdout.write(message + "\n")
    return message


def hello_writes_fd_one():
    # Printed all the same: the spy reads what reached the rank's standard output (fd 1).
    message = _greeting()
    os.write(1, (message + "\n").encode())
    return message


def hello_prints_to_the_real_stdout():
    message = _greeting()
    print(message, file=sys.__stdout__, flush=True)
    return message


def hello_fills_the_spys_copy():
    # Not a mistake but a trick (issue 40): never prints, and puts the greeting where the rule spy
    # kept its copy of stdout when it teed sys.stdout; the spy now reads fd 1 itself.
    message = _greeting()
    copy = getattr(sys.stdout, "_copy", None)
    if isinstance(copy, list):
        copy.append(message + "\n")
    return message


def weight_numpy(n, b):
    return np.float64(n) * b


def weight_with_cost(n, b):
    return cost.weights_bytes(n, b)


def state_itemised(n):
    weights, grads, master, momentum, variance = 2 * n, 2 * n, 4 * n, 4 * n, 4 * n
    return weights + grads + master + momentum + variance


def state_with_cost(n):
    return cost.training_bytes(n).total


def gpus_integer_ceiling(n, mem):
    return int(-(-16 * n // mem))


def gpus_numpy(n, mem):
    return np.int64(np.ceil(16 * n / mem))


def gpus_from_state(n, mem):
    return math.ceil(state_itemised(n) / mem)


def days_in_steps(n, tokens, gpus, peak, mfu):
    flops = 6 * n * tokens
    per_second = gpus * peak * mfu
    return flops / per_second / 3600 / 24


def days_with_cost(n, tokens, gpus, peak, mfu):
    return cost.time_to_train(n, tokens, gpus, peak, mfu) / cost.SECONDS_PER_DAY


CORRECT = {
    "hello": [hello_flushes, hello_from_environment, hello_print_with_commas, hello_writes_stdout,
              hello_writes_fd_one, hello_prints_to_the_real_stdout],
    "weight_bytes": [weight_numpy, weight_with_cost],
    "training_state_bytes": [state_itemised, state_with_cost],
    "gpus_to_hold_state": [gpus_integer_ceiling, gpus_numpy, gpus_from_state],
    "days_to_train": [days_in_steps, days_with_cost],
}

WRONG = {
    "hello": [
        (hello_no_return, "does not return"),
        (hello_fixed_rank, "dist.get_rank()"),
        (hello_counts_from_one, "count from 0"),
        (hello_fixed_world, "dist.get_world_size()"),
        (hello_typo, "capitals"),
        (hello_not_str, "should return the string"),
        (hello_trailing_newline, "spaces or newline"),
        # Right return values; only the printing rule catches these.
        (hello_returns_without_printing, ("rank 0 printed nothing", "print(message)")),
        (hello_prints_own_prefix, ("more than the greeting", "adds the [rank r] prefix")),
        (hello_prints_on_rank0_only, "rank 1 printed nothing"),
        (hello_prints_something_else, "no line 'hello from rank 0 of 2'"),
        (hello_prints_to_stderr, "nothing on standard output"),
        (hello_fills_the_spys_copy, "rank 0 printed nothing"),
    ],
    "weight_bytes": [
        (weight_bits, "bits, not bytes"),
        (weight_gb, "gigabytes"),
        (weight_gib, "GiB"),
        (weight_always_bf16, "ignored bytes_per_param"),
        (weight_no_return, "forget the `return`"),
        (weight_as_text, "'140 GB' (str); it should return a number"),
        (weight_as_tensor, "(Tensor); it should return a number"),
    ],
    "training_state_bytes": [
        # 12 bytes per parameter: the optimizer state alone, or everything but the fp32 master;
        # 18: fp32 gradients, or fp32 weights. One case cannot tell them apart: no cause is named.
        (state_optimizer_only, _TWELVE),
        (state_no_master, _TWELVE),
        (state_weights_grads_only, "fp32 master copy"),
        (state_fp32_grads, says("That is 18 bytes per parameter", never=("fp32 gradients", "fp32 weights"),
                                differs=True)),
        (state_master_twice, "twice"),
        (state_bits, "bits, not bytes"),
        (state_gib, "GiB"),
        (state_weights_only, "weights alone"),
        (state_reuses_weight_bytes_wrongly, ("raised TypeError", "training_state_bytes(70e9)")),
    ],
    "gpus_to_hold_state": [
        (gpus_floor, "rounded down"),
        (gpus_float, "return it as an int"),
        (gpus_weights_only, "only the weights"),
        (gpus_weights_and_grads, "weights and gradients only"),
        (gpus_no_master, says("16 bytes per parameter", "rounded up",
                              never=("only the optimizer state", "master weights"), differs=True)),
        (gpus_ceil_division_float, "return it as an int"),
    ],
    "days_to_train": [
        (days_no_six, "left out the 6"),
        (days_forward_only, "forward only"),
        (days_no_mfu, "left out the MFU"),
        (days_times_mfu, "instead of dividing"),
        (days_in_seconds, "in seconds"),
        (days_in_hours, "in hours"),
        (days_one_gpu, "divide by n_gpus"),
        (days_in_minutes, "in minutes"),
        (days_as_timedelta, "(timedelta); it should return a number (in days)"),
        (days_times_peak, says("the term that is wrong is the division by peak × MFU",
                               never=("instead of dividing", "left out"))),
        (days_gpus_squared, says("When n_gpus doubles", "the division by the number of GPUs",
                                 never="divide by n_gpus")),
    ],
}

#: Right on the visible cases (2 ranks; 7.5e9 and 70e9 parameters), wrong on the hidden ones.
WRONG_HIDDEN = {
    "hello": [(hello_fixed_world_of_two, "dist.get_world_size()")],
    # 6e9 parameters need 1.2 GPUs: round() gives 1; 3e9 (0.6 GPUs) rules out rounding down.
    "gpus_to_hold_state": [(gpus_round, says("rounded to the nearest", never="rounded down"))],
    "weight_bytes": [(weight_whole_bytes, says("not a whole number", "without rounding"))],
}
