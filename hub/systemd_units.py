"""The course's servers as systemd units: SystemdSpawner with the limits CourseSpawner applies itself.

On a host with systemd (a DGX on DGX OS, TLJH, any recent Ubuntu) this is the production spawner:

    PARLAB_HUB_SPAWNER=systemd jupyterhub -f /etc/parlab-hub/jupyterhub_config.py

``jupyterhub_config.py`` then sets ``c.JupyterHub.spawner_class`` to ``course_systemd_spawner()``:
jupyterhub-systemdspawner's ``SystemdSpawner`` (``pip install jupyterhub-systemdspawner``) whose
transient unit gets, per user, the properties of ``unit_properties``:

- ``AllowedCPUs``: the user's block of cores (the same block ``CourseSpawner`` gives:
  ``course_spawner.cpu_block`` of the user's id); a process in the unit cannot leave it;
- ``MemoryMax`` (with ``MemoryAccounting``): the memory limit (``PARLAB_HUB_MEM_LIMIT``);
- ``TasksMax``: processes and threads of the server, its kernels and launches;
- ``DevicePolicy=closed`` with the pseudo-terminals allowed: no ``/dev/nvidia*`` can be opened
  (systemd.resource-control(5): ``closed`` allows only the standard pseudo devices, and
  ``DeviceAllow=`` adds to them; a terminal needs ``/dev/ptmx`` and the ``pts`` devices);
- the server's command, ``jupyterhub-singleuser`` of the parlab environment, its environment
  (``CUDA_VISIBLE_DEVICES=``, ``JUPYTER_CONFIG_PATH`` of the role) as ``CourseSpawner`` sets them.

systemd is not on the machine the kit is tested on: tests/unit/test_hub_cgroups.py checks the
properties asked for; that systemd enforces them is what ``parlab preflight`` checks on the host.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

HUB_DIR = Path(__file__).resolve().parent
if str(HUB_DIR) not in sys.path:
    sys.path.insert(0, str(HUB_DIR))
from course_spawner import cpu_block, cpu_list  # noqa: E402

#: What a Jupyter terminal needs besides DevicePolicy=closed's null, zero, full, random, urandom.
TERMINAL_DEVICES = ["/dev/ptmx rw", "char-pts rw"]


def unit_properties(cpus: list[int], mem_bytes: int | None, tasks_max: int) -> dict:
    """The systemd properties of one server's unit (``systemd-run --property=K=V``; a list repeats K)."""
    props = {
        "AllowedCPUs": cpu_list(cpus),
        "TasksMax": str(tasks_max),
        "DevicePolicy": "closed",
        "DeviceAllow": list(TERMINAL_DEVICES),
        "MemoryAccounting": "yes",
    }
    if mem_bytes:
        props["MemoryMax"] = str(mem_bytes)
    return props


class ParlabUnits:
    """What the course adds to SystemdSpawner (mixed in first; ``self`` is the spawner)."""

    def parlab_unit_properties(self, site: dict) -> dict:
        """The course's properties for this user, then the site's own (``unit_extra_properties``) over them."""
        cpus = cpu_block(self.user.id, self.cpus_per_server, sorted(os.sched_getaffinity(0)))
        mem = int(self.mem_limit) if self.mem_limit else None
        return {**unit_properties(cpus, mem, self.tasks_max), **site}

    def parlab_env(self) -> dict:
        role = "instructor" if self.user.name in self.instructors else "student"
        return {"CUDA_VISIBLE_DEVICES": "", "JUPYTER_CONFIG_PATH": str(HUB_DIR / role), "PARLAB_HUB_ROLE": role,
                "PATH": str(Path(self.environment_prefix) / "bin") + os.pathsep + "/usr/local/bin:/usr/bin:/bin"}


def course_systemd_spawner(base=None):
    """``base`` (default: SystemdSpawner; TLJH: its UserCreatingSpawner) with the course's units.

    Imports jupyterhub-systemdspawner only here.
    """
    from traitlets import Int, List, Unicode

    if base is None:
        from systemdspawner import SystemdSpawner as base

    class CourseSystemdSpawner(ParlabUnits, base):
        cpus_per_server = Int(0, config=True, help="cores in each server's AllowedCPUs (0: all)")
        tasks_max = Int(2048, config=True, help="TasksMax of each server's unit")
        instructors = List(Unicode(), config=True, help="users whose server gets the instructor's config")
        environment_prefix = Unicode(sys.prefix, config=True,
                                     help="the parlab environment the servers run (TLJH: /opt/tljh/user)")

        def get_env(self):
            env = super().get_env()
            env.update(self.parlab_env())
            return env

        async def start(self):
            self.cmd = [str(Path(self.environment_prefix) / "bin" / "jupyterhub-singleuser")]
            if not hasattr(self, "_site_properties"):  # as configured, before the first start adds the course's
                self._site_properties = dict(self.unit_extra_properties)
            # SystemdSpawner adds these last, over its own (its mem_limit's MemoryLimit=/MemoryMax=, for one)
            self.unit_extra_properties = self.parlab_unit_properties(self._site_properties)
            return await super().start()

    return CourseSystemdSpawner
