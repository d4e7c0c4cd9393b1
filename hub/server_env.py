"""The servers' environment built from the student edition, as a deployment builds it (for make hub, tests/hub).

A deployment builds the environment the hub and every server run in from the
student edition (``make student-dist``), installed, not editable: then nothing
a student's kernel can read (``parlab.__file__``, ``site-packages``, the
hub's config) leads to the course repository and its ``solutions/``.
docs/jupyterhub.md gives the commands (conda or pip, from the student edition).

``make hub`` and the hub tier do the same without downloading anything:
``build`` clones the current environment (every package but parlab, as
hard links where the filesystem allows, its scripts pointed at the clone)
and installs the student edition into it with pip (``--no-deps``, no index).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

#: The editable install of parlab in the source environment: what the clone leaves out.
EDITABLE_PARLAB = ("__editable__.parlab-", "__editable___parlab_", "parlab-")


def _is_editable_parlab(name: str) -> bool:
    return name.startswith(EDITABLE_PARLAB) and (name.endswith((".pth", ".dist-info", ".py"))
                                                  or name.startswith("__editable__"))


def _copy_file(src: Path, dest: Path, old_prefix: str, new_prefix: str, rewrite: bool) -> None:
    """Hard-link ``src`` to ``dest``; a text file that names the old environment (scripts, activate,
    pyvenv.cfg: ``rewrite``) is copied with the new one's path instead."""
    if rewrite:
        data = src.read_bytes()
        if b"\0" not in data[:8192] and old_prefix.encode() in data:
            dest.write_bytes(data.replace(old_prefix.encode(), new_prefix.encode()))
            shutil.copymode(src, dest)
            return
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def clone_without_parlab(src_prefix: Path, dest: Path) -> None:
    """``dest``: a copy of the environment at ``src_prefix`` without parlab's editable install."""
    src_prefix, dest = Path(src_prefix).resolve(), Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    for folder, dirs, names in os.walk(src_prefix):
        here = Path(folder)
        rel = here.relative_to(src_prefix)
        target = dest / rel
        target.mkdir(parents=True, exist_ok=True)
        os.chmod(target, 0o755)
        dirs[:] = [d for d in dirs if not (here.name == "site-packages" and _is_editable_parlab(d))]
        for name in list(dirs) + names:
            path = here / name
            if not path.is_symlink():
                continue
            link = os.readlink(path)
            if link.startswith(str(src_prefix)):
                link = str(dest) + link[len(str(src_prefix)):]
            os.symlink(link, target / name)
            if name in dirs:
                dirs.remove(name)
        for name in names:
            path = here / name
            if path.is_symlink() or (here.name == "site-packages" and _is_editable_parlab(name)):
                continue
            if name.startswith("__editable___parlab") or ".parlab-installed" in name or name.startswith(".parlab-"):
                continue
            _copy_file(path, target / name, str(src_prefix), str(dest),
                       rewrite=rel.parts[:1] == ("bin",) or rel == Path(".") and name == "pyvenv.cfg")


def build(dest: Path, student_edition: Path, src_prefix: Path | None = None) -> Path:
    """The servers' environment at ``dest``: this environment's packages and the student edition's parlab.

    Returns the environment's Python.  Every folder of it is readable by every user.
    """
    clone_without_parlab(Path(src_prefix or sys.prefix), dest)
    python = Path(dest) / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                    "--no-build-isolation", "--no-index", str(student_edition)],
                   check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd="/")
    return python
