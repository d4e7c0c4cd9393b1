"""JupyterHub for the parlab course on one shared GPU box (a DGX), as tests/hub runs it.

    jupyterhub -f hub/jupyterhub_config.py        # as root, from the repository's environment

- Real Unix users, logging in with their own password (PAM).  In production
  use the institution's single sign-on instead (an OAuthenticator or LTI
  authenticator); everything else here stays the same, as long as each login
  maps to a Unix user of the box.
- Each server is a local process of that user (``course_spawner.CourseSpawner``):
  in this Python environment (so the labs' ``python3`` kernel is parlab's), in
  cgroups the kernel enforces: its own CPU set, a memory limit, a process limit
  and (cgroup v1) no GPU device.  On a host with systemd,
  ``PARLAB_HUB_SPAWNER=systemd`` makes each server a systemd unit with the same
  limits instead (``systemd_units.py``).
- This file and the kit beside it are the student edition's ``hub/``
  (``make student-dist``), copied to a system folder such as ``/etc/parlab-hub``;
  the environment is the student edition installed (not editable): nothing a
  student's server can read leads to the course repository.  A
  ``local_config.py`` beside this file, when there is one, is read last: the
  site's own settings, kept out of the kit's files.
- jupyterhub-idle-culler stops servers idle for ``PARLAB_HUB_CULL_TIMEOUT``
  seconds (default 3600).
- Servers survive a hub restart (``cleanup_servers = False``): restarting the
  hub for a config change mid-lab does not kill the class's kernels.

Settings come from the environment so that ``hub/demo.py`` (``make hub``) and
tests/hub can start the same file on a free port with their own users:

| variable | default | what |
|---|---|---|
| PARLAB_HUB_STATE | /srv/parlab-hub | the hub's database, cookie secret, pid files and logs |
| PARLAB_HUB_PORT | 8000 | the proxy's port, on PARLAB_HUB_IP |
| PARLAB_HUB_IP | 127.0.0.1 | where the proxy listens (put TLS in front before opening it) |
| PARLAB_HUB_API_PORT, PARLAB_HUB_PROXY_API_PORT | 8081, 8001 | the hub's and the proxy's APIs, on 127.0.0.1 |
| PARLAB_HUB_INSTRUCTORS | (none) | comma-separated Unix users who get the instructor's nbgrader set-up |
| PARLAB_HUB_STUDENTS | (none) | comma-separated Unix users allowed to log in as students |
| PARLAB_EXCHANGE | /srv/nbgrader/exchange | nbgrader's exchange (hub/exchange_config.py) |
| PARLAB_HUB_CPUS_PER_SERVER | cores ÷ class size | cores in each server's CPU set (at least 1; 0, all cores, is refused for a class of more than one) |
| PARLAB_HUB_CLASS_SIZE | the users above | servers that run at once, when logins are not listed above (single sign-on) |
| PARLAB_HUB_MEM_LIMIT | 4G | each server's memory limit (its cgroup); "none" for no limit, which preflight flags |
| PARLAB_HUB_TASKS_MAX | 2048 | processes and threads of one server with its kernels and launches |
| PARLAB_HUB_SPAWNER | course | "course" (CourseSpawner, cgroups of its own) or "systemd" (SystemdSpawner units) |
| PARLAB_HUB_INSTRUCTOR_ACCESS | (off) | 1: instructors may open, start and stop students' servers (the access:servers role) |
| PARLAB_HUB_CULL_TIMEOUT | 3600 | seconds idle before the culler stops a server |
| PARLAB_HUB_ADMIN_TOKEN | (none) | a token for the course-admin service (tests, benchmarks, make hub-stop) |
"""
import os
import sys
from pathlib import Path

c = get_config()  # noqa: F821 - provided by traitlets

HUB_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(HUB_DIR))
from course_spawner import CourseSpawner, class_cpu_block  # noqa: E402


def _users(var: str) -> set[str]:
    return {u.strip() for u in os.environ.get(var, "").split(",") if u.strip()}


state = Path(os.environ.get("PARLAB_HUB_STATE", "/srv/parlab-hub"))
state.mkdir(parents=True, exist_ok=True, mode=0o700)
instructors, students = _users("PARLAB_HUB_INSTRUCTORS"), _users("PARLAB_HUB_STUDENTS")

