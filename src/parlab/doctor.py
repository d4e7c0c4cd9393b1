"""``parlab doctor``: is this machine ready for the labs?  Run it first.

It checks torch, the backends, the GPUs, the cores and a 2-rank all-reduce
(1 rank on a one-GPU machine), cold (``parlab.launch``) and on a warm group
(``parlab.start``), and exits non-zero naming every failed check.

The GPU checks are split in two so that the decision can be tested without a
GPU: ``gpu_facts()`` gathers what the machine says (torch, ``nvidia-smi``,
``CUDA_VISIBLE_DEVICES``, a CUDA probe in a child process) and
``gpu_rows(facts)`` decides.  A GPU set-up that cannot run the labs fails
with the reason:

- MIG slices: NCCL runs one rank per GPU, and a process sees at most one MIG
  instance, so the multi-rank labs cannot use NCCL on MIG slices;
- other processes on the visible GPUs: another job shares the GPU's memory
  and makes every timing wrong;
- GPUs that ``nvidia-smi`` lists but torch cannot use (a CPU build of torch,
  a driver too old for torch's CUDA), or CUDA failing to start on a GPU.

Nothing here creates a CUDA context in the calling process (the lab 00
notebook runs ``main()`` in the student's kernel): the probe that touches
each GPU runs in a child process that exits.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

from .cores import cores_text

Row = tuple[str, bool, str]


@dataclass(frozen=True)
class GpuProcess:
    """A compute process that ``nvidia-smi`` shows on one of the visible GPUs."""

    pid: int
    gpu: str            # the GPU's index as nvidia-smi numbers it
    used_mib: int
    name: str
    user: str | None    # None: not visible from here (another container, most likely)


@dataclass(frozen=True)
class GpuFacts:
    """What the machine says about its GPUs; ``gpu_rows`` turns it into checks."""

    torch_cuda: str | None = None        # torch.version.cuda; None for a CPU build
    usable: int = 0                      # torch.cuda.device_count() when CUDA is available
    names: tuple[str, ...] = ()          # torch's device names
    smi_gpus: tuple[str, ...] | None = None  # GPUs nvidia-smi lists (visible ones); None: no nvidia-smi
    mig: tuple[str, ...] = ()            # MIG instances visible to this process
    processes: tuple[GpuProcess, ...] = field(default=())
    probe_error: str | None = None       # what the CUDA probe said when it failed
    me: str = ""                         # this user's name


# ---------------------------------------------------------------- deciding

_MIG_WHY = ("NCCL runs one rank per GPU and a process sees at most one MIG instance, so the "
            "multi-rank labs cannot use NCCL on MIG slices. Ask the administrator for whole GPUs "
            "(docs/jupyterhub.md), or hide the GPU (CUDA_VISIBLE_DEVICES='') to run every lab on "
            "the CPU with gloo")


def _describe(p: GpuProcess, me: str) -> str:
    who = ("yours" if p.user == me else f"user {p.user}") if p.user else "owner not visible from here"
    return f"pid {p.pid} ({p.name}, {who}) holds {p.used_mib:,} MiB on GPU {p.gpu}"


def gpu_rows(f: GpuFacts) -> list[Row]:
    """(what, ok, detail) for the GPU checks, from facts alone."""
    listed = len(f.smi_gpus or ())
    if f.usable == 0:
        if listed == 0:
            return [("GPUs", True, "0: none (labs run on CPU with gloo)")]
        if f.torch_cuda is None:
            why = ("this torch is a CPU build: install the CUDA build (environment.yml), or set "
                   "CUDA_VISIBLE_DEVICES='' to run the labs on the CPU")
        else:
            why = (f"torch (CUDA {f.torch_cuda}) cannot use them"
                   + (f": {f.probe_error}" if f.probe_error else
                      ": is the driver older than torch's CUDA? Compare `nvidia-smi` with torch.version.cuda"))
        return [("GPUs", False, f"nvidia-smi lists {listed} GPU(s) but torch sees none: {why}")]
    rows: list[Row] = [("GPUs", True, f"{f.usable}: {', '.join(f.names)}")]
    if f.probe_error:
        rows.append(("CUDA start-up", False, f"the GPUs are listed but CUDA fails on them: {f.probe_error}"))
    if f.mig:
        rows.append(("MIG", False, f"{len(f.mig)} MIG instance(s) visible ({', '.join(f.mig)}): {_MIG_WHY}"))
    if f.smi_gpus is None:
        rows.append(("GPU processes", True, "not checked (nvidia-smi not found)"))
    elif f.processes:
        rows.append(("GPU processes", False,
                     "other processes use the visible GPUs: "
                     + "; ".join(_describe(p, f.me) for p in f.processes)
                     + ". A shared GPU makes timings wrong and can run out of memory: stop your own "
                       "leftovers, and ask the administrator for GPUs of your own"))
    else:
        rows.append(("GPU processes", True, "none besides this one"))
    return rows


# ---------------------------------------------------------------- gathering

def _smi(*args: str) -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _visible(index: str, uuid: str, env: str | None) -> bool:
    """Whether CUDA_VISIBLE_DEVICES (indices or UUIDs, maybe shortened) lets this GPU through."""
    if env is None:
        return True
    return any(e and (e == index or uuid.startswith(e)) for e in (x.strip() for x in env.split(",")))


def parse_gpu_list(text: str, env: str | None) -> tuple[list[tuple[str, str]], list[str]]:
    """``nvidia-smi -L`` -> ([(index, uuid) of visible GPUs], [visible MIG instances])."""
    gpus, mig, parent_visible = [], [], False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("GPU "):
            index = stripped[4:].split(":", 1)[0]
            uuid = stripped.rsplit("UUID: ", 1)[-1].rstrip(")")
            parent_visible = _visible(index, uuid, env)
            if parent_visible:
                gpus.append((index, uuid))
        elif stripped.startswith("MIG ") and "UUID: " in stripped:
            uuid = stripped.rsplit("UUID: ", 1)[-1].rstrip(")")
            if parent_visible or (env is not None and _visible("", uuid, env)):
                mig.append(stripped.split("Device", 1)[0].strip() + f" ({uuid})")
    return gpus, mig


def parse_processes(text: str, gpus: list[tuple[str, str]], skip: set[int]) -> list[tuple[int, str, int, str]]:
    """``--query-compute-apps=pid,gpu_uuid,used_memory,process_name`` -> [(pid, gpu index, MiB, name)]."""
    index_of = {uuid: index for index, uuid in gpus}
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",", 3)]
        if len(parts) != 4 or not parts[0].isdigit() or parts[1] not in index_of:
            continue
        pid = int(parts[0])
        if pid not in skip:
            used = int(parts[2]) if parts[2].isdigit() else 0
            out.append((pid, index_of[parts[1]], used, parts[3]))
    return out


def _user_of(pid: int) -> str | None:
    try:
        import pwd

        return pwd.getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_name
    except (OSError, KeyError, ImportError):
        return None


_PROBE = ("import torch\n"
          "torch.cuda.init()\n"  # raises with the reason (no driver, driver too old, ...)
          "for i in range(torch.cuda.device_count()):\n"
          "    assert torch.ones(1, device=f'cuda:{i}').add(1).item() == 2.0\n")


def _probe_cuda() -> str | None:
    """Touch every GPU in a child process; the last line of its error, or None."""
    try:
        out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "a tiny CUDA computation did not finish in 120 s"
    if out.returncode == 0:
        return None
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    return lines[-1] if lines else f"the probe exited with code {out.returncode}"


def gpu_facts() -> GpuFacts:
    """Gather the facts on this machine (no CUDA context in this process)."""
    import getpass

    import torch

    usable = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = tuple(torch.cuda.get_device_name(i) for i in range(usable))
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    listing = _smi("-L")
    smi_gpus = processes = None
    mig: list[str] = []
    if listing is not None:
        gpus, mig = parse_gpu_list(listing, env)
        smi_gpus = tuple(index for index, _ in gpus)
        apps = _smi("--query-compute-apps=pid,gpu_uuid,used_memory,process_name",
                    "--format=csv,noheader,nounits") or ""
        processes = tuple(GpuProcess(pid, gpu, used, name, _user_of(pid))
                          for pid, gpu, used, name in parse_processes(apps, gpus, {os.getpid()}))
    if not mig:  # no nvidia-smi here: torch's names still say "MIG 1g.10gb" on a slice
        mig = [n for n in names if "MIG" in n]
    probe = _probe_cuda() if torch.version.cuda and (usable or smi_gpus) else None
    return GpuFacts(torch_cuda=torch.version.cuda, usable=usable, names=names, smi_gpus=smi_gpus,
                    mig=tuple(mig), processes=processes or (), probe_error=probe, me=getpass.getuser())


# ---------------------------------------------------------------- the report

def _all_reduce_smoke() -> tuple[float, str]:
    import torch
    import torch.distributed as dist

    import parlab

    t = torch.tensor([float(dist.get_rank() + 1)], device=parlab.device())
    dist.all_reduce(t)
    return t.item(), f"{dist.get_backend()} on {t.device}"


def checks() -> list[Row]:
    """(what, ok, detail) for each check, in order."""
    rows: list[Row] = []
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        return [("torch", False, f"cannot import torch ({exc}); run `make lab` or `pip install -e .`")]
    rows.append(("torch", True, f"{torch.__version__} (Python {sys.version.split()[0]})"))
    if not dist.is_available():
        rows.append(("torch.distributed", False, "this torch build has no distributed support"))
        return rows
    backends = {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(), "mpi": dist.is_mpi_available()}
    listed = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in backends.items())
    rows.append(("backends", backends["gloo"] or backends["nccl"], listed))
    facts = gpu_facts()
    rows += gpu_rows(facts)
    rows.append(("CPU cores", True, cores_text()))
    import parlab

    nproc = 1 if facts.usable == 1 else 2  # NCCL needs a GPU per rank; 1 GPU tests NCCL at 1 rank
    start = time.perf_counter()
    try:
        got = parlab.launch(_all_reduce_smoke, nproc=nproc, timeout=120)
    except Exception as exc:  # noqa: BLE001 - report, don't crash
        rows.append((f"{nproc}-rank all_reduce", False, f"{type(exc).__name__}: {exc}"))
        return rows
    expected = float(sum(range(1, nproc + 1)))
    ok = [value for value, _ in got] == [expected] * nproc
    rows.append((f"{nproc}-rank all_reduce ({got[0][1]})", ok,
                 f"{[value for value, _ in got]} in {time.perf_counter() - start:.1f} s"
                 + ("" if ok else f", expected {expected} on every rank")))
    from .launch import fork_server

    rows.append(("fork server", True, fork_server.describe()))
    rows.append(warm_row(nproc, expected))
    return rows


def warm_row(nproc: int, expected: float) -> Row:
    """Whether a warm group (``parlab.start``) starts, answers an all-reduce, and stops cleanly."""
    import parlab
    from parlab.launch import procs

    what = f"{nproc}-rank warm group"
    start = time.perf_counter()
    try:
        with parlab.start(nproc=nproc, timeout=120) as group:
            started = time.perf_counter() - start
            group.run(_all_reduce_smoke)  # the first call pays for loading the function's modules
            cell = time.perf_counter()
            got = [value for value, _ in group.run(_all_reduce_smoke)]
            cell = time.perf_counter() - cell
            pids = group.job.job.pids()
            members = [pids[r] for r in range(nproc)] + [(group.job.agent.pid, group.job.agent_token)]
    except Exception as exc:  # noqa: BLE001 - report, don't crash
        return what, False, f"{type(exc).__name__}: {exc}"
    left = [pid for pid, token in members if procs.same_process(pid, token)]
    ok = got == [expected] * nproc and not left
    detail = f"started in {started:.1f} s, an all_reduce cell in {cell * 1000:.0f} ms"
    if got != [expected] * nproc:
        detail += f"; got {got}, expected {expected} on every rank"
    if left:
        detail += f"; pid(s) {left} still running after stop()"
    return what, ok, detail


def main() -> int:
    from .grading.harness import AUTOGRADE_ENV

    if os.environ.get(AUTOGRADE_ENV):
        # The grader runs lab 00 whole, doctor cell included, once per student: its two
        # launches would check the grading machine, not the student's, and score nothing.
        print("parlab doctor: not run while this notebook is being graded "
              "(it checks the machine you work on; no points depend on it)")
        return 0
    rows = checks()
    width = max(len(r[0]) for r in rows)
    for what, ok, detail in rows:
        print(f"{'ok ' if ok else 'BAD'}  {what:<{width}}  {detail}")
    bad = [r for r in rows if not r[1]]
    if bad:
        print(f"\nparlab doctor: {len(bad)} problem(s): {'; '.join(r[0] for r in bad)}", file=sys.stderr)
        return 1
    print("\nparlab doctor: all good")
    return 0
