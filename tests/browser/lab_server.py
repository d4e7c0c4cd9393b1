"""A private JupyterLab server for one browser test.

Each server gets its own free port, a random token, a temporary copy of
``labs/`` as its notebook folder (the repository is never written to), and its
own Jupyter/IPython/JupyterLab state folders, so no settings, workspaces or
history carry over between tests or from the user's own set-up.

Every process the server starts (kernels, torchrun, the ranks) inherits a
random marker in its environment.  That marker is how the tests find the
processes of a launch, and how ``stop()`` ends whatever is left: by pid,
never by name.
"""
from __future__ import annotations

import json
import os
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

REPO = Path(__file__).resolve().parents[2]
MARKER_ENV = "PARLAB_BROWSER_TEST"

#: JupyterLab user settings for the tests: every cell stays in the page (no
#: windowing, so a locator finds cells below the fold), and no news or update
#: pop-up covers the notebook.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification": {
        "fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pids_with_env(key: str, value: str) -> set[int]:
    """Pids of processes whose environment holds key=value (Linux /proc)."""
    needle = b"\0" + f"{key}={value}".encode() + b"\0"
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in b"\0" + f.read() + b"\0":
                    found.add(int(name))
        except OSError:
            continue  # ended meanwhile, or not ours to read
    return found


class LabServer:
    """``jupyter lab`` from this venv, on a copy of labs/ under ``root``."""

    def __init__(self, root: Path, start_timeout: float = 90.0, extra_env: dict | None = None):
        self.root = Path(root)
        self.notebooks = self.root / "labs"
        self.tmp = self.root / "tmp"  # TMPDIR of the kernels: parlab's job folders land here
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.marker = secrets.token_hex(8)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.root / "jupyterlab.log"
        self.proc: subprocess.Popen | None = None
        self.start_timeout = start_timeout
        self.extra_env = dict(extra_env or {})

    # ------------------------------------------------------------------ start

    def _write_settings(self) -> None:
        for plugin, values in LAB_SETTINGS.items():
            path = self.root / "state" / "jupyterlab_settings_dir" / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))

    def _env(self) -> dict:
        state = self.root / "state"
        env = dict(os.environ)
        for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR",
                    "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR", "IPYTHONDIR"):
            env[var] = str(state / var.lower())
        env.update({
            MARKER_ENV: self.marker,
            "TMPDIR": str(self.tmp),
            "JUPYTER_PLATFORM_DIRS": "1",
            "PYTHONNOUSERSITE": "1",
        })
        env.pop("PARLAB_OUTPUT", None)  # the kernel must pick widgets as it would for a student
        env.update(self.extra_env)
        return env

    def _server_args(self) -> list[str]:
        """The Jupyter server's own options: this port and token, the notebook folder, root if we are."""
        args = [
            "--no-browser",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            "--ServerApp.ip=127.0.0.1",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.notebooks}",
        ]
        if os.getuid() == 0:
            args.append("--allow-root")
        return args

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "jupyterlab", *self._server_args(),
                "--LabApp.news_url=None",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--LabServerApp.extension_manager=readonly"]

    def _prepare(self) -> None:
        """The folders the server starts on: a copy of labs/, the kernels' TMPDIR, JupyterLab's settings."""
        shutil.copytree(REPO / "labs", self.notebooks)
        self.tmp.mkdir(parents=True)
        self._write_settings()

    def start(self) -> "LabServer":
        self._prepare()
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self._command(), env=self._env(), cwd=self.notebooks,
                                     stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode} before it "
                                   f"served; its log:\n{self.log_text()}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/status?token={self.token}", timeout=2):
                    return self
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"jupyter lab did not answer within {self.start_timeout:.0f} s; "
                           f"its log:\n{self.log_text()}")

    def lab_url(self, path: str, workspace: str) -> str:
        """A fresh named workspace (``?reset``) opened on the notebook at ``path``."""
        return f"{self.url}/lab/workspaces/{workspace}/tree/{path}?reset&token={self.token}"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no log)"

    # ------------------------------------------------------------------- stop

    def processes(self) -> set[int]:
        """Every live process that this server or its kernels started (and the server)."""
        return pids_with_env(MARKER_ENV, self.marker)

    def stop(self) -> None:
        """End the kernels, then the server, then anything else it started: by pid.

        Kernels get SIGTERM first: a clean server shutdown would ask each one
        to shut down and wait for it, seconds per test for nothing.
        """
        if self.proc is None:
            return
        self._signal(self.processes() - {self.proc.pid}, signal.SIGTERM)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # jupyter asks to confirm on SIGINT, not SIGTERM
            try:  # its shutdown takes seconds even with no kernel left: not worth waiting for
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        deadline = time.monotonic() + 5
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        self._signal(self.processes(), signal.SIGKILL)
        self.log.close()
        self.proc = None

    @staticmethod
    def _signal(pids, sig) -> None:
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