# ---------------------------------------------------------------- network and state
c.JupyterHub.ip = os.environ.get("PARLAB_HUB_IP", "127.0.0.1")
c.JupyterHub.port = int(os.environ.get("PARLAB_HUB_PORT", "8000"))
c.JupyterHub.hub_ip = "127.0.0.1"
# The hub's own API and the proxy's API, both on 127.0.0.1 (two hubs on one box need other ports).
c.JupyterHub.hub_port = int(os.environ.get("PARLAB_HUB_API_PORT", "8081"))
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{os.environ.get('PARLAB_HUB_PROXY_API_PORT', '8001')}"
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(state / "jupyterhub.pid")
c.ConfigurableHTTPProxy.pid_file = str(state / "proxy.pid")
c.JupyterHub.cleanup_servers = False

# ---------------------------------------------------------------- who may log in
c.JupyterHub.authenticator_class = "pam"
c.Authenticator.allowed_users = instructors | students
# No hub admins by default: an admin could open every student's server.
c.Authenticator.admin_users = set()

# ---------------------------------------------------------------- servers
if os.environ.get("PARLAB_HUB_SPAWNER", "course") == "systemd":
    from systemd_units import course_systemd_spawner
    spawner = course_systemd_spawner()
else:
    spawner = CourseSpawner
c.JupyterHub.spawner_class = spawner
spawner_config = c[spawner.__name__]
spawner_config.instructors = sorted(instructors)
# Each server its own block of cores: the cores divided by the class unless set (0 with a class is refused).
class_size = max(len(instructors | students), int(os.environ.get("PARLAB_HUB_CLASS_SIZE", "0")))
spawner_config.cpus_per_server = class_cpu_block(len(os.sched_getaffinity(0)), class_size,
                                                 os.environ.get("PARLAB_HUB_CPUS_PER_SERVER"))
spawner_config.tasks_max = int(os.environ.get("PARLAB_HUB_TASKS_MAX", "2048"))
mem_limit = os.environ.get("PARLAB_HUB_MEM_LIMIT", "4G")
if mem_limit.lower() not in ("none", "0", ""):
    c.Spawner.mem_limit = mem_limit
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
c.Spawner.environment = {"PARLAB_EXCHANGE": os.environ.get("PARLAB_EXCHANGE", "/srv/nbgrader/exchange")}
# A server on 2 busy cores (or a DGX where 30 start at once) needs more than the default 60 s.
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 120

# ---------------------------------------------------------------- services
cull_timeout = int(os.environ.get("PARLAB_HUB_CULL_TIMEOUT", "3600"))
# 3600 s: a student who reads the notebook or listens to the lecture for most of
# a 90-minute block without running a cell keeps the server; a server left open
# after class gives its memory back within the hour.  The culler counts activity
# of the server (kernels running, the page open), so a running launch is not idle.
# Culling in the middle of a launch is safe: CourseSpawner.stop ends what is left.
# The hub stops a managed service with SIGINT and waits 30 s before SIGTERM.  A hub started from a
# shell's background job (``nohup ... &``) passes SIGINT on ignored, and Python then leaves it ignored:
# the culler would hold every hub shutdown for those 30 s.  So it restores Python's handler first.
CULLER_COMMAND = [sys.executable, "-c", "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
                  "from jupyterhub_idle_culler import main; main()",
                  f"--timeout={cull_timeout}", "--cull-every=60"]
c.JupyterHub.services = [{"name": "idle-culler", "command": CULLER_COMMAND}]
c.JupyterHub.load_roles = [
    {"name": "idle-culler", "services": ["idle-culler"],
     "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]},
]
if os.environ.get("PARLAB_HUB_ADMIN_TOKEN"):
    c.JupyterHub.services.append({"name": "course-admin",
                                  "api_token": os.environ["PARLAB_HUB_ADMIN_TOKEN"]})
    c.JupyterHub.load_roles.append(
        {"name": "course-admin", "services": ["course-admin"],
         "scopes": ["admin:users", "admin:servers", "tokens", "access:servers", "list:users",
                    "read:services"]})
if os.environ.get("PARLAB_HUB_INSTRUCTOR_ACCESS") == "1" and instructors:
    # an instructor opens a stuck student's server (its page, terminals, files: as that student)
    c.JupyterHub.load_roles.append({"name": "course-instructors", "users": sorted(instructors),
                                    "scopes": ["list:users", "read:users", "servers", "access:servers"]})

# ---------------------------------------------------------------- the site's own settings, last
local_config = HUB_DIR / "local_config.py"
if local_config.is_file():
    load_subconfig(str(local_config))  # noqa: F821 - provided by traitlets
