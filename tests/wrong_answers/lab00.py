"""Typical wrong answers to Lab 00's exercises.

``WRONG`` maps each exercise to (fixture, the words the check's message must
contain).  tests/test_lab00.py runs every fixture through its check.
"""
import math

import torch.distributed as dist

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


HELLO = [
    (hello_no_return, "forget|does not return"),
    (hello_fixed_rank, "dist.get_rank()"),
    (hello_counts_from_one, "count from 0"),
    (hello_fixed_world, "dist.get_world_size()"),
    (hello_typo, "capitals"),
    (hello_not_str, "should return the string"),
]

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


# ------------------------------------------------------------ training_state_bytes


def state_optimizer_only(n):
    return 12 * n


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


# ------------------------------------------------------------ gpus_to_hold_state


def gpus_floor(n, mem):
    return int(16 * n / mem)


def gpus_round(n, mem):
    return round(16 * n / mem)


def gpus_float(n, mem):
    return 16 * n / mem


def gpus_weights_only(n, mem):
    return math.ceil(2 * n / mem)


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


WRONG = {
    "weight_bytes": [
        (weight_bits, "bits, not bytes"),
        (weight_gb, "gigabytes"),
        (weight_gib, "GiB"),
        (weight_always_bf16, "ignored bytes_per_param"),
        (weight_no_return, "forget the `return`"),
    ],
    "training_state_bytes": [
        (state_optimizer_only, "only the optimizer state"),
        (state_weights_grads_only, "fp32 master copy"),
        (state_fp32_grads, "fp32 gradients"),
        (state_master_twice, "twice"),
        (state_bits, "bits, not bytes"),
        (state_gib, "GiB"),
    ],
    "gpus_to_hold_state": [
        (gpus_floor, "rounded down"),
        (gpus_round, "rounded down|nearest"),
        (gpus_float, "int"),
        (gpus_weights_only, "only the weights"),
    ],
    "days_to_train": [
        (days_no_six, "left out the 6"),
        (days_forward_only, "forward only"),
        (days_no_mfu, "left out the MFU"),
        (days_times_mfu, "instead of dividing"),
        (days_in_seconds, "in seconds"),
        (days_in_hours, "in hours"),
        (days_one_gpu, "divide by n_gpus"),
    ],
}
