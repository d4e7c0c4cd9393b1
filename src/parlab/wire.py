"""Bytes measured on the wire, from the operating system's or the driver's own counters.

``parlab.trace.count_collectives`` knows which collectives were called and how
large they were, and from that computes what a ring algorithm would send
(``ring_bytes``).  That is a model.  This module reads what was really sent,
so that a lab can put the two side by side::

    with trace.measure_wire() as wire:
        dist.all_reduce(t)
    wire.sent            # bytes this rank's sockets sent, or None (then wire.reason says why)

Where the counter comes from:

- **gloo** (CPU, and CPU tensors on any machine): gloo moves data over TCP
  sockets owned by the rank's own process.  Linux keeps, for every TCP
  socket, the payload bytes it has sent (``tcpi_bytes_sent`` of ``struct
  tcp_info``, Linux 4.19+, the figure ``ss -ti`` prints as ``bytes_sent``),
  retransmissions included.  We list the sockets this process has open
  (``/proc/self/fd``) before and after the region and read their counters
  from the kernel's socket table (the sock_diag netlink interface that ``ss``
  uses).  That table still holds a socket that has left the process's file
  descriptor table during the region, as one of gloo's sometimes does on a
  group's first collective here (it keeps carrying data).  The socket to the
  rendezvous store (``MASTER_PORT``) and a warm group's connection to the
  notebook kernel are left out (they carry no collective data; the store's
  bytes are kept apart in ``store``).  What the count includes that the ring
  model does not: gloo's own message headers and its choice of algorithm
  (for small tensors it does not use a ring).  What it leaves out: the IP
  and TCP headers of each segment (``segments`` says how many there were;
  each carries 52 bytes of headers on loopback with TCP timestamps).
- **NCCL**: NVLink traffic counters read through NVML (the ``nvidia-ml-py``
  package, field ``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX``, summed over the
  GPU's links, in KiB) for the GPU the rank really has, found by its UUID
  (NVML's own numbering ignores ``CUDA_VISIBLE_DEVICES``).  These are per GPU, not per process: another job
  using the same GPU's links at the same time is counted too, and traffic
  that NCCL sends over PCIe or the network is not.  Without NVML, or on a
  GPU without NVLink, ``sent`` is None and ``reason`` says so.

A count is never filled in from a formula: where nothing can be read,
``sent`` is None.
"""
from __future__ import annotations

import contextlib
import os
import socket
import struct
import time
from dataclasses import dataclass, field

__all__ = ["WireCount", "measure_wire", "tcp_counters", "exclude_peer"]

# Offsets into Linux's struct tcp_info (include/uapi/linux/tcp.h).
_TCPI_UNACKED = 24  # __u32, segments sent and not yet acknowledged
_TCPI_NOTSENT_BYTES = 144  # __u32, bytes written by the program that TCP has not sent yet
_TCPI_DATA_SEGS_OUT = 156  # __u32
_TCPI_BYTES_SENT = 200  # __u64, Linux 4.19+
_TCPI_BYTES_RETRANS = 208  # __u64

_EXCLUDED_PEERS: set[tuple[str, int]] = set()

_NVML_TX_FIELD = 138  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX (KiB)
_NVLINK_MAX_LINKS = 18  # H100 SXM has 18 NVLink 4 links


def exclude_peer(address) -> None:
    """Leave a connection out of every wire count (used for a warm rank's link to the kernel)."""
    host, port = address[0], int(address[1])
    _EXCLUDED_PEERS.add((_plain_host(host), port))


def _plain_host(host: str) -> str:
    return host.removeprefix("::ffff:")


@dataclass
class _Socket:
    peer: str
    peer_port: int
    local_port: int
    sent: int
    retrans: int
    segments: int
    pending: bool  # data written but not yet sent, or sent and not yet acknowledged


def _parse_tcp_info(raw: bytes, peer: str, peer_port: int, local_port: int) -> _Socket | None:
    if len(raw) < _TCPI_BYTES_RETRANS + 8:
        return None
    return _Socket(peer, peer_port, local_port,
                   struct.unpack_from("Q", raw, _TCPI_BYTES_SENT)[0],
                   struct.unpack_from("Q", raw, _TCPI_BYTES_RETRANS)[0],
                   struct.unpack_from("I", raw, _TCPI_DATA_SEGS_OUT)[0],
                   bool(struct.unpack_from("I", raw, _TCPI_NOTSENT_BYTES)[0]
                        or struct.unpack_from("I", raw, _TCPI_UNACKED)[0]))


def _own_inodes() -> set[int] | str:
    """Inodes of the sockets this process has open, from /proc/self/fd."""
    fd_dir = "/proc/self/fd"
    if not os.path.isdir(fd_dir):
        return "per-socket TCP counters need Linux (/proc/self/fd)"
    out = set()
    for name in os.listdir(fd_dir):
        try:
            link = os.readlink(f"{fd_dir}/{name}")
        except OSError:  # closed since the listing
            continue
        if link.startswith("socket:["):
            out.add(int(link[8:-1]))
    return out


