"""The GPU tier's own machinery, run where there is no GPU (gloo, CPU).

The strict-device spy refuses a tensor off the rank's device (here a meta
tensor on a CPU rank) and lets the right one through; the solution answers
and the checks they go through are found in the notebooks; the tiny models'
training step runs; and the labs' exercises re-declared at world size 1 pass
on one gloo rank, which is the GPU tier's world-size-1 test with gloo for NCCL.
"""
import pytest

import parlab
from parlab.grading import lab02
from lab_solutions import checked_answers, one_rank_exercises, resolve_check, solution_answers
from strict import strict_ranks, wrong_device_then_right  # noqa: F401 - fixture
from train_step import sgd_step

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(900)]


def test_strict_spy_refuses_a_tensor_off_the_rank_device(strict_ranks):
    (refused, total, device, backend), = parlab.launch(wrong_device_then_right, args=("meta",), nproc=1,
                                                       backend="gloo")
    assert (total, device, backend) == (1.0, "cpu", "gloo")
    assert refused and "dist.all_reduce got a tensor on meta, but this rank's device is cpu" in refused


def test_solution_answers_and_their_checks_are_found():
    answers = solution_answers("02-data-parallel")
    pairs = checked_answers("02-data-parallel")
    assert ("lab02.check_bucketed", "BucketedDP") in pairs
    assert len(pairs) == len(lab02.EXERCISES) and \
        {resolve_check(dotted).exercise for dotted, _ in pairs} == set(lab02.EXERCISES.values())  # one pair each
    assert all(name in answers and callable(resolve_check(dotted)) for dotted, name in pairs)
    assert answers["my_batch"].__globals__["dist"].__name__ == "torch.distributed"  # imports came along
    numbers = solution_answers("00-setup")  # lab 00's arithmetic checks run in-process
    for dotted, name in checked_answers("00-setup"):
        if name != "hello":
            resolve_check(dotted)(numbers[name], hidden=True)


def test_training_step_helper_on_cpu():
    step = sgd_step("gpt", "cpu")
    assert step["grad_devices"] == {"cpu"} and step["after"] < step["loss"] and step["moved"] > 0


@pytest.mark.parametrize("lab", ["01-collectives", "02-data-parallel"])
def test_solutions_pass_their_checks_at_world_size_1_on_gloo(lab, strict_ranks):
    from parlab.grading.harness import grade_batch

    batch, missing = one_rank_exercises(lab, with_hidden=False)  # the GPU tier runs the hidden ones too
    if not batch:
        pytest.skip(f"no check of {lab} carries an Exercise yet: {', '.join(missing)}")
    report = grade_batch(batch, backend="gloo", catch=False, timeout=600)  # every case in one launch
    assert report and {k: v for k, v in report.items() if v} == {}
