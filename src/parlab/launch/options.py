"""A launch's options, checked once, and the checks of what it sends to the ranks.

``LaunchOptions`` is the one home of every option: its default, its type, its
check and the message a bad value gets.  ``launch``, ``run_script``, the
``%%torchrun`` magic and ``start`` (a warm group) each build one, and
everything below them (``Job``, ``WarmGroup``, the Slurm request) takes it as
it is: nothing is checked twice, so a bad value gets the same sentence from
every entry.  (torchtitan passes its ``JobConfig`` down the same way.)
"""
from __future__ import annotations

import dataclasses
import math
import os
import types
from collections.abc import Mapping

from . import pickling, slurm
from .errors import LaunchError
from .numbers import whole
from .tasks import CallTask, CellTask

#: Default seconds before a launch is stopped.  It suits the CPU labs (a cold
#: 4-rank start costs about 10 s on 2 cores) and stays well below the course's
#: nbgrader cell timeout, so a hang surfaces as LaunchTimeout, not a killed cell.
DEFAULT_TIMEOUT = 120.0
BACKENDS = ("gloo", "nccl", "mpi")
#: numpy takes seeds from 0 to 2**32 - 1, and rank r is seeded with seed + r.
SEEDS = 2 ** 32
#: The options that ask Slurm for resources: only a launch with scheduler="slurm" takes them.
SLURM_ONLY = ("gpus", "partition", "account", "time_limit")


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """Every option of a launch, checked, with its defaults filled in (see ``launch``'s docstring).

    Building one checks it: a bad value raises here, before any process
    starts or any file is written.  After ``__post_init__`` the fields hold
    the values the launch uses: ``nproc`` and ``backend`` chosen, ``timeout``
    in seconds, ``env`` a read-only mapping, ``debug`` a bool (PARLAB_DEBUG
    read once), ``scheduler`` "local" or "slurm", ``nnodes`` an int, and for
    a Slurm launch ``request`` the ask that ``sinfo`` confirmed (``backend``
    is then "auto": the node picks NCCL when it has the GPUs).
    """

    nproc: int | None = None
    backend: str | None = None
    timeout: float | None = None
    env: Mapping[str, str] | None = None
    debug: bool | None = None
    seed: int = 0
    plain_results: bool = False
    _: dataclasses.KW_ONLY
    nnodes: int | None = None
    scheduler: str | None = None
    gpus: int | None = None
    partition: str | None = None
    account: str | None = None
    time_limit: float | None = None
    request: slurm.SlurmRequest | None = dataclasses.field(default=None, init=False, compare=False)

    def __post_init__(self):
        checked = {"scheduler": slurm.choose_scheduler(self.scheduler)}
        if checked["scheduler"] == "slurm":
            checked["backend"] = check_backend_name(self.backend)
            checked["nproc"], checked["request"] = slurm.check_request(
                self.nproc, self.gpus, self.nnodes, self.partition, self.account, self.time_limit)
            checked["nnodes"] = checked["request"].nnodes
        else:
            given = [k for k in SLURM_ONLY if getattr(self, k) is not None]
            if given:
                raise ValueError(f"{', '.join(given)} ask(s) Slurm for resources: pass scheduler='slurm' too")
            checked["nnodes"] = slurm.check_nnodes(self.nnodes)
            checked["nproc"], checked["backend"] = choose_backend(self.nproc, self.backend)
            if checked["nproc"] % checked["nnodes"]:
                raise ValueError(f"nproc={checked['nproc']} must split evenly over nnodes={checked['nnodes']}")
        checked["timeout"] = check_timeout(self.timeout)
        checked["env"] = types.MappingProxyType(check_env(self.env))
        checked["debug"] = check_debug(self.debug)
        checked["seed"] = check_seed(self.seed, checked["nproc"])
        checked["plain_results"] = check_flag("plain_results", self.plain_results)
        for name, value in checked.items():
            object.__setattr__(self, name, value)  # frozen: set once, here

    def with_timeout(self, timeout) -> float:
        """The timeout of one warm cell: ``timeout`` checked, or this group's when None."""
        return self.timeout if timeout is None else check_timeout(timeout)


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def choose_backend(nproc, backend):
    """Validate (nproc, backend) and fill in the defaults; raises before anything starts."""
    gpus = None
    if nproc is None:
        gpus = _visible_gpus()
        nproc = gpus or 2
    nproc = whole("nproc", nproc, 1, "a whole number of ranks")
    if backend is None:
        gpus = _visible_gpus() if gpus is None else gpus
        backend = "nccl" if 0 < nproc <= gpus else "gloo"
    if not isinstance(backend, str) or backend.lower() not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)} "
                         "(gloo runs everywhere, nccl needs one GPU per rank)")
    backend = backend.lower()
    if backend == "nccl":
        gpus = _visible_gpus() if gpus is None else gpus
        if gpus == 0:
            raise LaunchError("backend='nccl' needs GPUs, but this machine has none visible "
                              "(torch.cuda.is_available() is False). Use backend='gloo' to run on CPU.")
        if nproc > gpus:
            raise ValueError(f"backend='nccl' needs one GPU per rank: nproc={nproc} but only {gpus} "
                             f"GPU(s) are visible. Use nproc<={gpus}, or backend='gloo' for CPU ranks.")
    if backend == "mpi":
        import torch.distributed as dist

        if not dist.is_mpi_available():
            raise LaunchError("backend='mpi' is not available in this torch build (it needs torch "
                              "compiled with MPI). Use backend='gloo' on CPU or 'nccl' on GPUs.")
    return nproc, backend


