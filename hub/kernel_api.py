"""Run code in a user's kernel through their Jupyter server's API, as a browser tab would.

    with UserKernel(server_url, token) as kernel:        # POST /api/kernels, then its websocket
        reply = kernel.execute("import parlab; parlab.launch(f, nproc=2)", timeout=300)
        reply.status, reply.stdout, reply.result

tests/hub and benchmarks/hub_load.py use it to drive many students' servers
without a browser each.  Between calls, wait with ``kernel.idle(seconds)``,
not ``time.sleep``: the websocket is served only while one of its calls
runs, and the server closes one that answers no ping for 90 s (``idle``).
``kernel_name`` defaults to ``python3``, the name every lab's notebook
metadata gives.
"""
from __future__ import annotations

import json
import time
import urllib.request
import uuid
from dataclasses import dataclass, field


@dataclass
class Reply:
    status: str = ""
    stdout: str = ""
    stderr: str = ""
    result: str = ""
    error: str = ""
    outputs: list = field(default_factory=list)


class UserKernel:
    def __init__(self, server_url: str, token: str, kernel_name: str = "python3"):
        self.server_url = server_url.rstrip("/")  # e.g. http://127.0.0.1:8000/user/ada
        self.token, self.kernel_name = token, kernel_name
        self.kernel_id: str | None = None
        self._ws = None
        self._loop = None

    def _request(self, method: str, path: str, body: dict | None = None):
        req = urllib.request.Request(
            f"{self.server_url}{path}", method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            text = resp.read().decode()
            return json.loads(text) if text.strip() else None

    def __enter__(self) -> "UserKernel":
        from tornado.ioloop import IOLoop
        from tornado.websocket import websocket_connect
        from tornado.httpclient import HTTPRequest

        self.kernel_id = self._request("POST", "/api/kernels", {"name": self.kernel_name})["id"]
        self._loop = IOLoop()
        ws_url = self.server_url.replace("http", "ws", 1) + f"/api/kernels/{self.kernel_id}/channels"
        request = HTTPRequest(ws_url, headers={"Authorization": f"token {self.token}"})
        self._ws = self._loop.run_sync(lambda: websocket_connect(request), timeout=60)
        return self

    def send(self, code: str) -> str:
        """Ask the kernel to run ``code``; returns the request's id without waiting for it."""
        msg_id = uuid.uuid4().hex
        message = json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "",
                       "session": uuid.uuid4().hex, "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": True,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}})
        self._loop.run_sync(lambda: self._ws.write_message(message), timeout=60)
        return msg_id

    def idle(self, seconds: float) -> None:
        """Wait ``seconds`` with the websocket served: the server's pings answered, its messages queued.

        The connection is served only while this client's IOLoop runs (in
        ``execute``, ``send`` or here).  A client that waits otherwise answers
        no ping, and Jupyter Server closes a kernel's websocket whose pong is
        ``ws_ping_timeout`` late (90 s by default: 3 pings 30 s apart), so
        the next ``execute`` finds it closed.  A browser's websocket answers
        pings by itself.  tests/hub/test_hub_kernel_ws.py shows both.
        """
        import asyncio

        self._loop.run_sync(lambda: asyncio.sleep(seconds), timeout=seconds + 60)

    def execute(self, code: str, timeout: float = 300) -> Reply:
        """Run ``code`` and wait for its reply: what it printed, its result or its error."""
        msg_id = self.send(code)
        reply, idle, done = Reply(), False, False
        deadline = time.monotonic() + timeout
        while not (idle and done):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the kernel did not finish within {timeout:.0f} s; so far: {reply}")
            raw = self._loop.run_sync(self._ws.read_message, timeout=left)
            if raw is None:
                raise ConnectionError(f"the kernel's websocket closed; so far: {reply}")
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                setattr(reply, content["name"], getattr(reply, content["name"]) + content["text"])
            elif kind == "execute_result":
                reply.result = content["data"].get("text/plain", "")
            elif kind == "error":
                reply.error = "\n".join(content.get("traceback", [])) or content.get("evalue", "")
            elif kind == "status" and content["execution_state"] == "idle":
                idle = True
            elif kind == "execute_reply":
                reply.status, done = content["status"], True
            if kind in ("stream", "execute_result", "display_data", "error"):
                reply.outputs.append(msg)
        return reply

    def __exit__(self, *exc) -> None:
        if self._ws is not None:
            self._ws.close()
        try:
            if self.kernel_id:
                self._request("DELETE", f"/api/kernels/{self.kernel_id}")
        except OSError:
            pass  # the server is gone (stopped or culled): its kernels went with it
        if self._loop is not None:
            self._loop.close()
