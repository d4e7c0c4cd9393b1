"""Start and stop the course hub of ``jupyterhub_config.py`` with its Unix users, and nothing left after.

``make hub`` (``hub/demo.py``) and tests/hub both use this:

    hub = CourseHub(state_dir, instructors=["plh-teacher"], students=["plh-ada", "plh-bo"])
    hub.deploy()              # the student edition, the servers' environment built from it, the hub's
                              # config folder (<state>/etc/parlab-hub): nothing of the repository
    hub.create_users()        # real Unix users (root only), private homes, printed passwords
    hub.prepare_course()      # the exchange (1777, its course folder the instructor's) and ~/parlab
    hub.start()               # jupyterhub + configurable-http-proxy on 127.0.0.1:<free port>
    ...
    hub.stop()                # servers stopped through the REST API, the hub by pid, then
    hub.remove_users()        # leftovers of those users ended by pid, the users deleted

Users are made only when absent, and only users this object (or an earlier
``make hub``) made are deleted: their names are kept in ``<state>/users-made``.
"""
from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

HUB_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(HUB_DIR))
from course_spawner import ServerCgroups, kill_pids  # noqa: E402

REPO = HUB_DIR.parent
CONFIG = HUB_DIR / "jupyterhub_config.py"
#: What the instructor's course folder holds: the course config and the notebooks.
COURSE_FILES = ("nbgrader_config.py", "solutions", "labs")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pids_of_uid(uid: int) -> list[int]:
    """Live processes whose real uid is ``uid`` (Linux /proc).

    Zombies do not count: they have ended and hold nothing but their pid,
    waiting for their parent (here often pid 1, which may reap them late).
    """
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if int(fields.get("Uid", "-1").split()[0]) == uid and not fields.get("State", "").strip().startswith("Z"):
            found.append(int(name))
    return found