def check_backend_name(backend) -> str:
    """The backend of a Slurm launch: as given, or "auto" (the node picks NCCL when it has the GPUs)."""
    if backend is None or backend == "auto":
        return "auto"
    if not isinstance(backend, str) or backend.lower() not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    return backend.lower()


def check_timeout(timeout) -> float:
    source = "timeout"
    if timeout is None:
        source, timeout = "PARLAB_TIMEOUT", os.environ.get("PARLAB_TIMEOUT", DEFAULT_TIMEOUT)
        try:
            timeout = float(timeout)
        except ValueError:
            pass
    if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
            or not math.isfinite(timeout) or timeout <= 0):
        raise ValueError(f"{source} must be a positive, finite number of seconds, got {timeout!r}")
    return float(timeout)


def check_env(env) -> dict:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise TypeError(f"env must be a dict of environment variables, got {type(env).__name__}")
    bad = [k for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise TypeError(f"env keys and values must be strings; not so for {bad!r}: "
                        "write e.g. env={'MY_FLAG': '1'}")
    return dict(env)


def check_seed(seed, nproc: int) -> int:
    """The base seed: a whole number such that every rank's ``seed + rank`` is a seed numpy takes."""
    seed = whole("seed", seed, 0)
    if seed > SEEDS - nproc:
        raise ValueError(f"seed must be at most {SEEDS - nproc} for {nproc} rank(s), got {seed}: rank r "
                         "is seeded with seed + r, and numpy takes seeds from 0 to 2**32 - 1")
    return seed


def check_flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def check_debug(debug) -> bool:
    """The diagnostic mode: ``debug`` when given, else whether PARLAB_DEBUG is set (and not 0)."""
    if debug is None:
        return os.environ.get("PARLAB_DEBUG", "") not in ("", "0")
    if not isinstance(debug, bool):
        raise TypeError(f"debug must be True, False or None (None: PARLAB_DEBUG decides), got {debug!r}")
    return debug


def check_call(fn, args, kwargs) -> CallTask:
    if not callable(fn):
        raise TypeError(f"launch() needs a function to run on each rank, got {type(fn).__name__}")
    if isinstance(args, (str, bytes)) or not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple of positional arguments, got {type(args).__name__}: "
                        "for a single argument write args=(x,)")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict, got {type(kwargs).__name__}")
    return CallTask(fn, tuple(args), dict(kwargs or {}))


def pickle_task(task) -> bytes:
    try:
        return pickling.dumps(task)
    except Exception as exc:  # noqa: BLE001 - name the culprit instead
        culprit = _find_unpicklable(task)
        raise TypeError(
            f"{culprit} cannot be sent to the ranks because it cannot be pickled "
            f"({type(exc).__name__}: {exc}). Pass plain data (tensors, numbers, lists, dicts) and "
            "create locks, files, generators, process groups or CUDA state inside the function."
        ) from None


def _find_unpicklable(task) -> str:
    if isinstance(task, CallTask):
        parts = [("the function", task.fn)]
        parts += [(f"argument {i} ({type(a).__name__})", a) for i, a in enumerate(task.args)]
        parts += [(f"keyword argument {k!r} ({type(v).__name__})", v) for k, v in task.kwargs.items()]
    elif isinstance(task, CellTask):
        parts = [(f"notebook variable {k!r} ({type(v).__name__})", v) for k, v in task.names.items()]
    else:
        parts = []
    for what, obj in parts:
        try:
            pickling.dumps(obj)
        except Exception:  # noqa: BLE001
            return what
    return "the task"


def notebook_sources() -> tuple[dict, dict]:
    """Source text and ``Cell In[n]`` labels of this kernel's cells, for remote tracebacks."""
    import linecache

    labels = {}
    try:
        from IPython import get_ipython

        ip = get_ipython()
        mapping = getattr(getattr(ip, "compile", None), "_filename_map", None) or {}
        labels = {name: f"Cell In[{n}]" for name, n in mapping.items()}
    except ImportError:
        pass
    sources = {}
    for name in labels:
        entry = linecache.cache.get(name)
        if entry and entry[2]:
            sources[name] = "".join(entry[2])
    return sources, labels
