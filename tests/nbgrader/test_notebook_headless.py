"""A notebook executed headless (as nbgrader does): launch, the magic, and errors."""
import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = [pytest.mark.nbgrader, pytest.mark.timeout(300)]

CELLS = [
    "import parlab, torch, torch.distributed as dist",
    # 2: a launch with live output and results
    "def f(x):\n"
    "    t = torch.ones(1) * (dist.get_rank() + 1)\n"
    "    dist.all_reduce(t)\n"
    "    print('hi from', dist.get_rank())\n"
    "    return t.item() * x\n"
    "parlab.launch(f, (2,), nproc=2)",
    "%load_ext parlab",
    # 4: the magic, with a final expression
    "%%torchrun -n 2\n"
    "t = torch.ones(2) * rank\n"
    "dist.all_reduce(t)\n"
    "print('rank', rank, 'of', world_size, device)\n"
    "t.tolist()",
    # 5: a failing function points at this cell's own line
    "def bad():\n"
    "    x = 1\n"
    "    raise RuntimeError('bad cell')\n"
    "parlab.launch(bad, nproc=2)",
    # 6: a failing magic cell, using a notebook variable
    "%%torchrun -n 2 --timeout 60\n"
    "scale = f.__name__\n"
    "if rank == 1:\n"
    "    raise KeyError(scale)",
    # 7, 8: a notebook variable named like a builtin still travels
    "input = torch.arange(3.0)",
    "%%torchrun -n 2\n"
    "input * rank",
    # 9: a syntax error points at the magic cell's line
    "%%torchrun -n 2\n"
    "x = 1\n"
    "y = (x +\n",
]


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    NotebookClient(nb, timeout=200, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path_factory.mktemp("nb"))}}).execute()
    return nb.cells


def _text(cell, output_type=None):
    parts = []
    for out in cell.outputs:
        if output_type and out.output_type != output_type:
            continue
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            parts.append(out.data.get("text/plain", ""))
        elif out.output_type == "error":
            parts.append(out.ename + ": " + out.evalue + "\n" + "\n".join(out.traceback))
    return "\n".join(parts)


def test_launch_streams_rank_output_and_returns_results(executed):
    assert "[rank 0] hi from 0" in _text(executed[1], "stream")
    assert "[rank 1] hi from 1" in _text(executed[1], "stream")
    assert _text(executed[1], "execute_result") == "[6.0, 6.0]"


def test_magic_runs_the_cell_on_every_rank(executed):
    assert "[rank 1] rank 1 of 2 cpu" in _text(executed[3], "stream")
    assert _text(executed[3], "execute_result") == "[[1.0, 1.0], [1.0, 1.0]]"


def test_worker_error_points_at_the_notebook_cell(executed):
    err = [o for o in executed[4].outputs if o.output_type == "error"][0]
    assert err.ename == "WorkerError"
    assert "rank 0 failed: RuntimeError: bad cell" in err.evalue or "failed: RuntimeError: bad cell" in err.evalue
    assert "Cell In[5], line 3, in bad" in err.evalue
    assert "raise RuntimeError('bad cell')" in err.evalue


def test_magic_error_points_at_the_magic_cell(executed):
    err = [o for o in executed[5].outputs if o.output_type == "error"][0]
    assert err.ename == "WorkerError"
    assert "rank 1 failed: KeyError: 'f'" in err.evalue
    assert "Cell In[6], line 3" in err.evalue


def test_widgets_mode_puts_each_rank_in_its_own_output_area(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import os; os.environ['PARLAB_OUTPUT'] = 'widgets'\n"
                                  "import parlab, torch.distributed as dist"),
        nbformat.v4.new_code_cell("def f():\n    print('hello from', dist.get_rank())\n    return 1\n"
                                  "parlab.launch(f, nproc=2)"),
    ]
    NotebookClient(nb, timeout=200, kernel_name="python3", store_widget_state=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    kinds = [o.output_type for o in nb.cells[1].outputs]
    assert kinds == ["display_data", "execute_result"], kinds  # no plain-text rank lines
    assert "application/vnd.jupyter.widget-view+json" in nb.cells[1].outputs[0].data
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    outputs = [m["state"]["outputs"] for m in state.values() if m["model_name"] == "OutputModel"]
    assert len(outputs) == 2
    texts = ["".join(o.get("text", "") for o in area) for area in outputs]
    assert sorted(texts) == ["hello from 0\n", "hello from 1\n"]


def test_magic_sends_variables_named_like_builtins(executed):
    assert _text(executed[7], "execute_result") == "[tensor([0., 0., 0.]), tensor([0., 1., 2.])]"


def test_magic_syntax_error_points_at_the_cell(executed):
    err = [o for o in executed[8].outputs if o.output_type == "error"][0]
    assert err.ename == "SyntaxError"
    assert "(<torchrun-cell-9>, line 2)" in err.evalue  # line 2 of the cell body, under %%torchrun
