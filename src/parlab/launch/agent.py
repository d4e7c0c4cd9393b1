"""torchrun, tied to the notebook kernel that started it.

``python -m parlab.launch.agent <torchrun args>`` is plain torchrun plus one thing:
it dies as soon as the kernel does (restart, crash, SIGKILL), and its workers,
which are tied to it the same way, follow within a fraction of a second.
"""
import os
import sys

from parlab.launch.procs import die_with_parent


def main() -> None:
    kernel = int(os.environ.get("PARLAB_KERNEL_PID", "0")) or None
    die_with_parent(kernel)
    os.environ["PARLAB_AGENT_PID"] = str(os.getpid())  # the workers' expected parent
    from torch.distributed.run import main as torchrun_main

    torchrun_main(sys.argv[1:])


if __name__ == "__main__":
    main()
