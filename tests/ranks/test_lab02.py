"""Lab 02's checks, through tests/answer_suite.py: the correct answers of tests/wrong_answers/lab02.py
pass, its wrong ones fail with a message that names the mistake, every stated rule is broken by one.

Particular to the lab: what the messages show (step, rank, case; the notebook's words), the bucket
plan's rule, the hint code run on odd results (None gradients, empty results, wrong types)
without any launch, and the public check's report.
"""
import sys

import pytest
import torch

from answer_suite import AnswerSuite
from parlab.grading import harness, lab02
from parlab.grading.lab02 import broadcast, bucketed, case as cases, training
from parlab.reference import mean_backward
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

    # Each reads one answer's message, named as parameters: -k <exercise> selects it and grades only that.
    @pytest.mark.parametrize("key,answer", [("allreduce", "allreduce_sums")])
    def test_messages_name_step_rank_and_case(self, visible, key, answer):
        msg = visible[(key, answer)]
        assert "step 1" in msg and "rank 0" in msg and "world_size 2" in msg, msg

    @pytest.mark.parametrize("key,answer", [("bucketed", "BucketsWaitInHook")])
    def test_rule_messages_quote_the_notebook(self, visible, key, answer):
        msg = visible[(key, answer)]
        assert "gives the right values" in msg and "The exercise says:" in msg, msg

    @pytest.mark.parametrize("key,answer", [("ddp", "ddp_device_ids_zero")])
    def test_device_ids_error_shows_the_real_valueerror(self, visible, key, answer):
        msg = visible[(key, answer)]
        assert "ValueError" in msg and "frozen" not in msg, msg

    @pytest.mark.parametrize("key,answer", [("bucketed", "BucketsNeverWaited")])
    def test_never_waited_is_not_blamed_on_frozen_parameters(self, visible, key, answer):
        msg = visible[(key, answer)]
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


#: The exercises graded against a single-process training run: their grader carries its reference.
TRAINED = [key for key, ex in lab02.EXERCISES.items() if hasattr(ex.grade, "reference")]


def test_every_exercise_on_the_training_runner_is_listed():
    """Derived, not kept by hand: an exercise whose module builds its grader with grade_trained is in TRAINED."""
    on_runner = [key for key, ex in lab02.EXERCISES.items()
                 if getattr(sys.modules[ex.run.__module__], "grade_trained", None) is training.grade_trained]
    assert on_runner and on_runner == TRAINED, (on_runner, TRAINED)


@pytest.mark.parametrize("ex", TRAINED)
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


def _clipped(net, x, y, grad_accum):
    """A variant's training step: the default gradients, clipped to norm 0.05 before the SGD step."""
    loss = mean_backward(net, x, y, grad_accum)
    torch.nn.utils.clip_grad_norm_(net.parameters(), 0.05)
    return loss


def test_a_variant_grader_takes_its_own_reference_not_a_keyword_of_parlab_reference():
    """Ranks that reproduce a clipped run pass a grader given that reference (as a spec or a
    function) and fail the default one, which still compares with plain SGD on the mean loss."""
    case = [c for _, cs in lab02.ALLREDUCE.visible for c in cs][0]
    spec = training.grade_trained(0, training.sum_or_twice, lambda *a: "", reference={"backward": _clipped})
    function = training.grade_trained(0, training.sum_or_twice, lambda *a: "",
                                      reference=lambda c, seed: training.reference_run(c, seed, backward=_clipped))
    ref = spec.reference(case, 0)
    trainable = [n for n, p in case.build(0).named_parameters() if p.requires_grad]
    assert torch.linalg.vector_norm(torch.cat([ref.grads[0][n].reshape(-1) for n in trainable])) <= 0.05 + 1e-6
    clipped_run = [{"grads": {"flat": training.flat(s.grads[n] for n in trainable), "none": []},
                    "params": training.flat(s.params.values())} for s in ref.steps]
    graded = harness.Graded("clipped", 2, [case], [[clipped_run], [clipped_run]])
    assert spec(graded) is None and function(graded) is None
    assert "do not match the single-process full-batch reference" in lab02.ALLREDUCE.grade(graded)
    assert training.reference(case, 0).settings["backward"] == "mean_backward"


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
