"""``parlab preflight``'s gpu-queue check, judged on made-up launch results; on this host, skipped with why.

The NCCL launches through the Slurm queue (``parlab.preflight.gpu_queue.through_queue``) run only on
a host with GPUs and Slurm; here the verdicts on their results are checked: the bus bandwidth from
the slowest rank's seconds (nccl-tests' all-gather busbw), ok at half of the 370 GB/s NCCL reaches on a
DGX H100 or more, FAIL under it, on wrong data or on a launch that failed, and a size the host has
too few GPUs for skipped.
"""
from __future__ import annotations

import json
import shutil

import pytest

from parlab import preflight
from parlab.preflight import gpu_queue

pytestmark = pytest.mark.unit

GIB = 1 << 30


def result(seconds: float, correct: bool = True) -> dict:
    return {"seconds": seconds, "correct": correct, "device": "NVIDIA H100 80GB HBM3", "bytes": GIB, "wall": 31.0}


def test_busbw_is_nccl_tests_all_gather_busbw():
    # 1 GiB gathered in 2.5 ms on 8 ranks: algbw 429.5 GB/s, busbw 7/8 of it
    assert gpu_queue.busbw(result(2.5e-3), 8) == pytest.approx(GIB / 2.5e-3 * 7 / 8)
    assert gpu_queue.busbw(result(2.5e-3), 2) == pytest.approx(GIB / 2.5e-3 / 2)


def test_the_verdicts():
    lines = gpu_queue.verdicts({
        "2": result(GIB / 2 / 350e9),                        # busbw 350 GB/s: 95 %
        "4": result(GIB * 3 / 4 / 100e9),                    # 100 GB/s: 27 %, under half
        "8": {"error": "LaunchTimeout: no rank started", "wall": 600.0},
    })
    assert [s for s, _ in lines] == ["ok", "FAIL", "FAIL"], lines
    assert "busbw 350 GB/s, 95% of the 370 GB/s" in lines[0][1] and "(nccl-tests #212)" in lines[0][1]
    assert "busbw 100 GB/s, 27% of the 370 GB/s" in lines[1][1] and "under 50% of it" in lines[1][1]
    assert lines[2][1].startswith("8 GPUs: the NCCL launch through the queue failed after 600 s: LaunchTimeout")
    wrong = gpu_queue.verdicts({8: result(2.5e-3, correct=False)})
    assert wrong == [("FAIL", "8 GPUs (NVIDIA H100 80GB HBM3): the all-gather returned wrong data")]
    at_floor = GIB * 7 / 8 / (gpu_queue.FLOOR * gpu_queue.H100_NVLINK_BUSBW)
    assert gpu_queue.verdicts({8: result(at_floor)})[0][0] == "ok"
    assert gpu_queue.verdicts({8: result(at_floor * 1.01)})[0][0] == "FAIL"


def lines_of(report: preflight.Report) -> list[tuple[str, str]]:
    return [(line.split()[0], line.split(None, 2)[2]) for line in report.lines]


def test_no_gpu_on_this_host_is_skipped_saying_so():
    count, how = gpu_queue.host_gpus()
    if count:
        pytest.skip(f"this host has GPUs ({how})")
    report = preflight.Report()
    preflight.check_gpu_queue(report, run_in_server=None)  # nothing may be run in a server
    assert lines_of(report) == [("skip", f"no GPU on this host ({how}): no NCCL launch through the queue to run")]
    assert not report.failed


def test_gpus_without_slurm_are_skipped(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda tool: None)
    report = preflight.Report()
    preflight.check_gpu_queue(report, run_in_server=None, gpus=(8, "nvidia-smi -L lists 8"))
    assert lines_of(report)[0][0] == "skip" and "no Slurm queue (sinfo not found)" in report.lines[0]


def test_the_launches_run_in_the_students_server_and_each_gets_its_line(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda tool: f"/usr/bin/{tool}")
    asked = []

    def run_in_server(code, timeout):
        asked.append(code)
        return "NCCL INFO ...\nPREFLIGHT-GPU " + json.dumps({"2": result(GIB / 2 / 360e9),
                                                            "4": result(GIB * 3 / 4 / 20e9)}) + "\n"
    report = preflight.Report()
    preflight.check_gpu_queue(report, run_in_server, gpus=(4, "nvidia-smi -L lists 4"))
    assert "through_queue([2, 4])" in asked[0]
    got = lines_of(report)
    assert [s for s, _ in got] == ["ok", "FAIL", "skip"], got
    assert "Remedy: check the node's NVLink" in got[1][1] and got[2][1] == "8 GPUs: the host has 4"
    assert report.failed == ["gpu-queue"]

    report = preflight.Report()
    preflight.check_gpu_queue(report, lambda code, timeout: "Traceback: srun: error: Unable to allocate resources",
                              gpus=(2, "nvidia-smi -L lists 2"))
    assert report.failed == ["gpu-queue"] and "did not report" in report.lines[0]
