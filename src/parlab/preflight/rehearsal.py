"""``make rehearsal``: the day before term on the DGX, the three proofs of a deployment in one report.

Run by ``make rehearsal`` as root, in the course's checkout, with the course's hub running::

    make rehearsal PREFLIGHT_ARGS="--url http://127.0.0.1:8000 --instructor teacher --checkout $PWD"

One step after the other, each one's output shown as it comes and kept:

1. ``gpu-tier``: the GPU test tier (``make test-gpu``: NCCL launches, tiny models on CUDA, the labs'
   checks on GPUs);
2. ``preflight``: ``parlab preflight`` of the deployed environment against the running hub
   (docs/jupyterhub.md, "Proving a deployment"), its NCCL launches through the queue included;
3. ``load``: 30 students at once on a hub of the kit's own beside the course's
   (``benchmarks/hub_load.py --students 30``: each starts a server and a kernel, then all launch
   together; one server's memory by kind of process; nothing lost, nothing left).

Then one report file (``--report``): a line per step, ``ok`` or ``FAIL`` with what it saw, the
host (GPUs, driver, cores, memory), the checkout's commit, then each step's whole output.  Exit
status 0 when every step is ok.  A step is ok when: the GPU tier exits 0 with at least one test
passed (every test skipped means no GPU was seen: FAIL); preflight exits 0 (no FAIL line); the
load exits 0 with every student's result right.  ``verdict`` holds these rules
(tests/unit/test_rehearsal.py).
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

STEPS = ("gpu-tier", "preflight", "load")


@dataclass
class Step:
    name: str
    command: list[str]
    rc: int | None = None
    output: str = ""
    seconds: float = 0.0


def run(step: Step, cwd: Path) -> Step:
    """Run ``step.command``, its output shown line by line and kept."""
    start, lines = time.monotonic(), []
    print(f"==== {step.name}: {shlex.join(step.command)}", flush=True)
    try:
        proc = subprocess.Popen(step.command, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace")
    except OSError as e:
        step.rc, step.output = 127, f"could not start {step.command[0]}: {e}\n"
        print(step.output, end="", flush=True)
        return step
    for line in proc.stdout:
        print(line, end="", flush=True)
        lines.append(line)
    step.rc, step.output, step.seconds = proc.wait(), "".join(lines), time.monotonic() - start
    return step


def _last(pattern: str, text: str) -> re.Match | None:
    found = list(re.finditer(pattern, text, re.M))
    return found[-1] if found else None


def verdict(step: Step, students: int) -> tuple[str, str]:
    """(ok or FAIL, what the step showed), by the rules of the module's docstring."""
    out, rc = step.output, step.rc
    if step.name == "gpu-tier":
        summary = _last(r"^=+ (.+?) in [\d.]+s", out)
        said = summary.group(1) if summary else f"no pytest summary (exit {rc})"
        passed = re.search(r"(\d+) passed", said)
        if rc == 0 and passed and int(passed.group(1)) > 0:
            return "ok", said
        if rc in (0, 5) and not passed:
            return "FAIL", f"nothing ran on a GPU ({said}): see the skip reasons (pytest -rs) in the output"
        return "FAIL", said
    if step.name == "preflight":
        said = _last(r"^--\s+preflight\s+(.+)$", out)
        text = said.group(1).strip() if said else f"no verdict line (exit {rc})"
        return ("ok" if rc == 0 and said else "FAIL"), text
    if step.name == "load":
        refused = _last(r"^refused: (.+)$", out)
        if refused:
            return "FAIL", refused.group(0)
        right = _last(r"(\d+) of (\d+) results right", out)
        if not right:
            return "FAIL", f"no result line (exit {rc})"
        text = right.group(0) + (f" (exit {rc})" if rc else "")
        got, of = int(right.group(1)), int(right.group(2))
        return ("ok" if rc == 0 and got == of == students else "FAIL"), text
    raise ValueError(f"unknown step {step.name!r}")


def host_lines() -> list[str]:
    def ask(argv: list[str]) -> str:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            return done.stdout.strip() or done.stderr.strip() or f"exit {done.returncode}"
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"not available ({e})"
    gpus = ask(["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total", "--format=csv,noheader"])
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    changed = [line for line in ask(["git", "status", "--short"]).splitlines() if line.strip()]
    return [f"host {socket.gethostname()}: {len(os.sched_getaffinity(0))} usable cores, {memory:.0f} GiB memory",
            *(f"gpu {line}" for line in gpus.splitlines()),
            f"checkout {ask(['git', 'rev-parse', 'HEAD'])}, {len(changed)} files changed since (git status)"]


def report_text(steps: list[Step], students: int, when: str, host: list[str]) -> tuple[str, list[str]]:
    """(the report, the steps that failed)."""
    head, failed = [f"parlab rehearsal {when}", *host, ""], []
    for step in steps:
        status, text = verdict(step, students)
        if status == "FAIL":
            failed.append(step.name)
        head.append(f"{status:<4} {step.name:<10} {text} ({step.seconds:.0f} s)")
    head.append(f"--   rehearsal  {f'{len(failed)} FAILED: ' + ', '.join(failed) if failed else 'all ok'}")
    body = [f"\n==== {s.name}: {shlex.join(s.command)} (exit {s.rc}, {s.seconds:.0f} s)\n{s.output}" for s in steps]
    return "\n".join(head) + "\n" + "".join(body), failed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m parlab.preflight.rehearsal", description=__doc__.splitlines()[0])
    p.add_argument("--report", type=Path, required=True, help="the report file to write (keep it)")
    p.add_argument("--students", type=int, default=30, help="students at once in the load step (default 30)")
    p.add_argument("--gpu-tier", default="make test-gpu", help="the GPU tier's command (default: make test-gpu)")
    p.add_argument("--preflight", default="/opt/conda/envs/parlab/bin/parlab preflight",
                   help="parlab preflight of the deployed environment, with its options")
    p.add_argument("--load", default=f"{sys.executable} benchmarks/hub_load.py",
                   help="the load benchmark (--students is added)")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("make rehearsal: run it as root on the course's host (preflight and the load make Unix users)",
              file=sys.stderr)
        return 2
    when = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    steps = [Step("gpu-tier", shlex.split(args.gpu_tier)), Step("preflight", shlex.split(args.preflight)),
             Step("load", [*shlex.split(args.load), "--students", str(args.students)])]
    cwd = Path.cwd()
    for step in steps:
        run(step, cwd)
    text, failed = report_text(steps, args.students, when, host_lines())
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(text)
    print("\n" + text.split("\n\n====", 1)[0])
    print(f"make rehearsal: report in {args.report}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
