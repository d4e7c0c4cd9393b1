"""parlab doctor's GPU decisions, from injected facts (no GPU needed), the
nvidia-smi parsers on real output shapes, and the exit code naming the failing check."""
import pytest

import parlab
from parlab import doctor
from parlab.doctor import GpuFacts, GpuProcess, gpu_rows, parse_gpu_list, parse_processes

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

H100 = "NVIDIA H100 80GB HBM3"
SMI_L = """GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa1111-0000-0000-0000-000000000000)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-bbbb2222-0000-0000-0000-000000000000)
"""
SMI_L_MIG = """GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa1111-0000-0000-0000-000000000000)
  MIG 1g.10gb     Device  0: (UUID: MIG-11111111-0000-0000-0000-000000000000)
  MIG 1g.10gb     Device  1: (UUID: MIG-22222222-0000-0000-0000-000000000000)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-bbbb2222-0000-0000-0000-000000000000)
"""


def failed(rows):
    return {what: detail for what, ok, detail in rows if not ok}


def test_cpu_machine_is_fine():
    assert gpu_rows(GpuFacts()) == [("GPUs", True, "0: none (labs run on CPU with gloo)")]


def test_healthy_gpus():
    rows = gpu_rows(GpuFacts(torch_cuda="12.8", usable=2, names=(H100, H100), smi_gpus=("0", "1")))
    assert failed(rows) == {}
    assert rows[0] == ("GPUs", True, f"2: {H100}, {H100}")
    assert ("GPU processes", True, "none besides this one") in rows


def test_mig_slices_fail_with_the_reason():
    rows = gpu_rows(GpuFacts(torch_cuda="12.8", usable=1, names=(H100 + " MIG 1g.10gb",), smi_gpus=(),
                             mig=("MIG 1g.10gb (MIG-1111)",)))
    why = failed(rows)["MIG"]
    assert "1 MIG instance(s) visible (MIG 1g.10gb (MIG-1111))" in why
    assert "a process sees at most one MIG instance" in why and "CUDA_VISIBLE_DEVICES=''" in why


def test_other_processes_on_the_gpus_fail_and_are_named():
    procs = (GpuProcess(4242, "0", 30_000, "python", "bob"), GpuProcess(77, "1", 500, "python", "me"),
             GpuProcess(9, "1", 1000, "train", None))
    rows = gpu_rows(GpuFacts(torch_cuda="12.8", usable=2, names=(H100, H100), smi_gpus=("0", "1"),
                             processes=procs, me="me"))
    why = failed(rows)["GPU processes"]
    assert "pid 4242 (python, user bob) holds 30,000 MiB on GPU 0" in why
    assert "pid 77 (python, yours) holds 500 MiB on GPU 1" in why
    assert "pid 9 (train, owner not visible from here)" in why


def test_gpus_listed_but_not_usable():
    cpu_build = failed(gpu_rows(GpuFacts(torch_cuda=None, usable=0, smi_gpus=("0",))))
    assert "nvidia-smi lists 1 GPU(s) but torch sees none: this torch is a CPU build" in cpu_build["GPUs"]
    driver = failed(gpu_rows(GpuFacts(torch_cuda="12.8", usable=0, smi_gpus=("0", "1"),
                                      probe_error="RuntimeError: The NVIDIA driver on your system is too old")))
    assert driver["GPUs"].endswith("torch (CUDA 12.8) cannot use them: RuntimeError: The NVIDIA driver on "
                                   "your system is too old")
    broken = failed(gpu_rows(GpuFacts(torch_cuda="12.8", usable=1, names=(H100,), smi_gpus=("0",),
                                      probe_error="CUDA error: uncorrectable ECC error encountered")))
    assert "CUDA fails on them: CUDA error: uncorrectable ECC error" in broken["CUDA start-up"]


