"""Build what students get: a student repository cut from this one (``make student-dist``).

    python scripts/student_dist.py [OUT]      # default OUT: dist/student (git-ignored)

OUT becomes a git repository with one commit holding the package
(``src/parlab``), the released labs (``labs/``, generated from
``solutions/`` by nbgrader), the install files (``Makefile``,
``pyproject.toml``, ``constraints/``, ``environment.yml``), the course's
``nbgrader_config.py`` (so that Validate at the root uses the course's cell
timeout), the student-facing docs, and the hub kit (``hub/``: what a course
hub's admin installs, docs/jupyterhub.md; it holds no answer).  Nothing
else: no ``solutions/``, no ``tests/`` (whose ``wrong_answers/`` hold
answers), no benchmarks, slides or instructor docs.  The README is this repository's, without the
sections and lines that are about those.

Why a repository and not a wheel plus ``labs/``: the README's self-study
path (``make lab``: a venv, the pinned CPU torch, JupyterLab on ``labs/``)
runs from it unchanged; a hub's admin installs the same tree into the
servers' environment, not editable (``environment.yml`` or ``pip install .``),
and copies its ``hub/`` to the hub's config folder (``/etc/parlab-hub``), so
that no server can read the course repository; and the next lab released is
one more commit that students pull.

Every path copied is listed in ``INCLUDE``; tests/nbgrader/test_student_dist.py
builds the repository and searches it for solution text.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "dist", "student")
#: What students get, relative to the repository root (folders copied whole, minus caches).
INCLUDE = ("Makefile", "pyproject.toml", "environment.yml", "nbgrader_config.py", "constraints", "src", "labs",
           "docs/launcher.md", "docs/accuracy.md", "docs/planner.md", "hub")
#: README sections that are the instructor's or the developers' (their "## " headings).
README_DROPS = ("What is in the box", "Tests", "Measured")
#: Sentences of the README about what the distribution leaves out; each must match once, so that a
#: README rewritten without updating these fails the build instead of shipping a dangling sentence.
README_CUTS = (r"^make test [^\n]*\n",
               r" `tests/wrong_answers/` keeps, per lab, .*? every\s+correct\s+one\s+passes\.",
               r" Instructors: see `docs/instructor\.md`;\s+`make release` regenerates `labs/` from `solutions/` "
               r"with nbgrader\.",
               # any line breaks: the README is rewrapped when its sentences change
               r" \(Run\s+as\s+root\s+for\s+the\s+full\s+boundary;\s+what\s+differs\s+otherwise,\s+and\s+what\s+it\s+"
               r"costs,\s+is\s+in\s+`docs/instructor\.md`\.\)")
CACHES = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".ipynb_checkpoints")
HEADER = ("> This is the student edition of parlab, built from the course repository by "
          "`make student-dist`: the helper package and the released labs, without solutions or tests.\n\n")


def student_readme(text: str) -> str:
    """The README without the sections in README_DROPS and the sentences in README_CUTS."""
    kept, dropping = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith("## "):
            dropping = line[3:].strip() in README_DROPS
        if not dropping:
            kept.append(line)
    text = "".join(kept)
    for cut in README_CUTS:
        text, found = re.subn(cut, "", text, flags=re.M | re.S)
        if found != 1:
            raise SystemExit(f"student_dist: README.md no longer has the text {cut!r} (found {found} times); "
                             "update README_CUTS in scripts/student_dist.py to what the README says now")
    title, _, rest = text.partition("\n")
    return f"{title}\n\n{HEADER}{rest.lstrip()}"


def build(out: str = DEFAULT_OUT) -> str:
    """Write the student repository into ``out`` (replacing it) and commit it; returns ``out``."""
    out = os.path.abspath(out)
    if out == ROOT or ROOT.startswith(out + os.sep):
        raise SystemExit(f"student_dist: {out} holds this repository; choose another folder")
    if os.path.exists(out):
        shutil.rmtree(out)
    for path in INCLUDE:
        src, dst = os.path.join(ROOT, path), os.path.join(out, path)
        if not os.path.exists(src):
            raise SystemExit(f"student_dist: {path} is missing from {ROOT}; run `make release` if it is labs/")
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.isdir(src):
            shutil.copytree(src, dst, ignore=CACHES)
        else:
            shutil.copy2(src, dst)
    with open(os.path.join(ROOT, "README.md")) as f, open(os.path.join(out, "README.md"), "w") as g:
        g.write(student_readme(f.read()))
    with open(os.path.join(out, ".gitignore"), "w") as f:
        f.write(".venv/\n__pycache__/\n*.egg-info/\n.ipynb_checkpoints/\n")
    git = ["git", "-C", out, "-c", "user.name=parlab", "-c", "user.email=parlab@localhost",
           "-c", "commit.gpgsign=false"]
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "parlab student edition"]):
        subprocess.run(git + args, check=True, stdout=subprocess.DEVNULL)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", default=DEFAULT_OUT, help="folder to write (replaced); default dist/student")
    out = build(p.parse_args(argv).out)
    print(f"student_dist: the student repository is in {out} (git, branch main); "
          f"students run `make lab` there")
    return 0


if __name__ == "__main__":
    sys.exit(main())
