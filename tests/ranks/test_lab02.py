"""Lab 02's checks, through tests/answer_suite.py: the correct answers of tests/wrong_answers/lab02.py
pass, its wrong ones fail with a message that names the mistake, every stated rule is broken by one.

Particular to the lab: what the messages show (step, rank, case; the notebook's words), the bucket
plan's rule, the hint code run on odd results (None gradients, empty results, wrong types)
without any launch, and the public check's report.
"""
import pytest
import torch

from answer_suite import AnswerSuite
from parlab.grading import harness, lab02
from parlab.grading.lab02 import broadcast, bucketed, case as cases
from wrong_answers import lab02 as answers

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(600)]


class TestAnswers(AnswerSuite):
    exercises = lab02.EXERCISES
    answers = answers
    alone_timeout = 20
    batch_timeout = 240

    def breaks(self, rule, message):
        """An answer that never waits also gets wrong values: the never-waited rule's own words come as the hint."""
        return rule.says in message or (rule.broken is bucketed.all_waited and "were never waited on" in message)

    def test_messages_name_step_rank_and_case(self, visible):
        msg = visible[("allreduce", "allreduce_sums")]
        assert "step 1" in msg and "rank 0" in msg and "world_size 2" in msg, msg

    def test_rule_messages_quote_the_notebook(self, visible):
        msg = visible[("bucketed", "BucketsWaitInHook")]
        assert "gives the right values" in msg and "The exercise says:" in msg, msg

    def test_device_ids_error_shows_the_real_valueerror(self, visible):
        msg = visible[("ddp", "ddp_device_ids_zero")]
        assert "ValueError" in msg and "frozen" not in msg, msg

    def test_never_waited_is_not_blamed_on_frozen_parameters(self, visible):
        msg = visible[("bucketed", "BucketsNeverWaited")]
        assert "never waited on" in msg and "requires_grad=False" not in msg, msg


# ---------------------------------------------------------------- bucket rule

def test_bucket_plan_rule():
    model = lab02.Case().build(0)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert lab02.bucket_plan(model, 1 << 30) == [trainable[::-1]]
    assert [len(b) for b in lab02.bucket_plan(model, 1)] == [1] * len(trainable)
    # ln_f.bias + ln_f.weight hold 32 floats each: 256 bytes closes the first bucket (>=).
    assert lab02.bucket_plan(model, 256)[0] == ["ln_f.bias", "ln_f.weight"]
    assert lab02.bucket_plan(model, 257)[0] == ["ln_f.bias", "ln_f.weight", "blocks.1.mlp.down.bias"]
    # The hidden boundary case: the untied lm_head alone fills its bucket exactly.
    untied = lab02.Case(overrides=cases.UNTIED).build(0)
    assert lab02.bucket_plan(untied, bucketed.LM_HEAD_BYTES)[0] == ["lm_head.weight"]


def test_visible_sets_hold_the_boundary_and_unused_traps():
    cases = [c for _, cs in lab02.BUCKETED.visible for c in cs]
    assert any(c.bucket_bytes == 256 and c.frozen for c in cases)
    assert any(c.unused for c in cases)


# ---------------------------------------------------------------- hints on odd results, no launch

def _graded(ex, results, records=None, n=2):
    cases = [c for _, cs in ex.visible for c in cs][:1]
    records = records or [[{"calls": [], "printed": "", "backward": 0, "ddp": 0, "mutated": [],
                            "events": []}] for _ in range(n)]
    return harness.Graded("answer", n, cases, results, "gloo", records)


def _steps(ex, flat, none):
    case = [c for _, cs in ex.visible for c in cs][0]
    params = torch.cat([t.reshape(-1) for t in broadcast.initial(case, 0).values()])
    return [{"grads": {"flat": flat, "none": none}, "params": params, "calls": 0}
            for _ in range(case.steps)]


@pytest.mark.parametrize("ex", ["allreduce", "accum", "bucketed", "ddp", "train"])
def test_trained_graders_explain_odd_results_without_crashing(ex):
    exercise = lab02.EXERCISES[ex]
    case = [c for _, cs in exercise.visible for c in cs][0]
    trainable = [(n, p) for n, p in case.build(0).named_parameters() if p.requires_grad]
    zeros = torch.zeros(sum(p.numel() for _, p in trainable))
    names = [n for n, _ in trainable]
    for results in ([[_steps(exercise, zeros, names)]] * 2,   # None on every rank
                    [[_steps(exercise, torch.zeros(0), [])], [_steps(exercise, zeros, names[:3])]],
                    [[[]], [[]]]):                            # no step at all
        msg = exercise.grade(_graded(exercise, results))
        assert isinstance(msg, str) and msg, msg


def test_shard_grader_names_odd_returns():
    for got, words in ((None, "returned None"), ((), "0-tuple"), ("<ndarray>", "'<ndarray>'"),
                       ((torch.zeros(4, 16), None), "pair of tensors")):
        msg = lab02.SHARD.grade(_graded(lab02.SHARD, [[got], [got]]))
        assert words in msg, msg


def test_broadcast_grader_survives_missing_names():
    msg = lab02.BROADCAST.grade(_graded(lab02.BROADCAST, [[{}], [{}]]))
    assert "Missing" in msg, msg


def test_messages_never_show_equal_values_as_different():
    x = torch.zeros(8, 16, dtype=torch.long)
    got = (x[:4], torch.zeros(8, 16, dtype=torch.long))  # y is the one with the wrong shape
    msg = lab02.SHARD.grade(_graded(lab02.SHARD, [[got], [got]]))
    assert "y of shape (8, 16), expected (4, 16)" in msg, msg


# ---------------------------------------------------------------- public checks

def test_public_check_passes_and_reports(capsys):
    lab02.check_allreduce_gradients(answers.allreduce_flat_avg)
    assert "2 visible cases passed on 2 ranks" in capsys.readouterr().out


def test_not_a_class():
    with pytest.raises(AssertionError, match="expected your BucketedDP"):
        lab02.check_bucketed(None)
