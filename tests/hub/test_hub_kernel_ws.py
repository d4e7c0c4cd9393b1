"""Why benchmarks/hub_load.py once lost 10 of 30 results: an unserved kernel websocket is closed by the server.

``hub/kernel_api.UserKernel`` serves its websocket only while one of its
calls runs its IOLoop.  Jupyter Server pings each kernel websocket every
``ws_ping_interval`` (30 s) and closes one whose pong is ``ws_ping_timeout``
late (90 s).  In that 30-student run the first kernels up waited, without a
call, minutes for the last (hub_load's all-up barrier): their websockets
were closed and their launch results lost.  Here, on one Jupyter server
(no hub; pings every 0.5 s, closed after 2 s without a pong), of two kernels
that ran a cell, the one whose client slept 5 s finds its websocket closed
(and the server's log says "WebSocket ping timeout"), the one whose client
waited with ``UserKernel.idle`` (what hub_load now does) runs its next cell.
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.hub, pytest.mark.timeout(180)]

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hub"))
from kernel_api import UserKernel  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(tmp_path):
    token, port = secrets.token_hex(16), _free_port()
    settings = json.dumps({"ws_ping_interval": 500, "ws_ping_timeout": 2000})
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
           "JUPYTER_DATA_DIR": str(tmp_path / "data"), "OMP_NUM_THREADS": "1",
           "JUPYTER_NO_CONFIG": "1"}  # no server extension (JupyterLab, nbgrader) is loaded: a faster start
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "jupyter_server", "--ServerApp.ip=127.0.0.1",
                             f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
                             f"--IdentityProvider.token={token}", "--ServerApp.open_browser=False",
                             f"--ServerApp.root_dir={tmp_path}", f"--ServerApp.tornado_settings={settings}",
                             *(["--allow-root"] if os.getuid() == 0 else [])],
                            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            req = urllib.request.Request(f"{url}/api/status", headers={"Authorization": f"token {token}"})
            urllib.request.urlopen(req, timeout=5).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"jupyter server did not start: {(tmp_path / 'server.log').read_text()[-2000:]}")
            time.sleep(0.2)
    try:
        yield url, token, tmp_path / "server.log"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_an_unserved_websocket_is_closed_and_idle_keeps_it(server):
    url, token, log = server
    with UserKernel(url, token) as slept, UserKernel(url, token) as served:
        assert slept.execute("x = 6 * 7").status == "ok" and served.execute("x = 6 * 7").status == "ok"
        served.idle(5)        # 5 s with `served`'s loop running; `slept` is not served meanwhile
        assert served.execute("x").result == "42"
        with pytest.raises(ConnectionError, match="websocket closed"):
            slept.execute("x", timeout=30)
    assert "WebSocket ping timeout" in log.read_text(), log.read_text()[-2000:]
