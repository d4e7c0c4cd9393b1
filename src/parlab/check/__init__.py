"""Comparison helpers for the autograder: did the ranks compute the right thing?

Each helper takes what the ranks returned (a list in rank order, as
``parlab.launch`` gives it) or one rank's tensor, and compares it with a
single-process reference.  On failure it raises ``AssertionError`` (nbgrader
then marks the test cell as failed) with a message a student can act on: the
name, the rank, how many elements are off, the largest absolute difference,
the index where it is, the two values there, and what the difference shows
as a fact (every element 4x the reference and 4 the world size, a shape one
shard's size, ranks that disagree); a cause is named only where the evidence
rules out the others (``parlab.grading.diagnosis``'s rule; see
``named.assert_grads_match``).

    check.assert_grads_match(grads_rank0, ref_grads, rank=0, world_size=4)
    check.assert_same_across_ranks(params_per_rank, name="params")
    check.assert_shards_reassemble(shards, full_weight, dim=0)

Tolerances follow the backend the answer ran on: every public assertion
takes ``backend=`` ("gloo", "nccl", "cpu:gloo,cuda:nccl"), and the grading
harness wraps whole gradings in ``judged_on(backend)``.

One module per kind of comparison: ``closeness`` (tolerances), ``tensors``
(one tensor), ``named`` (parameters and gradients), ``ranks`` (replicas),
``shards`` and ``collectives``; ``phrases`` holds the wording they share.
"""
from .closeness import tolerances, judged_on, close_mask, same_values
from .phrases import ranks_phrase
from .tensors import assert_close
from .named import grad_scale, named_differ, assert_params_match, assert_grads_match
from .ranks import assert_same_across_ranks
from .shards import assert_shards_reassemble
from .collectives import assert_collective_result

__all__ = [
    "tolerances",
    "judged_on",
    "close_mask",
    "grad_scale",
    "ranks_phrase",
    "same_values",
    "named_differ",
    "assert_close",
    "assert_params_match",
    "assert_grads_match",
    "assert_same_across_ranks",
    "assert_shards_reassemble",
    "assert_collective_result",
]
