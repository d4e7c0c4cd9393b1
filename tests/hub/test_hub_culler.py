"""The hub's idle culler stops at the hub's SIGINT even when the hub was started with SIGINT ignored
(a shell's background job, ``nohup make hub &``): otherwise every hub shutdown waits the 30 s JupyterHub
gives a managed service before its SIGTERM."""
import os
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.hub, pytest.mark.timeout(120)]


def _culler_command(tmp_path, monkeypatch) -> list[str]:
    from traitlets.config import Config

    config = Config()
    monkeypatch.setenv("PARLAB_HUB_STATE", str(tmp_path / "state"))
    found = runpy.run_path(str(REPO / "hub" / "jupyterhub_config.py"), init_globals={"get_config": lambda: config})
    service = next(s for s in config.JupyterHub.services if s["name"] == "idle-culler")
    assert service["command"] == found["CULLER_COMMAND"]
    return service["command"]


def _stops_at_sigint(command: list[str]) -> float | None:
    """Seconds the command takes to exit after SIGINT, started with SIGINT ignored; None if it ignores it."""
    env = dict(os.environ, JUPYTERHUB_API_TOKEN="not-a-token", JUPYTERHUB_API_URL="http://127.0.0.1:9/hub/api")
    proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        time.sleep(2)  # past its start-up, into its loop
        assert proc.poll() is None, "the culler exited before the signal"
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(4)
        return time.monotonic() - start
    except subprocess.TimeoutExpired:
        return None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_culler_stops_at_sigint_though_started_with_it_ignored(tmp_path, monkeypatch):
    command = _culler_command(tmp_path, monkeypatch)
    assert _stops_at_sigint(command) is not None
    # the plain command, as JupyterHub's docs give it, keeps running: what the wrapper is for
    plain = [sys.executable, "-m", "jupyterhub_idle_culler", *command[3:]]
    assert _stops_at_sigint(plain) is None
