"""srun, tied to the notebook kernel: ``python -m parlab.launch.slurm_tether NAME srun ...``.

srun runs on the notebook server, its ranks on a compute node under
slurmd, so killing srun's process group would not reach them.  This small
parent of srun cancels the launch's Slurm job (``scancel --name NAME``) as
soon as the kernel is gone (restart, crash, SIGKILL) or when it gets
SIGTERM, waits for srun to end, and exits with srun's status.
"""
import ctypes
import os
import signal
import subprocess
import sys
import time

from parlab.launch.slurm import cancel

_PR_SET_PDEATHSIG = 1


def main() -> int:
    name, cmd = sys.argv[1], sys.argv[2:]
    owner = int(os.environ.get("PARLAB_TETHER_OWNER", "0")) or os.getppid()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append("SIGTERM"))
    signal.signal(signal.SIGINT, lambda *_: stop.append("SIGINT"))
    if sys.platform.startswith("linux"):
        try:  # the kernel's death arrives as SIGTERM, which the handler above turns into scancel
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != owner:
        return 1  # the kernel died before srun started: nothing was queued
    srun = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    while srun.poll() is None and not stop and os.getppid() == owner:
        time.sleep(0.2)
    if srun.poll() is None:
        cancel(name)
        try:
            srun.wait(timeout=20)
        except subprocess.TimeoutExpired:
            srun.kill()
            srun.wait()
    return srun.returncode


if __name__ == "__main__":
    sys.exit(main())
