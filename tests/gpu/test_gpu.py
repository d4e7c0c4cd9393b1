"""The GPU tier (``pytest -m gpu``, ``make test-gpu``): the kit on NCCL with ranks on GPUs.

Skipped without CUDA (tests/conftest.py).  With one GPU it runs a 1-rank
NCCL launch, a training step of each tiny model on CUDA, and each lab's
solution answers through that lab's checks at world size 1 on NCCL; with two
or more GPUs, the labs' own checks at their world sizes (2 to 4), on NCCL
wherever the GPUs suffice.  Every launch here runs under the strict-device
spy (strict.py): a tensor that is not on the rank's device, reaching a
collective, fails the test even though the launcher's mixed
"cpu:gloo,cuda:nccl" group would have carried it over gloo.
"""
import pytest
import torch

import parlab
from parlab.models import MODELS
from lab_solutions import checked_answers, one_rank_exercises, resolve_check, solution_answers
from strict import strict_ranks, wrong_device_then_right  # noqa: F401 - fixture
from train_step import sgd_step

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

LABS = ["00-setup", "01-collectives", "02-data-parallel"]


def gpus() -> int:
    return torch.cuda.device_count()


def test_one_rank_launch_is_nccl_on_cuda_and_refuses_cpu_tensors(strict_ranks):
    (refused, total, device, backend), = parlab.launch(wrong_device_then_right, args=("cpu",), nproc=1)
    assert (total, device) == (1.0, "cuda:0") and "nccl" in backend
    assert refused and "dist.all_reduce got a tensor on cpu" in refused


@pytest.mark.parametrize("name", sorted(MODELS))
def test_tiny_model_trains_one_step_on_cuda(name):
    on_gpu, on_cpu = sgd_step(name, "cuda"), sgd_step(name, "cpu")
    assert on_gpu["grad_devices"] == {"cuda:0"}
    assert on_gpu["after"] < on_gpu["loss"] and on_gpu["moved"] > 0
    assert on_gpu["loss"] == pytest.approx(on_cpu["loss"], rel=1e-4)  # same model, same batch


@pytest.mark.parametrize("lab", ["01-collectives", "02-data-parallel"])
def test_solutions_pass_their_checks_at_world_size_1_on_nccl(lab, strict_ranks):
    from parlab.grading.harness import grade_batch

    batch, missing = one_rank_exercises(lab)
    if batch:
        report = grade_batch(batch, backend="nccl", catch=False, timeout=600)  # every case in one launch
        assert {k: v for k, v in report.items() if v} == {}
    if missing:
        pytest.skip(f"{len(missing)} check(s) carry no Exercise to re-run at world size 1 "
                    f"(written before parlab.grading.harness): {', '.join(missing)}")


@pytest.mark.parametrize("lab", LABS)
def test_solutions_pass_their_checks_at_their_world_sizes(lab, strict_ranks, capsys):
    if gpus() < 2:
        pytest.skip(f"the labs' checks run on 2 to 4 ranks; NCCL needs a GPU per rank and {gpus()} is visible")
    answers = solution_answers(lab)
    for dotted, name in checked_answers(lab):
        check = resolve_check(dotted)
        check(answers[name])
        check(answers[name], hidden=True)
    assert "passed" in capsys.readouterr().out
