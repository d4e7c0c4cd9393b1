"""Lab 05's checks, through tests/answer_suite.py: the correct answers of tests/wrong_answers/lab05.py
pass, its wrong ones fail with a message that names the mistake, every stated rule is broken by one.

Every answer of every exercise is graded in one ``harness.grade_batch`` per test set: one launch
at 3 ranks for the visible cases, and for the hidden ones one at 4 ranks (ZeRO) and one at 2
(FSDP2) (a launch costs 10-60 s on this 2-core machine).
"""
import pytest

from answer_suite import AnswerSuite
from parlab.grading import lab05
from parlab.grading.lab05 import hints
from wrong_answers import lab05 as answers

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(600)]


class TestAnswers(AnswerSuite):
    exercises = lab05.EXERCISES
    answers = answers


def test_not_a_class():
    with pytest.raises(AssertionError, match="expected your ZeRO1"):
        lab05.check_zero1(None)


def test_uneven_shard_hint_fires_on_gloo_wording():
    """gloo's own size check (an unpadded all-gather) gets the padding hint, as torch's does."""
    gloo = "RuntimeError: Check failed: outputShape[0] * worldSize == inputShape[0] (84 vs. 83)"
    for text in (gloo, "ValueError: output tensor size must be equal to world_size times input"):
        assert "pad the flat vector" in hints.frozen_hint(text)
        assert "pad the flat vector" in hints.error_hint(text)
    assert hints.error_hint("RuntimeError: something else") == ""


def _records(case, n, wrong=None):
    """Each rank's optimizer record (``states.Recorder.result``) of a right ZeRO-1 on the notebook's
    layout (one flat shard of ceil(Ψ / N) elements per rank, padded), built from the reference;
    ``wrong(rank, step, snapshot)`` may change a snapshot."""
    import torch

    from parlab.grading.lab05 import zero

    trainable = ~case.frozen_mask()
    flats = [f[trainable] for f in zero.reference(case, n)]
    steps = zero.reference_steps(case, n)
    c = -(-case.trainable // n)

    def shard(v, r):  # (c,): rank r's slice of a (Ψ,) vector, padded with zeros
        out = torch.zeros(c * n, dtype=torch.float64)
        out[:v.numel()] = v.double()
        return tuple(out[r * c:(r + 1) * c].tolist())

    out = []
    for r in range(n):
        stepped = []
        for t, ref in enumerate(steps):
            snap = {"key": 0, "grad": shard(ref["grad"], r), "value": shard(flats[t + 1], r),
                    "state": {k: shard(v, r) for k, v in ref["state"].items()}}
            if wrong:
                wrong(r, t, snap)
            stepped.append({"phase": t, "tensors": [snap]})
        out.append({"optimizers": {"handed": [(-1, shard(flats[0], r))], "stepped": stepped}})
    return out


def test_state_report_places_shards_and_finds_the_first_state_that_differs():
    """``states.first_difference`` without a launch: a right record says the optimizers matched at
    every step; a momentum changed on one rank at step 2 is reported as that state, step and rank,
    with the gradient matched before it; a handed tensor no layout places gives no report."""
    import torch

    from parlab.grading.lab05 import states, zero

    case, n = zero.Case((4, 6, 5, 3)), 3
    ref, steps = zero.reference(case, n), zero.reference_steps(case, n)
    text = states.first_difference(case, n, 2, _records(case, n), ref, steps)
    assert "every rank's optimizer stepped its elements as the reference did at steps 1 to 2" in text

    def momentum(r, t, snap):
        if r == 1 and t == 1:
            snap["state"]["momentum_buffer"] = tuple(2 * v for v in snap["state"]["momentum_buffer"])

    text = states.first_difference(case, n, 2, _records(case, n, momentum), ref, steps)
    assert ("the first state of the optimizers that differs is SGD's momentum (momentum_buffer), at "
            "step 2, on rank 1: rank 1's shard of elements 28..55") in text
    assert "it is 2x the reference" in text and "the gradient the optimizers stepped with matched" in text

    def summed(r, t, snap):
        snap["grad"] = tuple(n * v for v in snap["grad"])

    text = states.first_difference(case, n, 1, _records(case, n, summed), ref, steps)
    assert ("the first state of the optimizers that differs is the gradient the optimizers stepped "
            "with, at step 1, on ranks 0, 1 and 2") in text
    assert "it is 3x the reference, and 3 is the world size N" in text

    records = _records(case, n)
    phase, values = records[2]["optimizers"]["handed"][0]
    records[2]["optimizers"]["handed"][0] = (phase, tuple(reversed(values)))  # no layout places it
    assert states.first_difference(case, n, 2, records, ref, steps) == ""
    # the places: a padded slice of one tensor, padding only, and a vector found twice
    frame = ref[0].double()
    assert states.placed(torch.cat([frame[30:36], torch.zeros(2, dtype=torch.float64)]), frame) == (30, 6)
    assert states.placed(torch.zeros(4, dtype=torch.float64), frame) == (0, 0)
    assert states.placed(torch.ones(3, dtype=torch.float64), torch.ones(9, dtype=torch.float64)) is None
