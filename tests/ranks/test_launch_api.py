"""The public launch API in a fresh interpreter, plain results, headless stderr, hidden frames."""
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.distributed as dist

import parlab

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(240)]

HERE = os.path.dirname(os.path.abspath(__file__))  # this module's folder: the fresh interpreter imports it by name


def test_names_work_in_a_fresh_interpreter():
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {HERE!r})
        import parlab.launch.report as report           # a submodule, imported by path with "as"
        from parlab.launch.job import Job               # from a submodule
        from parlab import launch                       # the callable package
        import parlab
        from parlab.launch import LaunchError, WorkerError, device
        import test_launch_api as t
        assert parlab.launch is launch and callable(launch) and report.explain and Job
        assert launch(t.rank_and_world, nproc=2) == [(0, 2), (1, 2)]
        assert parlab.launch.launch(t.rank_and_world, nproc=2) == [(0, 2), (1, 2)]
        assert parlab.WorkerError is WorkerError and str(device()) == "cpu"
        print("fresh ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=200,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0 and "fresh ok" in proc.stdout, proc.stdout + proc.stderr


def rank_and_world():
    return dist.get_rank(), dist.get_world_size()


# ----------------------------------------------------------------- plain results


class Evil:
    """Unpickling this runs code: it creates the file named in its argument."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def return_evil(path):
    return {"ok": torch.ones(1), "evil": Evil(path)}


def bypass_the_check(path):
    # A hostile answer replaces the rank's encoder so the result file holds a
    # pickle that would run code; the caller must still refuse to run it.
    import pickle

    from parlab.launch import results

    results.encode_plain = lambda value: pickle.dumps(Evil(path))
    return 1


class SubTensor(torch.Tensor):
    pass


def return_subtensor():
    return torch.ones(2).as_subclass(SubTensor)


def return_plain():
    return {"t": torch.arange(3) * dist.get_rank(), "list": [1, 2.0, "x", None, b"y"], 5: (True,)}


def test_plain_results_come_back_as_plain_data():
    out = parlab.launch(return_plain, nproc=2, plain_results=True)
    assert torch.equal(out[1]["t"], torch.tensor([0, 1, 2])) and out[0][5] == (True,)
    assert type(out[0]["t"]) is torch.Tensor


def test_plain_results_refuse_an_object_that_would_run_code(tmp_path):
    path = tmp_path / "ran"
    with pytest.raises(parlab.WorkerError) as info:
        parlab.launch(return_evil, args=(str(path),), nproc=2, plain_results=True)
    assert "test_launch_api.Evil" in str(info.value) and "plain_results does not allow" in str(info.value)
    assert info.value.phase == "result"
    with pytest.raises(parlab.LaunchError, match="could not be loaded"):
        parlab.launch(bypass_the_check, args=(str(path),), nproc=2, plain_results=True)
    assert not path.exists(), "a rank's result ran code in the caller"


def test_plain_results_refuse_a_tensor_subclass():
    with pytest.raises(parlab.WorkerError, match="SubTensor"):
        parlab.launch(return_subtensor, nproc=2, plain_results=True)


# ----------------------------------------------------------------- headless stderr


def chatty_and_warns(n):
    warnings.warn("a deprecation warning printed on the rank")
    print("to stderr", file=sys.stderr)
    for i in range(n):
        print(f"line {i}")
    return n


def test_a_correct_answer_writes_nothing_to_stderr_headless(capfd, monkeypatch):
    monkeypatch.setenv("PARLAB_MAX_LINES", "20")
    monkeypatch.setenv("PARLAB_OUTPUT", "text")  # what nbclient/nbgrader get
    assert parlab.launch(chatty_and_warns, args=(100,), nproc=2) == [100, 100]
    captured = capfd.readouterr()
    assert captured.err == "", captured.err
    assert "[rank 1 stderr]" in captured.out and "a deprecation warning" in captured.out
    assert "lines from rank 0 not shown" in captured.out


# ----------------------------------------------------------------- hidden frames


def raise_on_every_rank():
    raise NotImplementedError("not written yet")


def test_only_the_public_function_frame_of_parlab_is_in_the_traceback():
    try:
        parlab.launch(raise_on_every_rank, nproc=2)
    except parlab.WorkerError as exc:
        tb, frames = exc.__traceback__, []
        while tb is not None:
            frames.append((os.path.basename(tb.tb_frame.f_code.co_filename), tb.tb_frame.f_code.co_name))
            tb = tb.tb_next
    else:
        pytest.fail("expected a WorkerError")
    parlab_frames = [f for f in frames if f[0] != os.path.basename(__file__)]
    assert parlab_frames[-1] == ("__init__.py", "launch"), frames  # raised from the public function
    assert all(f[1] in ("launch", "__call__") for f in parlab_frames), frames  # no _Job._fail / _wait
