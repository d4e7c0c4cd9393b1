"""What two students do on one host, for tests/ranks/test_shared_host.py.

``python shared_host_roles.py alice SHARED SQUAT`` and ``... bob SHARED``, each
run as its own Unix user with ``TMPDIR=SHARED`` (a sticky, world-writable
folder, like /tmp).  Every finding goes to a JSON file in SHARED; the test
reads them.

alice: tries a launch where bob squats her jobs folder (in SQUAT), then runs a
2-rank launch that publishes its folder, its store port and its gloo ports,
waits while bob probes, checks its all-reduces, then forms a new group after
bob has written a forged value into the store.

bob: while alice's launch is live, tries her folders, connects to her store
(raw bytes, then as a TCPStore client) and to her gloo ports (raw bytes, and
connections held open through her all-reduces), runs a launch of his own,
then forges the address that alice's rank 1 publishes for the next group.

namespaced: a launch meant to run inside ``bwrap --unshare-net``; it
publishes its store port, knocks on it from inside the namespace, and waits
so the test can knock from outside.
"""
import json
import os
import socket
import sys
import tempfile
import time

import parlab

#: gloo's key for rank 1's address in the second group (torch 2.13's layout:
#: ``<group>//<subgroup>//cpu//<context>/<rank>``); the test checks it was used.
NEXT_GROUP_KEY = "0//1//cpu//0/1"


def write_json(path, data):
    with open(f"{path}.part", "w") as f:
        json.dump(data, f)
    os.replace(f"{path}.part", path)


def wait_for(path, seconds=120):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {seconds} s")
        time.sleep(0.05)


def outcome(call):
    try:
        return {"ok": True, "value": call()}
    except Exception as exc:  # noqa: BLE001 - the test reads the type and the message
        return {"ok": False, "type": type(exc).__name__, "message": str(exc)}


# ---------------------------------------------------------------- what alice's ranks run

def alices_job(shared):
    import psutil
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    job = os.environ["PARLAB_JOB_DIR"]
    listen = [[c.laddr.ip, c.laddr.port] for c in psutil.Process().net_connections("tcp")
              if c.status == psutil.CONN_LISTEN]
    everyone = [None, None]
    dist.all_gather_object(everyone, listen)
    if rank == 0:
        st = {p: os.stat(p) for p in (job, os.path.dirname(job))}
        write_json(f"{shared}/ready.json", {
            "job": job, "store_port": int(os.environ["MASTER_PORT"]), "gloo": everyone,
            "folders": {p: {"uid": s.st_uid, "mode": s.st_mode & 0o7777} for p, s in st.items()}})
    wait_for(f"{shared}/go1")
    sums = []
    for i in range(5):  # with bob's connections to the store and the gloo ports still open
        t = torch.arange(4, dtype=torch.float64) + 10 * rank + i
        dist.all_reduce(t)
        sums.append(t.tolist())
    b = torch.tensor([float(rank)])
    dist.broadcast(b, src=1)
    write_json(f"{shared}/phase1.{rank}.json", {"sums": sums, "broadcast": b.item()})
    wait_for(f"{shared}/go2")
    if rank == 1:
        time.sleep(2)  # rank 0 reads rank 1's address before rank 1 writes it: bob's forgery
    group = dist.new_group([0, 1])
    t = torch.ones(1)
    dist.all_reduce(t, group=group)
    return t.item()


def own_folder():
    job = os.environ["PARLAB_JOB_DIR"]
    return {p: {"uid": os.stat(p).st_uid, "mode": os.stat(p).st_mode & 0o7777}
            for p in (job, os.path.dirname(job))}


def noop():
    return None


def alice(shared, squat):
    tempfile.tempdir = squat  # bob created squat/parlab-<alice's uid> first
    squatted = outcome(lambda: parlab.launch(noop, nproc=1, timeout=60))
    tempfile.tempdir = None
    write_json(f"{shared}/alice-squat.json", squatted)
    started = time.monotonic()
    got = outcome(lambda: parlab.launch(alices_job, args=(shared,), nproc=2, timeout=120))
    got["seconds"] = time.monotonic() - started
    write_json(f"{shared}/alice.json", got)