def hub_api(url: str, token: str, method: str, path: str, body: dict | None = None, timeout: float = 30):
    """One call of the REST API of the hub at ``url`` (``/hub/api<path>``); its JSON answer, or None."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{url}/hub/api{path}", data=data, method=method,
                                 headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        text = resp.read().decode()
        return json.loads(text) if text.strip() else None


class HubError(RuntimeError):
    """The hub could not be started or stopped; the message says what to do."""


class CourseHub:
    def __init__(self, state: Path, instructors: list[str], students: list[str],
                 port: int | None = None, mem_limit: str | None = "4G", cpus_per_server: int | None = None,
                 cull_timeout: int = 3600, course_source: Path = REPO):
        self.state = Path(state)
        self.instructors, self.students = list(instructors), list(students)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_port, self.proxy_api_port = free_port(), free_port()
        self.exchange = self.state / "exchange"
        self.mem_limit, self.cpus_per_server, self.cull_timeout = mem_limit, cpus_per_server, cull_timeout
        self.token_file = self.state / "admin-token"
        self.made_file = self.state / "users-made"
        self.passwords: dict[str, str] = {}
        self.proc: subprocess.Popen | None = None
        self.course_source = Path(course_source)  # the full checkout: solutions/ for the instructor's course
        # where the hub and the servers run from: this environment and this hub/ until deploy()
        self.python, self.hub_dir = Path(sys.executable), HUB_DIR
        self.extra_env: dict[str, str] = {}  # more PARLAB_HUB_* settings for the hub (tests, preflight)
        deployed = self.state / "deployed.json"
        if deployed.exists():
            found = json.loads(deployed.read_text())
            self.python, self.hub_dir = Path(found["python"]), Path(found["hub_dir"])

    @property
    def users(self) -> list[str]:
        return self.instructors + self.students

    # ---------------------------------------------------------------- users

    def _made(self) -> list[str]:
        try:
            return json.loads(self.made_file.read_text())
        except (OSError, ValueError):
            return []

    def create_users(self) -> dict[str, str]:
        """Each user with a private home (0700) and a new random password; returns {user: password}."""
        if os.getuid() != 0:
            raise HubError("making the course's Unix users needs root (useradd, chpasswd); "
                           "run as root, e.g. sudo make hub")
        self.state.mkdir(parents=True, exist_ok=True, mode=0o700)
        made = self._made()
        for user in self.users:
            try:
                pwd.getpwnam(user)
                if user not in made:
                    raise HubError(f"user {user} already exists and was not made by this kit; "
                                   "pick other names or remove that user yourself")
            except KeyError:
                subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", user], check=True)
                made.append(user)
                self.made_file.write_text(json.dumps(made))
            os.chmod(pwd.getpwnam(user).pw_dir, 0o700)  # Debian's useradd makes homes 0755
            self.passwords[user] = secrets.token_urlsafe(9)
        subprocess.run(["chpasswd"], input="".join(f"{u}:{p}\n" for u, p in self.passwords.items()),
                       text=True, check=True)
        return dict(self.passwords)

    def remove_users(self) -> None:
        """End every process of the users this kit made (by pid), then delete them and their homes."""
        made = self._made()
        for user in made:
            try:
                uid = pwd.getpwnam(user).pw_uid
            except KeyError:
                continue
            for _ in range(3):
                pids = pids_of_uid(uid)
                if not pids:
                    break
                kill_pids(pids)
                time.sleep(0.2)
            ServerCgroups(user).remove()  # its server's cgroups, when a stop did not get to them
            subprocess.run(["userdel", "--remove", user], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        self.made_file.unlink(missing_ok=True)

    def run_as(self, user: str, argv: list[str], cwd: str | None = None, timeout: float = 600,
               check: bool = True) -> subprocess.CompletedProcess:
        """Run ``argv`` as ``user`` (uid, gid, groups, HOME), with the server's environment."""
        entry = pwd.getpwnam(user)
        env = self.server_env(user)

        def become():
            os.setgid(entry.pw_gid)
            os.setgroups(os.getgrouplist(user, entry.pw_gid))
            os.setuid(entry.pw_uid)
        proc = subprocess.run(argv, cwd=cwd or entry.pw_dir, env=env, preexec_fn=become,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise HubError(f"{' '.join(argv)} as {user} exited {proc.returncode}:\n{proc.stdout[-3000:]}")
        return proc

    def server_env(self, user: str) -> dict:
        """The environment a server of ``user`` gets from CourseSpawner (for commands run as them)."""
        entry = pwd.getpwnam(user)
        role = "instructor" if user in self.instructors else "student"
        return {
            "HOME": entry.pw_dir, "USER": user, "LOGNAME": user, "SHELL": "/bin/bash",
            "PATH": str(self.python.parent) + os.pathsep + "/usr/local/bin:/usr/bin:/bin",
            "CUDA_VISIBLE_DEVICES": "", "JUPYTER_CONFIG_PATH": str(self.hub_dir / role),
            "PARLAB_EXCHANGE": str(self.exchange), "OMP_NUM_THREADS": "1", "LANG": "C.UTF-8",
        }

    @staticmethod
    def environment_blockers(python: Path | None = None) -> list[str]:
        """Folders on the way to the servers' Python (default: this one) that other users cannot enter."""
        python = Path(python or sys.executable)
        blocked = []
        for exe in (python, python.resolve()):
            for folder in reversed(exe.parents):
                mode = folder.stat().st_mode
                if not mode & 0o001 and str(folder) not in blocked:
                    blocked.append(str(folder))
        return blocked

    def check_environment(self) -> None:
        blocked = self.environment_blockers(self.python)
        if blocked:
            raise HubError(
                f"the students' servers run this Python environment ({self.python}, really "
                f"{self.python.resolve()}), but other users cannot enter {', '.join(blocked)}. "
                "Build the environment where every user can read it (e.g. /opt/conda/envs/parlab, "
                f"docs/jupyterhub.md), or let them through: chmod o+x {' '.join(blocked)}")

    # ---------------------------------------------------------------- course

    def course_dir(self, instructor: str | None = None) -> Path:
        return Path(pwd.getpwnam(instructor or self.instructors[0]).pw_dir) / "parlab"

    def deploy(self) -> "CourseHub":
        """What a deployment installs (docs/jupyterhub.md), under the state folder: nothing of the repository.

        The student edition (``scripts/student_dist.py``) in ``<state>/student``; the servers'
        environment built from it, not editable, in ``<state>/env`` (``server_env.build``); the hub's
        config, the student edition's ``hub/``, in ``<state>/etc/parlab-hub``, as ``/etc/parlab-hub``
        on a host.  Every folder readable by every user; the hub then runs from there.
        """
        import importlib.util

        self.state.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state, 0o755)
        spec = importlib.util.spec_from_file_location("student_dist", self.course_source / "scripts" / "student_dist.py")
        student_dist = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(student_dist)
        try:
            edition = Path(student_dist.build(str(self.state / "student")))
        except SystemExit as e:  # the script's way of saying what is missing
            raise HubError(f"building the student edition failed: {e}") from e
        from server_env import build

        python = build(self.state / "env", edition)
        hub_dir = self.state / "etc" / "parlab-hub"
        if hub_dir.exists():
            shutil.rmtree(hub_dir)
        hub_dir.parent.mkdir(exist_ok=True)
        shutil.copytree(edition / "hub", hub_dir, ignore=shutil.ignore_patterns("__pycache__"))
        for folder, dirs, files in os.walk(self.state / "etc"):
            os.chmod(folder, 0o755)
        self.python, self.hub_dir = python, hub_dir
        (self.state / "deployed.json").write_text(json.dumps({"python": str(python), "hub_dir": str(hub_dir)}))
        return self

    def prepare_course(self) -> None:
        """The exchange and the course files in each instructor's ~/parlab, with their owners and modes.

        The exchange root is 1777, as nbgrader wants it, and its course folder (``parlab/``) is made
        now, the first instructor's and 0755: nbgrader would make it at the first release, and a
        student who made it first would own the course's exchange.
        """
        self.exchange.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state, 0o755)  # the exchange inside must be reachable by every user
        os.chmod(self.exchange, 0o1777)
        course_exchange = self.exchange / "parlab"
        course_exchange.mkdir(exist_ok=True)
        os.chmod(course_exchange, 0o755)
        if self.instructors:
            owner = pwd.getpwnam(self.instructors[0])
            os.chown(course_exchange, owner.pw_uid, owner.pw_gid)
        for instructor in self.instructors:
            course = self.course_dir(instructor)
            course.mkdir(exist_ok=True)
            for name in COURSE_FILES:
                src, dest = self.course_source / name, course / name
                if src.is_dir():
                    shutil.copytree(src, dest, dirs_exist_ok=True,
                                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
                else:
                    shutil.copy(src, dest)
            entry = pwd.getpwnam(instructor)
            subprocess.run(["chown", "-R", f"{entry.pw_uid}:{entry.pw_gid}", str(course)], check=True)

    # ---------------------------------------------------------------- hub

    def admin_token(self) -> str:
        if not self.token_file.exists():
            self.state.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.token_file.write_text(secrets.token_hex(32))
            os.chmod(self.token_file, 0o600)
        return self.token_file.read_text().strip()

    def _env(self) -> dict:
        env = dict(os.environ)
        env.update({
            "PARLAB_HUB_STATE": str(self.state / "hub"), "PARLAB_HUB_PORT": str(self.port),
            "PARLAB_HUB_API_PORT": str(self.api_port), "PARLAB_HUB_PROXY_API_PORT": str(self.proxy_api_port),
            "PARLAB_HUB_INSTRUCTORS": ",".join(self.instructors),
            "PARLAB_HUB_STUDENTS": ",".join(self.students),
            "PARLAB_EXCHANGE": str(self.exchange),
            "PARLAB_HUB_CULL_TIMEOUT": str(self.cull_timeout),
            "PARLAB_HUB_ADMIN_TOKEN": self.admin_token(),
            "PARLAB_HUB_MEM_LIMIT": self.mem_limit or "none",
            "PATH": str(self.python.parent) + os.pathsep + env.get("PATH", "/usr/bin:/bin"),
        })
        env.pop("PARLAB_HUB_CPUS_PER_SERVER", None)
        if self.cpus_per_server is not None:
            env["PARLAB_HUB_CPUS_PER_SERVER"] = str(self.cpus_per_server)
        for key in [k for k in env if k.startswith("VIRTUAL_ENV") or k == "PYTHONPATH"]:
            env.pop(key)  # the hub runs the servers' environment, not the caller's
        env.update(self.extra_env)
        return env

    def start(self, timeout: float = 120) -> "CourseHub":
        self.check_environment()
        if shutil.which("configurable-http-proxy") is None:
            raise HubError("configurable-http-proxy is not installed: npm install -g "
                           "configurable-http-proxy (Node from Debian: apt-get install nodejs npm)")
        (self.state / "hub").mkdir(parents=True, exist_ok=True, mode=0o700)
        log = open(self.state / "jupyterhub.log", "ab")
        self.proc = subprocess.Popen(
            [str(self.python), "-m", "jupyterhub", "-f", str(self.hub_dir / CONFIG.name)], cwd=self.state / "hub",
            env=self._env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        log.close()
        (self.state / "hub.pid").write_text(str(self.proc.pid))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise HubError(f"jupyterhub exited with {self.proc.returncode} before it served; "
                               f"its log ({self.state / 'jupyterhub.log'}):\n{self.log_tail()}")
            try:
                self.api("GET", "/")
                return self
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.5)
        self.stop()
        raise HubError(f"jupyterhub did not answer within {timeout:.0f} s; its log:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return (self.state / "jupyterhub.log").read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def api(self, method: str, path: str, body: dict | None = None, token: str | None = None,
            timeout: float = 30):
        """One call of the hub's REST API (``/hub/api<path>``) with the course-admin token."""
        return hub_api(self.url, token or self.admin_token(), method, path, body, timeout)

    def running_servers(self) -> list[str]:
        try:
            return [u["name"] for u in self.api("GET", "/users") if u.get("servers")]
        except (urllib.error.URLError, OSError):
            return []

    def stop_server(self, user: str, timeout: float = 60) -> None:
        """Stop ``user``'s server through the REST API and wait until the hub says it is gone."""
        try:
            self.api("DELETE", f"/users/{user}/server")
        except urllib.error.HTTPError as e:
            if e.code not in (204, 400, 404):
                raise
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.api("GET", f"/users/{user}")
            if not info.get("servers") and not info.get("pending"):
                return
            time.sleep(0.3)
        raise HubError(f"{user}'s server did not stop within {timeout:.0f} s")

    def _hub_pid(self) -> int | None:
        if self.proc is not None:
            return self.proc.pid
        try:
            return int((self.state / "hub.pid").read_text())
        except (OSError, ValueError):
            return None

    def stop_hub(self, timeout: float = 30) -> None:
        """SIGTERM the hub (which stops the proxy it started) and wait; SIGKILL both if they hang."""
        pid = self._hub_pid()
        proxy_pid = None
        try:
            proxy_pid = int((self.state / "hub" / "proxy.pid").read_text())
        except (OSError, ValueError):
            pass
        for target, sig_timeout in ((pid, timeout), (proxy_pid, 10)):
            if target is None:
                continue
            try:
                os.kill(target, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + sig_timeout
            while time.monotonic() < deadline and _alive(target, self.proc if target == pid else None):
                time.sleep(0.2)
            if _alive(target, self.proc if target == pid else None):
                os.kill(target, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()
            self.proc = None
        (self.state / "hub.pid").unlink(missing_ok=True)

    def stop(self) -> None:
        """Every server stopped through the API, then the hub and its proxy."""
        if self._hub_pid() is None:
            return
        for user in self.running_servers():
            try:
                self.stop_server(user)
            except (HubError, OSError):
                pass  # remove_users ends what is left, by pid
        self.stop_hub()


def _alive(pid: int, proc: subprocess.Popen | None) -> bool:
    if proc is not None:
        return proc.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
