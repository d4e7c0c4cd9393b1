"""The kernel's end of a warm group's connections: who may connect, and what a reply says.

The kernel listens on 127.0.0.1 (a port the system picks) only while the
group starts.  A connection counts as rank r when both sides prove that they
hold the group's secret (``multiprocessing.connection``'s HMAC challenge, in
both directions) and the peer then names itself as rank r with the pid that
rank r wrote to the private job folder.  Anyone else is dropped; one that
stays silent is dropped after a few seconds.

A reply is one message: a JSON header line, then the result's bytes if any
(one write, so TCP's delayed acknowledgement never holds back a second part).
"""
from __future__ import annotations

import json
import os
import select
import socket
import struct
import time
from multiprocessing.connection import AuthenticationError, Connection, answer_challenge, deliver_challenge

from .errors import LaunchError
from .jobdir import checked_record
from .report import explain

POLL = 0.02
_HANDSHAKE_S = 5


class Listener:
    """A listening socket with a fresh secret; use as a context manager (it closes on exit)."""

    def __init__(self, nproc: int):
        self.authkey = os.urandom(32)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(nproc)
        self.address = self.sock.getsockname()
        self.nproc = nproc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.sock.close()

    def accept_ranks(self, job, limit: float) -> dict:
        """rank -> connection for every rank of ``job`` (a started ``Job``), within ``limit`` seconds.

        Raises what ``report.explain`` makes of it when a rank fails to start,
        dies, or the ranks do not all connect in time.
        """
        conns = {}
        deadline = time.monotonic() + limit
        while len(conns) < self.nproc:
            job._pump()
            if job.agent.poll() is not None or job._dead_ranks(job.job.pids()) or job.job.errors(self.nproc):
                raise explain(job._facts()) or LaunchError("the warm ranks ended while starting")
            if time.monotonic() > deadline:
                raise explain(job._facts(timed_out=True))
            if select.select([self.sock], [], [], POLL)[0]:
                sock, _ = self.sock.accept()
                rank, conn = handshake(sock, self.authkey, job.job.pids())
                if conn is not None:
                    conns[rank] = conn
        return conns


def handshake(sock, authkey: bytes, pids: dict):
    """(rank, connection) for a peer that knows the secret and is who its pid file says; else (None, None)."""
    sock.setblocking(True)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", _HANDSHAKE_S, 0))
    conn = Connection(os.dup(sock.fileno()))
    try:
        deliver_challenge(conn, authkey)
        answer_challenge(conn, authkey)
        hello = json.loads(conn.recv_bytes(256))
        rank, pid = int(hello["rank"]), int(hello["pid"])
        if rank not in pids or pids[rank][0] != pid:
            raise AuthenticationError(f"pid {pid} is not rank {rank}")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 0))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return rank, conn
    except (AuthenticationError, OSError, EOFError, ValueError, KeyError, TypeError):
        conn.close()
        return None, None
    finally:
        sock.close()


def read_reply(conn, request_id: int, rank: int):
    """("result", bytes or None) | ("error", checked record) | ("interrupted", where).

    Raises OSError for a reply to another request (the connection is out of
    step) and EOFError when the rank is gone.
    """
    head, _, payload = conn.recv_bytes().partition(b"\n")
    head = json.loads(head)
    if head.get("id") != request_id:
        raise OSError(f"rank {rank} answered out of step")
    status = head["status"]
    if status in ("result", "ok"):
        return "result", payload if status == "result" else None
    if status == "error":  # checked like the cold path's error.r files: plain JSON, never a pickle
        return "error", checked_record(json.dumps(head["record"]).encode(), rank)
    return "interrupted", str(head.get("where", ""))