def test_without_nvidia_smi_processes_are_not_checked():
    rows = gpu_rows(GpuFacts(torch_cuda="12.8", usable=1, names=(H100,), smi_gpus=None))
    assert ("GPU processes", True, "not checked (nvidia-smi not found)") in rows


def test_parse_gpu_list_follows_cuda_visible_devices():
    assert parse_gpu_list(SMI_L, None) == ([("0", "GPU-aaaa1111-0000-0000-0000-000000000000"),
                                            ("1", "GPU-bbbb2222-0000-0000-0000-000000000000")], [])
    assert [i for i, _ in parse_gpu_list(SMI_L, "1")[0]] == ["1"]
    assert [i for i, _ in parse_gpu_list(SMI_L, "GPU-bbbb2222")[0]] == ["1"]  # a UUID prefix
    assert parse_gpu_list(SMI_L, "")[0] == []  # hidden
    gpus, mig = parse_gpu_list(SMI_L_MIG, None)
    assert len(gpus) == 2 and mig == ["MIG 1g.10gb (MIG-11111111-0000-0000-0000-000000000000)",
                                      "MIG 1g.10gb (MIG-22222222-0000-0000-0000-000000000000)"]
    gpus, mig = parse_gpu_list(SMI_L_MIG, "MIG-22222222-0000-0000-0000-000000000000")  # a spawner's slice
    assert gpus == [] and mig == ["MIG 1g.10gb (MIG-22222222-0000-0000-0000-000000000000)"]
    assert parse_gpu_list(SMI_L_MIG, "1") == ([("1", "GPU-bbbb2222-0000-0000-0000-000000000000")], [])


def test_parse_processes_keeps_visible_gpus_and_skips_this_process():
    gpus = [("1", "GPU-bbbb2222-0000-0000-0000-000000000000")]
    text = ("4242, GPU-bbbb2222-0000-0000-0000-000000000000, 30000, python\n"
            "5, GPU-aaaa1111-0000-0000-0000-000000000000, 100, other-gpu\n"
            "6, GPU-bbbb2222-0000-0000-0000-000000000000, [N/A], /usr/bin/python3, with, commas\n"
            "123, GPU-bbbb2222-0000-0000-0000-000000000000, 10, me\n")
    assert parse_processes(text, gpus, skip={123}) == [(4242, "1", 30000, "python"),
                                                         (6, "1", 0, "/usr/bin/python3, with, commas")]


def test_gpu_facts_on_this_machine_degrade_gracefully():
    facts = doctor.gpu_facts()  # no GPU and no nvidia-smi here: nothing probed, nothing fails
    assert failed(gpu_rows(facts)) == {} or facts.usable > 0


def test_main_exits_nonzero_naming_the_failing_check(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "gpu_facts", lambda: GpuFacts(torch_cuda="12.8", usable=1, names=(H100,),
                                                             smi_gpus=("0",), mig=("MIG 1g.10gb (MIG-1)",)))

    def broken_launch(*args, **kwargs):
        raise parlab.LaunchError("ranks could not connect")

    monkeypatch.setattr(parlab, "launch", broken_launch)
    assert doctor.main() == 1
    captured = capsys.readouterr()
    assert "BAD  MIG" in captured.out and "ranks could not connect" in captured.out
    assert "2 problem(s): MIG; 1-rank all_reduce" in captured.err


def test_while_grading_the_doctor_launches_nothing_and_says_why(monkeypatch, capsys):
    from parlab.grading.harness import AUTOGRADE_ENV

    def no_checks():
        raise AssertionError("the doctor ran its checks (and their launches) inside a grading")

    monkeypatch.setattr(doctor, "checks", no_checks)
    monkeypatch.setenv(AUTOGRADE_ENV, "1")
    assert doctor.main() == 0
    assert "not run while this notebook is being graded" in capsys.readouterr().out
    monkeypatch.delenv(AUTOGRADE_ENV)
    with pytest.raises(AssertionError, match="ran its checks"):
        doctor.main()
