"""Command line: ``parlab doctor`` (or ``python -m parlab doctor``)."""
import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["doctor"]:
        from .doctor import main as doctor

        return doctor()
    print("usage: parlab doctor    check torch, backends, GPUs and a 2-rank all-reduce", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