# Linux's sock_diag netlink interface (include/uapi/linux/inet_diag.h): one dump lists every TCP
# socket of this network namespace with its inode and its tcp_info, whichever process holds it.
_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY, _INET_DIAG_INFO = 4, 20, 2
_NLM_F_REQUEST_DUMP, _NLMSG_ERROR, _NLMSG_DONE = 0x301, 2, 3


def _diag_dump(family: int) -> dict[int, _Socket | None]:
    req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 1 << (_INET_DIAG_INFO - 1), 0,
                      0xFFFFFFFF) + bytes(48)  # every state; an empty socket id matches all
    out: dict[int, _Socket | None] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as nl:
        nl.sendto(struct.pack("=IHHII", 16 + len(req), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST_DUMP, 1, 0)
                  + req, (0, 0))
        while True:
            data, off = nl.recv(1 << 20), 0
            while off + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, off)
                if kind == _NLMSG_DONE:
                    return out
                if kind == _NLMSG_ERROR:
                    raise OSError("the kernel refused the sock_diag request")
                body = data[off + 16:off + length]
                off += (length + 3) & ~3
                local_port, peer_port = struct.unpack_from(">HH", body, 4)
                addr = body[24:40] if family == socket.AF_INET6 else body[24:28]
                inode = struct.unpack_from("=I", body, 68)[0]
                a = 72
                while inode and a + 4 <= len(body):
                    alen, atype = struct.unpack_from("=HH", body, a)
                    if alen < 4:
                        break
                    if atype == _INET_DIAG_INFO:
                        out[inode] = _parse_tcp_info(body[a + 4:a + alen],
                                                     _plain_host(socket.inet_ntop(family, addr)),
                                                     peer_port, local_port)  # None: too old a kernel
                    a += (alen + 3) & ~3
            if not data:
                return out


def _kernel_table() -> dict[int, _Socket | None] | str:
    if not hasattr(socket, "AF_NETLINK"):
        return "per-socket TCP counters need Linux's sock_diag netlink interface"
    try:
        return {**_diag_dump(socket.AF_INET), **_diag_dump(socket.AF_INET6)}
    except OSError as err:
        return f"the kernel's socket table (sock_diag netlink) could not be read: {err}"


def tcp_counters(inodes: set[int] | None = None, ports: set[int] = frozenset()
                 ) -> dict[int, _Socket] | str:
    """This process's TCP sockets with their counters, or a string saying why not.

    A socket is this process's when its inode is in ``inodes`` (default: the
    sockets in /proc/self/fd now) or its local port is in ``ports`` (the ports
    this process's sockets were bound to, which a connection accepted on one
    of its listening ports shares).  The counters come from the kernel's
    socket table (sock_diag), so a socket counts even after it has left the
    process's file descriptor table.
    """
    if inodes is None:
        inodes = _own_inodes()
        if isinstance(inodes, str):
            return inodes
    table = _kernel_table()
    if isinstance(table, str):
        return table
    found = {ino: sock for ino, sock in table.items()
             if ino in inodes or (sock is not None and sock.local_port in ports)}
    if any(sock is None for sock in found.values()):
        return "this Linux kernel's tcp_info has no bytes_sent (needs Linux 4.19 or newer)"
    return found


@dataclass
class WireCount:
    """What one rank sent during a ``measure_wire()`` region.

    ``sent``: payload bytes sent (None when nothing could be read; ``reason``
    says why).  ``source``: "tcp_info" or "nvml".  For tcp_info also
    ``per_peer`` ({"127.0.0.1:port": bytes}, only peers that received
    something), ``segments`` (TCP data segments), ``retransmitted`` and
    ``store`` (bytes to the rendezvous store, not in ``sent``).
    """

    source: str | None = None
    sent: int | None = None
    reason: str = ""
    per_peer: dict = field(default_factory=dict)
    segments: int | None = None
    retransmitted: int | None = None
    store: int = 0

    @property
    def measured(self) -> bool:
        return self.sent is not None

    def __repr__(self) -> str:
        if not self.measured:
            return f"WireCount(not measured: {self.reason})"
        return f"WireCount({self.sent:,} bytes sent, from {self.source})"


def _store_port() -> int | None:
    port = os.environ.get("MASTER_PORT")
    return int(port) if port and port.isdigit() else None


