"""What parlab asks Slurm for, without a cluster: a fake ``sinfo``/``scontrol`` answers the probes.

- ``PARLAB_SCHEDULER=slurm`` (what a hub sets for its servers) routes no
  launch by itself: a launch that does not pass ``scheduler="slurm"`` stays
  local and never calls a Slurm client; only the queue cells' gate says yes.
- ``srun`` asks CPUs and memory per GPU (per rank when no GPU is asked),
  from defaults or ``PARLAB_SLURM_CPUS_PER_GPU``/``PARLAB_SLURM_MEM_PER_GPU``;
  a request no node can hold, or a malformed value, is refused naming it.
- ``parlab grade --slurm``'s ``sbatch`` asks memory per task, takes a
  throttle (``--array=0-N%K``) and passes ``--reservation``/``--qos``.
The real cluster's view of the same requests is in tests/slurm/test_slurm_asks.py.
"""
import pytest

from parlab.classgrade import array_slurm, cli
from parlab.launch import queue_offer, slurm
from parlab.launch.job import Job
from parlab.launch.tasks import CallTask

pytestmark = pytest.mark.unit
#: sinfo -N -o %P|%N|%G|%c|%m of a one-DGX cluster (112 CPUs, 2 TB) and a CPU partition
SINFO = "gpu*|dgx|gpu:h100:8|112|2000000\ncpu|c1|(null)|16|64000\n"


@pytest.fixture
def fake_slurm(monkeypatch):
    calls = []

    def run_client(args, timeout=15.0):
        calls.append(args)
        if args[0] == "sinfo" and "-p" in args:  # one partition's CPUs (%c) or memory (%m)
            part = args[args.index("-p") + 1]
            rows = [r.split("|") for r in SINFO.splitlines() if r.split("|")[0].rstrip("*") == part]
            return "\n".join(r[3 if args[-1] == "%c" else 4] for r in rows) + "\n"
        if args[0] == "sinfo":
            return SINFO
        if args[0] == "scontrol":
            return "MaxArraySize            = 1001\n"
        return ""

    monkeypatch.setattr(slurm, "run_client", run_client)
    monkeypatch.setattr(slurm, "_client", lambda tool: tool)
    for name in ("PARLAB_SCHEDULER", "PARLAB_SLURM_CPUS_PER_GPU", "PARLAB_SLURM_MEM_PER_GPU",
                 "PARLAB_SLURM_PARTITION", "PARLAB_SLURM_ACCOUNT"):
        monkeypatch.delenv(name, raising=False)
    return calls


def one(*_):
    return 1


def test_the_hub_setting_turns_on_the_queue_cells_and_routes_nothing_else(fake_slurm, monkeypatch):
    monkeypatch.setenv("PARLAB_SCHEDULER", "slurm")
    assert queue_offer.queue_configured()
    job = Job(CallTask(one, (), {}), 2, "gloo", None, None, None, 0)  # doctor, warm group, check, grading
    assert job.scheduler == "local" and job.request is None and fake_slurm == []
    with pytest.raises(ValueError, match="pass scheduler='slurm' too"):
        Job(CallTask(one, (), {}), 2, "gloo", None, None, None, 0, gpus=2)
    queued = Job(CallTask(one, (), {}), 2, "gloo", None, None, None, 0, scheduler="slurm", gpus=2)
    assert queued.request.gpus_per_node == 2 and fake_slurm  # only now is Slurm asked
    monkeypatch.setenv("PARLAB_SCHEDULER", "slurmm")
    with pytest.raises(ValueError, match="PARLAB_SCHEDULER must be one of local, slurm, got 'slurmm'"):
        queue_offer.queue_configured()


def srun_asks(**kw) -> list[str]:
    nproc, req = slurm.check_request(kw.get("nproc"), kw.get("gpus"), kw.get("nnodes"), kw.get("partition"),
                                     None, None)
    return [a for a in slurm.srun_command(req, "parlab-x", ["true"]) if a.startswith(("--cpus", "--mem", "--gres"))]


def test_srun_asks_cpus_and_memory_per_gpu(fake_slurm, monkeypatch):
    assert srun_asks(gpus=8) == ["--gres=gpu:8", "--cpus-per-task=16", "--mem=32768M"]  # defaults: 2 CPUs, 4G
    assert srun_asks(nproc=4, partition="cpu") == ["--cpus-per-task=8", "--mem=16384M"]  # per rank, no GPU
    monkeypatch.setenv("PARLAB_SLURM_CPUS_PER_GPU", "14")
    monkeypatch.setenv("PARLAB_SLURM_MEM_PER_GPU", "240G")
    assert srun_asks(gpus=4) == ["--gres=gpu:4", "--cpus-per-task=56", "--mem=983040M"]  # 240G x 4


@pytest.mark.parametrize("name, value, message", [
    ("PARLAB_SLURM_CPUS_PER_GPU", "two", "PARLAB_SLURM_CPUS_PER_GPU must be a whole number"),
    ("PARLAB_SLURM_CPUS_PER_GPU", "0", "PARLAB_SLURM_CPUS_PER_GPU must be a whole number"),
    ("PARLAB_SLURM_MEM_PER_GPU", "lots", "PARLAB_SLURM_MEM_PER_GPU must be a memory size such as 4G"),
    ("PARLAB_SLURM_CPUS_PER_GPU", "15", "ask 120 CPUs, but the nodes of partition 'gpu' have at most 112"),
    ("PARLAB_SLURM_MEM_PER_GPU", "300G", "ask 2457600 MB, but the nodes of partition 'gpu' have at most 2000000"),
])
def test_bad_or_unholdable_asks_are_refused_naming_the_setting(fake_slurm, monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        slurm.check_request(None, 8, None, None, None, None)


def sbatch_asks(**kw) -> list[str]:
    req = array_slurm.check(kw.pop("partition", "cpu"), None, None, kw.pop("cpus", None), 3, 40, 1, **kw)
    cmd = array_slurm.sbatch_command(req, "parlab-grade-x", 40, "/logs", "/course", "/plan")
    return [a for a in cmd if a.startswith(("--array", "--cpus", "--mem", "--reservation", "--qos"))]


def test_grading_array_asks_memory_and_takes_a_throttle_reservation_and_qos(fake_slurm, monkeypatch):
    monkeypatch.setenv("PARLAB_SLURM_CPUS_PER_GPU", "500")  # the launches' setting: the array asks its own
    assert sbatch_asks() == ["--array=0-39", "--cpus-per-task=3", "--mem=4096M"]  # 1G per rank of 3, + 1G
    assert sbatch_asks(mem="6G", throttle=8, reservation="exam", qos="grading") == \
        ["--array=0-39%8", "--cpus-per-task=3", "--mem=6144M", "--reservation=exam", "--qos=grading"]
    with pytest.raises(array_slurm.ArrayError, match="--mem-per-task 128000M but the nodes of partition 'cpu' "
                                                     "have at most 64000 MB"):
        sbatch_asks(mem="125G")
    with pytest.raises(array_slurm.ArrayError, match="--mem-per-task must be a memory size"):
        sbatch_asks(mem="much")


def test_grade_command_line_refuses_slurm_options_without_slurm_and_a_zero_throttle(capsys):
    for argv, said in ((["00-setup", "--qos", "grading"], "--qos ask(s) Slurm for resources: add --slurm"),
                       (["00-setup", "--slurm", "--throttle", "0"], "--throttle must be at least 1")):
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == 2 and said in capsys.readouterr().err
