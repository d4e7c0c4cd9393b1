"""``parlab preflight``'s ``gpu-queue`` check: NCCL launches of 2, 4 and 8 GPUs through the Slurm queue.

Where the host has GPUs and a Slurm queue, preflight runs ``through_queue``
in a kernel of the throw-away student's server, as a lab's queue cell
launches: ``parlab.launch(..., scheduler="slurm", gpus=n, backend="nccl")``
from a server that holds no GPU.  Each launch all-gathers ``BYTES`` (1 GiB
gathered, bf16) 20 times after 5 warm-ups, timed with CUDA events on every
rank, checks what was gathered, and sends back each rank's seconds; the
slowest rank's time gives the launch's bus bandwidth, nccl-tests' ``busbw``
(``algbw`` S/t times (n-1)/n for an all-gather, ``parlab.cost``).

The figure it is held to: on a DGX H100, NVLink 4's line rate is 450 GB/s
per GPU and direction, and "with the protocol overhead (~20%) NCCL can get
an effective NVLink bandwidth of 370GB/s, which you can observe as 'BusBw'
when running non-allreduce operations" (Sylvain Jeaugey, NVIDIA's NCCL team,
https://github.com/NVIDIA/nccl-tests/issues/212, 2024-05-06).  An all-gather
is such an operation (an all-reduce would use NVLink SHARP, whose busbw is
no wire bandwidth).  A launch is ``ok`` at ``FLOOR`` (half) of that figure or
more, the kit's rule: it tells NVLink from a fallback (a PCIe 5 x16 link
carries at most 64 GB/s per direction), not a tuned node from a good one;
every line states the busbw and its share of the 370 GB/s.  ``verdicts``
judges the results and is unit-tested with made-up ones
(tests/unit/test_preflight_gpu_queue.py); the launches themselves run only on
a host with GPUs and Slurm.
"""
from __future__ import annotations

import shutil
import subprocess
import time

#: busbw of a non-allreduce NCCL collective on a DGX H100 (nccl-tests issue #212, above), bytes/s.
H100_NVLINK_BUSBW = 370e9
#: A launch below this share of ``H100_NVLINK_BUSBW`` fails the check.
FLOOR = 0.5
SIZES = (2, 4, 8)
BYTES = 1 << 30
WARMUP, ITERS = 5, 20


def host_gpus() -> tuple[int, str]:
    """(GPUs ``nvidia-smi -L`` lists on this host, how that was found)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0, "nvidia-smi not found"
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 0, f"nvidia-smi -L failed: {e}"
    gpus = [line for line in listed.stdout.splitlines() if line.startswith("GPU ")]
    return len(gpus), f"nvidia-smi -L lists {len(gpus)}" + (f" (exit {listed.returncode})" if listed.returncode else "")


def all_gather_seconds(nbytes: int, warmup: int, iters: int) -> dict:
    """On each rank: seconds per all-gather of ``nbytes`` gathered, and whether every rank's part arrived."""
    import torch
    import torch.distributed as dist

    import parlab

    n, rank, device = dist.get_world_size(), dist.get_rank(), parlab.device()
    gather = dist.all_gather_single                            # torch 2.13 deprecates all_gather_into_tensor
    part = nbytes // 2 // n                                    # bf16 elements each rank sends
    mine = torch.full((part,), float(rank), dtype=torch.bfloat16, device=device)
    gathered = torch.empty(n * part, dtype=torch.bfloat16, device=device)
    gather(gathered, mine)
    want = torch.arange(n, dtype=torch.bfloat16, device=device).repeat_interleave(part)
    correct = bool(torch.equal(gathered, want))
    for _ in range(warmup):
        gather(gathered, mine)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            gather(gathered, mine)
        end.record()
        torch.cuda.synchronize()
        seconds = start.elapsed_time(end) / 1e3 / iters
        name = torch.cuda.get_device_name(device)
    else:
        begin = time.perf_counter()
        for _ in range(iters):
            gather(gathered, mine)
        seconds, name = (time.perf_counter() - begin) / iters, "cpu"
    return {"seconds": seconds, "correct": correct, "device": name, "bytes": 2 * part * n}


def through_queue(sizes=SIZES, timeout: float = 600, time_limit: float = 10) -> dict:
    """In a student's server: one NCCL launch per size through the Slurm queue; {n: its result or its error}."""
    import parlab

    out = {}
    for n in sizes:
        asked = time.monotonic()
        try:
            ranks = parlab.launch(all_gather_seconds, (BYTES, WARMUP, ITERS), nproc=n, gpus=n, backend="nccl",
                                  scheduler="slurm", timeout=timeout, time_limit=time_limit, plain_results=True)
            out[n] = {"seconds": max(r["seconds"] for r in ranks), "correct": all(r["correct"] for r in ranks),
                      "device": ranks[0]["device"], "bytes": ranks[0]["bytes"],
                      "wall": time.monotonic() - asked}
        except Exception as e:  # noqa: BLE001 - each size's failure is its line
            out[n] = {"error": f"{type(e).__name__}: {e}"[-800:], "wall": time.monotonic() - asked}
    return out


def busbw(result: dict, n: int) -> float:
    from ..cost import algbw, busbw_factor

    return algbw(result["bytes"], result["seconds"]) * busbw_factor("all_gather", n)


def verdicts(results: dict, reference: float = H100_NVLINK_BUSBW, floor: float = FLOOR) -> list[tuple[str, str]]:
    """(status, text) for each launch of ``results`` ({n: through_queue's entry}): ok or FAIL with why."""
    lines = []
    for n in sorted(results, key=int):
        r = results[n]
        if "error" in r:
            lines.append(("FAIL", f"{n} GPUs: the NCCL launch through the queue failed after {r.get('wall', 0):.0f} s: "
                                  f"{r['error']}"))
            continue
        if not r["correct"]:
            lines.append(("FAIL", f"{n} GPUs ({r['device']}): the all-gather returned wrong data"))
            continue
        bw = busbw(r, int(n))
        text = (f"{n} GPUs ({r['device']}): all-gather of {r['bytes'] / 2**30:g} GiB, busbw {bw / 1e9:.0f} GB/s, "
                f"{bw / reference:.0%} of the {reference / 1e9:.0f} GB/s NCCL reaches on a DGX H100 "
                f"(nccl-tests #212); {r.get('wall', 0):.0f} s with the queue's wait")
        lines.append(("ok", text) if bw >= floor * reference else
                     ("FAIL", f"{text}: under {floor:.0%} of it, not NVLink's bandwidth"))
    return lines
