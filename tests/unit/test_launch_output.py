"""Where rank output goes: text on stdout only, widgets drawn lazily, progress that does not flood."""
import threading

import pytest

from parlab.launch import output

pytestmark = pytest.mark.unit


def test_text_sink_writes_rank_stderr_and_notices_to_stdout(capsys):
    sink = output.TextSink(2)
    sink.line(1, "err", "UserWarning: deprecated")
    sink.line(0, "out", "hello")
    sink.notice("parlab: starting them once more")
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out.splitlines() == ["[rank 1 stderr] UserWarning: deprecated", "[rank 0] hello",
                                         "parlab: starting them once more"]


def test_text_progress_at_most_every_30_seconds(capsys):
    sink = output.TextSink(4)
    for tenth in range(0, 1000):  # 100 s of polls every 0.1 s
        sink.progress(tenth / 10, [0, 2] if tenth > 500 else [])
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["parlab: 30 s, no rank finished yet; waiting for 0, 1, 2, 3",
                     "parlab: 60 s, rank(s) 0, 2 finished; waiting for 1, 3",
                     "parlab: 90 s, rank(s) 0, 2 finished; waiting for 1, 3"]
    sink.progress(200.0, [0, 1, 2, 3])
    assert capsys.readouterr().out == "parlab: 200 s, rank(s) 0, 1, 2, 3 finished; ending the launch\n"


class FakeDisplay:
    def __init__(self):
        self.shown = []

    def __call__(self, obj, **kwargs):
        self.shown.append(obj)


@pytest.fixture
def shown(monkeypatch):
    pytest.importorskip("ipywidgets")
    import IPython.display

    fake = FakeDisplay()
    monkeypatch.setattr(IPython.display, "display", fake)
    return fake.shown


def test_a_quiet_launch_draws_no_rank_grid(shown):
    sink = output.WidgetSink(4)
    sink.finish(3.0)
    assert shown == []


def shown_headings(grid) -> list[str]:
    return [box.children[0].value for box in grid.children if box.layout.display != "none"]


def test_a_rank_area_appears_only_once_that_rank_prints(shown):
    sink = output.WidgetSink(4)
    sink.line(2, "out", "hi from 2")
    assert len(shown) == 1
    grid = shown[0].children[0]
    assert shown_headings(grid) == ["<b>rank 2</b>"]
    cells = grid.children
    sink.line(0, "err", "warning from 0")
    sink.line(2, "out", "again")
    assert shown_headings(grid) == ["<b>rank 0</b>", "<b>rank 2</b>"]
    assert len(shown) == 1  # one box, drawn once
    # The tree is never rebuilt (a rebuilt one showed a rank's line twice in JupyterLab).
    assert grid.children is cells and shown[0].children[0] is grid
    assert [o["text"] for o in sink.areas[2].outputs] == ["hi from 2\n", "again\n"]
    assert [o["name"] for o in sink.areas[0].outputs] == ["stderr"]


def test_widget_progress_is_one_line_updated_in_place(shown):
    sink = output.WidgetSink(2)
    for tenth in range(0, 300):
        sink.progress(tenth / 10, [1] if tenth > 200 else [])
    assert len(shown) == 1
    status = shown[0].children[1]
    assert "29 s, rank(s) 1 finished; waiting for 0" in status.value
    sink.finish(31.0)
    assert "finished after 31 s" in status.value


def test_progress_and_rank_areas_share_one_display(shown):
    sink = output.WidgetSink(2)
    sink.progress(11.0, [])
    grid, status = shown[0].children
    assert shown_headings(grid) == [] and "11 s" in status.value
    sink.line(1, "out", "late first line")
    assert len(shown) == 1 and shown[0].children == (grid, status)  # the grid, then the progress line
    assert shown_headings(grid) == ["<b>rank 1</b>"]


def test_a_launch_without_progress_leaves_no_finished_line(shown):
    sink = output.WidgetSink(2)
    sink.line(0, "out", "quick")
    sink.finish(2.0)
    assert shown[0].children[1].layout.display == "none"


def test_widgets_only_from_the_main_thread(monkeypatch):
    monkeypatch.setattr(output, "widgets_wanted", lambda: True)
    pytest.importorskip("ipywidgets")
    got = []
    worker = threading.Thread(target=lambda: got.append(output.make_sink(2)))
    worker.start()
    worker.join()
    assert isinstance(got[0], output.TextSink)
