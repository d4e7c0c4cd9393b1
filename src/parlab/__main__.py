"""Command line: ``parlab doctor``, ``parlab grade LAB`` and ``parlab preflight`` (or ``python -m parlab ...``)."""
import sys

USAGE = """usage: parlab doctor                     check torch, backends, GPUs and a 2-rank all-reduce
       parlab grade LAB [--workers N] [--resume] [--force]
                                         autograde every submission of LAB in parallel (run in the course root)
       parlab grade LAB --slurm [--partition P] [--account A] [--time-limit MIN] [--chunk K]
                                         the same, as one Slurm array job (parlab grade --help)
       parlab preflight [--url URL] [--instructor NAME] ...
                                         as root on a course hub: check the deployment (parlab preflight --help)"""


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["doctor"]:
        from .doctor import main as doctor

        return doctor()
    if argv[:1] == ["grade"]:
        from .classgrade.cli import main as grade

        return grade(argv[1:])
    if argv[:1] == ["preflight"]:
        from .preflight import main as preflight

        return preflight(argv[1:])
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
