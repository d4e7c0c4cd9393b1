"""Lab 05, Exercises 1 and 2: the memory and communication formulas of ZeRO, predicted.

The student writes ``zero_bytes_per_rank(n_params, n, stage)`` (model-state
bytes per rank under mixed-precision Adam, 2 + 2 + 12 bytes per parameter)
and ``zero_comm_bytes_per_rank(n_params, n, stage, bytes_per_elem)`` (bytes
each rank sends per step with ring collectives).  Both are prediction
exercises (``parlab.grading.predictions``): each case is the arguments of one
call, in one process; the number is compared with ``parlab.cost``'s, and a
wrong one is matched against the mistakes students make (``memory_mistakes``,
``comm_mistakes``) to say which.  The one rule: no call into ``parlab.cost``.
"""
from __future__ import annotations

from ...cost import zero_comm_elems, zero_memory_per_gpu
from ..diagnosis import Term

MEMORY_CALL = "zero_bytes_per_rank(n_params={}, n={}, stage={})"
MEMORY_VISIBLE = ((7.5e9, 64, 0), (7.5e9, 64, 1), (7.5e9, 64, 2), (7.5e9, 64, 3))
MEMORY_HIDDEN = ((1e6, 4, 1), (70e9, 8, 2), (70e9, 8, 3), (1000, 3, 1), (12345, 1, 3))

COMM_CALL = "zero_comm_bytes_per_rank(n_params={}, n={}, stage={}, bytes_per_elem={})"
# Stage 1 at N = 2 and 4 (and 5 hidden), where 3(N − 1)/N differs from 2(N − 1)/N and from 2.
COMM_VISIBLE = ((1000, 4, 0, 4), (1000, 2, 1, 4), (1000, 4, 1, 2), (1000, 4, 2, 4), (1000, 4, 3, 4),
                (7.5e9, 64, 3, 2))
COMM_HIDDEN = ((999, 3, 1, 2), (1000, 5, 1, 4), (70e9, 8, 3, 2), (12, 2, 0, 4), (5, 1, 3, 2))


#: The inputs each formula is also called with doubled, to say which term is wrong.
MEMORY_TERMS = (Term("n_params", "the model states (2 + 2 + 12 bytes per parameter, each sharded or not)", 0),
                Term("n", "the division of the sharded states by N", 1))
COMM_TERMS = (Term("n_params", "the bytes of the collectives (their sizes grow with Ψ)", 0),
              Term("n", "the ring factor (N − 1)/N", 1),
              Term("bytes_per_elem", "the bytes per element", 3))


def memory_bytes(psi, n, stage) -> float:
    return zero_memory_per_gpu(psi, n, stage)


def comm_bytes(psi, n, stage, b) -> float:
    return zero_comm_elems(psi, n, stage) * b


def memory_mistakes(psi, n, stage):
    s = (stage + 1) % 4
    return [(zero_memory_per_gpu(psi, n, s), f"That is stage {s}'s memory, not stage {stage}'s.",
             f"stage {stage} as {s}"),
            (zero_memory_per_gpu(psi, n, stage, optim_bytes=8),
             "Adam's 12 bytes are the fp32 master weights (4) plus momentum and variance (4 + 4): "
             "the master copy is missing."),
            (zero_memory_per_gpu(psi, n, stage) / 1e9, "Return bytes, not GB."),
            (zero_memory_per_gpu(psi, 1, stage), "Nothing is divided by the number of ranks N.")]


def comm_mistakes(psi, n, stage, b):
    k = 3 if stage == 3 else 2
    right = comm_bytes(psi, n, stage, b)
    first = []
    if stage in (1, 2):
        first = [(comm_bytes(psi, n, 3, b),
                  f"That is 3(N − 1)/N·Ψ, ZeRO-{stage} as Exercise 3's ZeRO1 runs it (an all-reduce, "
                  "2(N − 1)/N·Ψ, then the all-gather of the updated shards, (N − 1)/N·Ψ). This "
                  "exercise counts stages 1 and 2 as ZeRO does: a reduce-scatter of the gradients "
                  "and an all-gather of the parameters, 2(N − 1)/N·Ψ, the same as DP.", "exercise 3's ZeRO1")]
    elif stage == 3:
        first = [(comm_bytes(psi, n, 0, b),
                  "That is 2(N − 1)/N·Ψ, DP's traffic: stage 3 gathers the weights twice (forward "
                  "and backward) and reduce-scatters the gradients, 3(N − 1)/N·Ψ.")]
    else:
        first = [(comm_bytes(psi, n, 3, b),
                  "That is 3(N − 1)/N·Ψ, stage 3's traffic: stage 0 (DP) all-reduces the gradients, "
                  "2(N − 1)/N·Ψ.")]
    if n > 1:
        first.append((right * n, f"That is N = {n} times too much: a ring collective sends "
                                 "(N − 1)/N of the tensor per rank, not (N − 1) times it.", "N times"))
    # listed even where another mistake gives the same value (N = 2): the cases together tell them apart
    limit = [(k * psi * b, f"That is the large-N limit {k}Ψ: each rank sends (N − 1)/N of it.", "large-N limit")]
    return [m for m in first + limit + [(right / b, "That is elements: multiply by the bytes per "
                                                    "element.")] if abs(m[0] - right) > 1e-9 * abs(right)]

