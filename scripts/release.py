#!/usr/bin/env python
"""Regenerate labs/ from solutions/ with nbgrader's generate_assignment.

    python scripts/release.py            # every lab under solutions/ (make release)
    python scripts/release.py 00-setup   # just these labs

For each lab folder solutions/<lab>/ this runs what
``nbgrader generate_assignment <lab> --force`` runs, with the repository's
nbgrader_config.py, but for all labs in one process (each nbgrader command
costs ~5 s of start-up).  The student version lands in labs/<lab>/: solution
regions replaced by stubs, hidden tests and outputs removed, grade cells
locked and checksummed.  It also records the labs in gradebook.db, which
``nbgrader autograde`` needs later.

labs/ is output only: a lab folder whose source is gone is deleted, and each
lab folder is rebuilt from scratch, so it holds exactly what generation
produces (the notebook plus any data files next to it in solutions/<lab>/).
The output depends only on the source notebooks, so tests/nbgrader/test_labs_release.py
can regenerate into a temporary folder and compare.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def use_this_python_for_tools() -> None:
    """Put this interpreter's bin/ first on PATH, as activating the venv would.

    nbgrader runs the ``alembic`` command when it creates a new gradebook.db;
    without the venv on PATH that fails with "No such file or directory: 'alembic'".
    """
    bin_dir = str(Path(sys.executable).parent)
    if os.environ.get("PATH", "").split(os.pathsep)[0] != bin_dir:
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


def lab_names(root: Path = REPO) -> list[str]:
    """Lab folders under <root>/solutions that hold a notebook, sorted."""
    src = root / "solutions"
    return sorted(p.name for p in src.iterdir() if p.is_dir() and any(p.glob("*.ipynb"))) if src.is_dir() else []


def load_config(root: Path = REPO):
    """The course's nbgrader_config.py, with the course root set to ``root``."""
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    config.CourseDirectory.root = str(root)
    return config


def release(root: Path = REPO, labs: list[str] | None = None, quiet: bool = True) -> list[Path]:
    """Generate labs/<lab>/ for each lab (default: all); return the release notebooks."""
    from nbgrader.converters import GenerateAssignment
    from nbgrader.coursedir import CourseDirectory

    use_this_python_for_tools()
    root = Path(root).resolve()
    config = load_config(root)
    release_dir = root / config.CourseDirectory.release_directory
    everything = lab_names(root)
    labs = everything if labs is None else labs
    unknown = sorted(set(labs) - set(everything))
    if unknown:
        raise SystemExit(f"no such lab under solutions/: {', '.join(unknown)}")
    written = []
    for lab in labs:
        shutil.rmtree(release_dir / lab, ignore_errors=True)
        coursedir = CourseDirectory(config=config)
        coursedir.assignment_id = lab
        app = GenerateAssignment(coursedir=coursedir, config=config)
        app.force = True
        if quiet:
            app.log.setLevel(logging.WARNING)
        app.start()  # raises NbGraderException (with nbgrader's log) on failure
        written += sorted((release_dir / lab).glob("*.ipynb"))
    if release_dir.is_dir():  # labs whose source was removed
        for stale in sorted(p for p in release_dir.iterdir() if p.is_dir() and p.name not in everything):
            shutil.rmtree(stale)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("labs", nargs="*", help="lab folders under solutions/ (default: all)")
    parser.add_argument("--root", type=Path, default=REPO, help="course root (default: this repository)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    for path in release(args.root, args.labs or None, quiet=True):
        print(f"released {path.relative_to(args.root.resolve())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