# ---------------------------------------------------------------- a launch in its own network namespace

def publish_store_port_then_reduce(folder):
    import torch
    import torch.distributed as dist

    if dist.get_rank() == 0:
        with open(f"{folder}/port.part", "w") as f:
            f.write(os.environ["MASTER_PORT"])
        os.replace(f"{folder}/port.part", f"{folder}/port")
    wait_for(f"{folder}/go", 60)
    t = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(t)
    return t.item()


def store_answers(port: int) -> str:
    """"store" when a TCPStore client gets an answer on 127.0.0.1:port, "refused" when nothing listens."""
    import datetime

    import torch.distributed as dist

    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
    except ConnectionRefusedError:
        return "refused"
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))
    client.num_keys()
    return "store"


def namespaced(folder):
    import threading

    def probe_from_inside():
        wait_for(f"{folder}/port")
        with open(f"{folder}/port") as f:
            write_json(f"{folder}/inside.json", store_answers(int(f.read())))

    probe = threading.Thread(target=probe_from_inside)
    probe.start()
    got = parlab.launch(publish_store_port_then_reduce, args=(folder,), nproc=2, timeout=90)
    probe.join()
    write_json(f"{folder}/got", got)


# ---------------------------------------------------------------- bob

def try_folder(action):
    try:
        action()
        return "allowed"
    except PermissionError:
        return "PermissionError"
    except OSError as exc:
        return type(exc).__name__


def raw_connect(host, port, data, hold=None):
    try:
        s = socket.create_connection((host, port), timeout=5)
    except OSError as exc:
        return type(exc).__name__
    s.sendall(data)
    if hold is None:
        time.sleep(0.2)
        s.close()
    else:
        hold.append(s)
    return "connected"


def bob(shared):
    import datetime

    import torch.distributed as dist

    wait_for(f"{shared}/ready.json")
    with open(f"{shared}/ready.json") as f:
        ready = json.load(f)
    job, parent, port = ready["job"], os.path.dirname(ready["job"]), ready["store_port"]
    found = {"folders": {
        "list her jobs folder": try_folder(lambda: os.listdir(parent)),
        "list her launch folder": try_folder(lambda: os.listdir(job)),
        "read her task": try_folder(lambda: open(os.path.join(job, "task.pkl"), "rb").read()),
        "read her spec and its secret": try_folder(lambda: open(os.path.join(job, "spec.pkl"), "rb").read()),
        "write into her jobs folder": try_folder(lambda: open(os.path.join(parent, "planted"), "wb").close()),
        "write into her launch folder": try_folder(lambda: open(os.path.join(job, "result.0"), "wb").close()),
    }}
    found["store_raw"] = raw_connect("127.0.0.1", port, os.urandom(4096))
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))
    keys = client.list_keys()
    found["store_keys"] = keys
    found["store_read"] = len(client.get(keys[0])) if keys else 0
    client.set("bob-was-here", b"x")
    held = []
    found["gloo"] = [raw_connect(ip, p, os.urandom(512)) for ports in ready["gloo"] for ip, p in ports]
    found["gloo_held"] = [raw_connect(ip, p, b"", hold=held) for ports in ready["gloo"] for ip, p in ports]
    found["own_launch"] = outcome(lambda: parlab.launch(own_folder, nproc=1, timeout=60))
    write_json(f"{shared}/bob.json", found)
    open(f"{shared}/go1", "w").close()
    wait_for(f"{shared}/phase1.0.json")
    wait_for(f"{shared}/phase1.1.json")
    for s in held:
        s.close()
    client.set(NEXT_GROUP_KEY, os.urandom(170))  # the size of a real gloo address here
    open(f"{shared}/go2", "w").close()


if __name__ == "__main__":
    role, *args = sys.argv[1:]
    {"alice": alice, "bob": bob, "namespaced": namespaced}[role](*args)