def _tcp_delta(before: dict, after: dict, count: WireCount) -> None:
    store = _store_port()
    sent = retrans = segs = 0
    for key, now in after.items():
        old = before.get(key)
        if old is not None and (old.peer, old.peer_port) != (now.peer, now.peer_port):
            old = None  # the number was reused by a new socket
        d_sent = now.sent - (old.sent if old else 0)
        if (now.peer, now.peer_port) in _EXCLUDED_PEERS:
            continue
        if store is not None and store in (now.peer_port, now.local_port):
            count.store += d_sent
            continue
        sent += d_sent
        retrans += now.retrans - (old.retrans if old else 0)
        segs += now.segments - (old.segments if old else 0)
        if d_sent:
            peer = f"{now.peer}:{now.peer_port}"
            count.per_peer[peer] = count.per_peer.get(peer, 0) + d_sent
    count.source, count.sent, count.retransmitted, count.segments = "tcp_info", sent, retrans, segs


def _rank_gpu_uuid() -> str | None:
    """NVML's name ("GPU-...") of the GPU this rank's torch calls current, or None without CUDA.

    NVML numbers the machine's GPUs itself and ignores ``CUDA_VISIBLE_DEVICES``:
    on a server given GPUs 2,3, torch's ``cuda:0`` is NVML's index 2.  The
    UUID is the same on both sides, so the GPU is looked up by it.
    """
    import torch

    if not torch.cuda.is_available():
        return None
    uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    return uuid if uuid.startswith(("GPU-", "MIG-")) else "GPU-" + uuid


def _nvml_tx_kib(uuid: str | None):
    """(KiB sent over all NVLinks of the GPU named ``uuid``, None) or (None, why not)."""
    try:
        import pynvml
    except ImportError:
        return None, "NVLink counters need NVML's Python bindings: pip install nvidia-ml-py"
    if uuid is None:
        return None, "this rank has no CUDA device, so there is no NVLink counter to read"
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        total, links = 0, 0
        for link in range(_NVLINK_MAX_LINKS):
            values = pynvml.nvmlDeviceGetFieldValues(handle, [(_NVML_TX_FIELD, link)])
            if values[0].nvmlReturn != 0:
                continue
            total += values[0].value.ullVal
            links += 1
    except Exception as err:  # NVML errors are their own class per code
        return None, f"NVML could not read the NVLink counters: {err}"
    if not links:
        return None, "this GPU reports no NVLink counters (no NVLink, or not exposed by the driver)"
    return total, None


def _backend() -> str | None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return str(dist.get_backend()).lower()
    return None


@contextlib.contextmanager
def measure_wire(backend: str | None = None):
    """Measure the bytes this rank really sends inside the block (see the module docstring).

    ``backend`` defaults to the process group's; gloo is read from the TCP
    sockets, NCCL from NVML.  Asynchronous work started in the block must be
    waited for inside it, or its bytes may fall outside.
    """
    backend = (backend or _backend() or "gloo").lower()
    count = WireCount()
    if "nccl" in backend and "gloo" not in backend:
        uuid = _rank_gpu_uuid()
        before, why = _nvml_tx_kib(uuid)
        yield count
        if why is None:
            after, why = _nvml_tx_kib(uuid)
        if why is None:
            count.source, count.sent = "nvml", int((after - before) * 1024)
        else:
            count.reason = why
        return
    if "gloo" not in backend:
        count.reason = f"no wire counter for the {backend!r} backend"
        yield count
        return
    mine = _own_inodes()
    before = tcp_counters(mine) if not isinstance(mine, str) else mine
    yield count
    if isinstance(before, str):
        count.reason = before
        return
    now_mine = _own_inodes()
    inodes = mine | (now_mine if isinstance(now_mine, set) else set())
    ports = {sock.local_port for sock in before.values()}
    after = _settled(inodes, ports)
    if isinstance(after, str):
        count.reason = after
        return
    _tcp_delta(before, after, count)


def _settled(inodes: set[int], ports: set[int], limit: float = 2.0, quiet: float = 0.02):
    """The counters once this rank has stopped sending, for at most ``limit`` seconds.

    A gloo collective can return on one rank before that rank's last message
    has left: it may still sit in gloo's own queue or in the socket's send
    buffer.  So read until no socket has data waiting or unacknowledged and
    no count has moved for ``quiet`` seconds.  A socket that disappears
    meanwhile (its peer process ended and closed it) keeps its last reading:
    the counters only grow.
    """
    deadline = time.monotonic() + limit
    seen: dict[int, _Socket] = {}
    since = time.monotonic()
    while True:
        now = tcp_counters(inodes, ports)
        if isinstance(now, str):
            return now if not seen else seen
        moved = any(ino not in seen or sock.sent != seen[ino].sent for ino, sock in now.items())
        seen.update(now)
        if moved or any(sock.pending for sock in now.values()):
            since = time.monotonic()
        elif time.monotonic() - since >= quiet:
            return seen
        if time.monotonic() > deadline:
            return seen
        time.sleep(0.001)
