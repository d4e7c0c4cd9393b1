"""``parlab grade LAB``: the command line of both schedulers (local workers, or a Slurm array with ``--slurm``)."""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from . import inputs, plan
from .array_slurm import ArrayError

SLURM_ONLY = ("partition", "account", "time_limit", "cpus_per_task", "chunk", "mem_per_task", "throttle",
              "reservation", "qos")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="parlab grade", description="Autograde every submission of a lab: "
                                "N workers here, or a Slurm array job (--slurm); one writer; resumable.")
    p.add_argument("lab", help="the assignment, e.g. 00-setup")
    p.add_argument("--workers", type=int, default=None,
                   help="submissions graded at once here (default: cores // the lab's widest launch)")
    p.add_argument("--resume", action="store_true",
                   help="merge what a stopped run graded but did not merge, instead of regrading it")
    p.add_argument("--force", action="store_true", help="regrade every submission")
    p.add_argument("--student", action="append", default=None, metavar="NAME",
                   help="grade only this student's submission, again even if unchanged since its grade (a fix "
                   "to the lab, an extension's late hand-in); the rest of the class is left as it is; repeatable")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds one submission may take; past it, it is stopped and listed as failed to grade "
                   "(default: the course's Execute.timeout for each code cell of the lab's notebooks and twice "
                   f"that for each test cell, plus {plan.TIMEOUT_MARGIN} s: 8700 s for lab 00 with the course's "
                   "300 s; 0: no limit)")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="course root (default: here)")
    s = p.add_argument_group("Slurm array mode")
    s.add_argument("--slurm", action="store_true", help="grade as one sbatch --array job (the course folder "
                   "must be on a filesystem the compute nodes share)")
    s.add_argument("--partition", default=None, help="default: PARLAB_SLURM_PARTITION, else Slurm's default")
    s.add_argument("--account", default=None, help="default: PARLAB_SLURM_ACCOUNT")
    s.add_argument("--time-limit", type=float, default=None, help="minutes per array task (default: the partition's)")
    s.add_argument("--cpus-per-task", type=int, default=None,
                   help="CPUs per array task (default: the lab's widest launch, at most a node's CPUs)")
    s.add_argument("--chunk", type=int, default=None, help="submissions per array task (default 1)")
    s.add_argument("--mem-per-task", default=None, help="memory per array task, e.g. 4G or 2048 (MB) "
                   "(default: 1G per rank of the lab's widest launch, plus 1G)")
    s.add_argument("--throttle", type=int, default=None,
                   help="at most this many array tasks at once (sbatch --array=...%%N; default: no limit)")
    s.add_argument("--reservation", default=None, help="a Slurm reservation for the grading (sbatch --reservation)")
    s.add_argument("--qos", default=None, help="a Slurm quality of service for the grading (sbatch --qos)")
    return p


def main(argv: list[str]) -> int:
    p = parser()
    args = p.parse_args(argv)
    for name in ("workers", "cpus_per_task", "chunk", "throttle"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.timeout is not None and not args.timeout >= 0:
        p.error("--timeout must be a number of seconds (0: no limit)")
    if args.time_limit is not None and not args.time_limit > 0:
        p.error("--time-limit must be a positive number of minutes")
    if not args.slurm and (given := [f"--{k.replace('_', '-')}" for k in SLURM_ONLY if getattr(args, k) is not None]):
        p.error(f"{', '.join(given)} ask(s) Slurm for resources: add --slurm")
    if args.slurm and args.workers is not None:
        p.error("--workers is for grading on this machine; with --slurm each array task grades --chunk "
                "submissions, as many at once as Slurm runs tasks")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the workers (or the array) are ended too
    try:
        if args.slurm:
            from .array import grade_class_on_slurm

            progress = grade_class_on_slurm(args.root, args.lab, args.partition, args.account, args.time_limit,
                                            args.cpus_per_task, args.chunk or 1, args.resume, args.force,
                                            args.timeout, mem=args.mem_per_task, throttle=args.throttle,
                                            reservation=args.reservation, qos=args.qos, students=args.student)
        else:
            from .run import grade_class

            progress = grade_class(args.root, args.lab, args.workers, args.resume, args.force, args.timeout,
                                   students=args.student)
    except inputs.CourseError as exc:
        print(f"parlab grade: {exc}", file=sys.stderr)
        return 2
    except ArrayError as exc:
        print(f"parlab grade --slurm: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nparlab grade: stopped; run it again (with --resume) to go on", file=sys.stderr)
        return 130
    print(progress.summary(), flush=True)
    return 1 if progress.failed else 0
