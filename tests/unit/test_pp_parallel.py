"""parlab.parallel's pipeline pieces, in one process: stage split, timed stages,
the activation meter, and the ideal timetables against parlab.cost's formulas."""
import time

import pytest
import torch

from parlab import cost, trace
from parlab.data import get_batch, microbatches
from parlab.models import lm_loss, tiny_gpt
from parlab.parallel.pp_schedule import (PHASES, ideal_schedule, p2p_messages, peak_held, phases,
                                         schedule_order, warmup_forwards)
from parlab.parallel.pp_stages import TimedStage, gpt_stage, held_activations, split_layers, traced_passes

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


def _model(n_layer=5):
    return tiny_gpt(n_layer=n_layer, d_model=16, n_head=2, seq_len=8, tie_weights=False)


def test_split_layers_is_contiguous_and_even():
    assert split_layers(5, 4) == [range(0, 2), range(2, 3), range(3, 4), range(4, 5)]
    assert split_layers(8, 4) == [range(2 * r, 2 * r + 2) for r in range(4)]
    with pytest.raises(ValueError, match="n_layer >= 4"):
        split_layers(3, 4)


def test_stages_chained_equal_the_model_in_loss_and_gradients():
    full, x_y = _model(), get_batch(0, 4, 8)
    ref = lm_loss(full, *x_y)
    ref.backward()
    model = _model()
    stages = [gpt_stage(model, 3, r) for r in range(3)]
    h = x_y[0]
    for s in stages:
        h = s(h)
    loss = stages[-1].loss(h, x_y[1])
    loss.backward()
    assert torch.allclose(loss, ref)
    names = [n for s in stages for n, _ in s.named_parameters()]
    assert sorted(names) == sorted(n for n, _ in full.named_parameters())  # every parameter once
    want = dict(full.named_parameters())
    for s in stages:
        for n, p in s.named_parameters():
            assert torch.allclose(p.grad, want[n].grad, atol=1e-7), n


def test_tied_model_is_refused():
    with pytest.raises(ValueError, match="tie_weights=False"):
        gpt_stage(tiny_gpt(n_layer=2, d_model=16, n_head=2), 2, 0)


def test_held_activations_counts_each_microbatch_exactly_until_its_backward():
    stage = gpt_stage(_model(4), 2, 0)
    micro = [(x.clone(), y) for x, y in microbatches(get_batch(0, 6, 8), 3)]
    with held_activations(*stage.parameters()) as one:
        out = stage(micro[0][0])
        per = one.bytes
    del out
    assert per > 0 and one.bytes == 0  # freed with the graph
    with held_activations(*stage.parameters()) as held:
        outs = [stage(x) for x, _ in micro]
        assert held.bytes == 3 * per
        outs[0].sum().backward()
        assert held.bytes == 2 * per and held.peak == 3 * per


def test_timed_stage_takes_its_time_and_keeps_the_gradient():
    stage = gpt_stage(_model(2), 2, 1)
    timed = TimedStage(stage, 0.05, 0.08)
    inp = torch.randn(1, 8, 16, requires_grad=True)
    trace.reset()
    with traced_passes(timed):
        out = timed(inp)
        out.sum().backward()
    spans = {s.name: s.duration for s in trace.spans()}
    assert 0.05 <= spans["forward"] < 0.2 and 0.08 <= spans["backward"] < 0.3
    ref_inp = inp.detach().clone().requires_grad_()
    stage(ref_inp).sum().backward()
    assert torch.allclose(inp.grad, ref_inp.grad)


TIMETABLES = [(schedule, v, p, m)
              for schedule, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 4))
              for p, m in ((2, 4), (4, 4), (4, 8), (3, 9), (4, 3), (1, 2))
              if schedule != "interleaved" or m % p == 0]


@pytest.mark.parametrize("schedule,v,p,m", TIMETABLES)
def test_ideal_timetables_give_the_formula(schedule, v, p, m):
    table = ideal_schedule(p, m, schedule, v=v, forward=1, backward=2)
    spans = [trace.Span(s["kind"], s["rank"], s["start"], s["end"]) for s in table]
    assert trace.bubble_fraction(spans) == pytest.approx(cost.bubble_fraction(p, m, schedule, v=v))
    assert len(table) == 2 * p * m * v
    for r in range(p):
        # the memory formula, read off the timetable: activations held from forward to backward
        assert peak_held(table, r, v) == cost.activations_held(p, m, schedule, r, v), r
        cut = phases(p, m, r, schedule, v)
        assert tuple(cut) == PHASES
        assert [op[0] for op in cut["warm-up"]] == ["F"] * warmup_forwards(p, m, r, schedule, v)
        assert [op[0] for op in cut["steady"]] == ["F", "B"] * (m * v - len(cut["warm-up"]))
        assert [op[0] for op in cut["cool-down"]] == ["B"] * len(cut["warm-up"])
        assert [op for ops in cut.values() for op in ops] == schedule_order(p, m, r, schedule, v)


@pytest.mark.parametrize("p,m", [(4, 8), (4, 3), (2, 1)])
def test_1f1b_order_warms_up_then_alternates(p, m):
    for r in range(p):
        order = schedule_order(p, m, r, "1f1b")
        w = warmup_forwards(p, m, r)
        assert w == min(p - r - 1, m) == cost.pipeline_warmup(p, r) if m >= p else w == min(p - r - 1, m)
        kinds = "".join(k for k, _, _ in order)
        assert kinds.startswith("F" * w) and kinds.count("F") == kinds.count("B") == m
        live = peak = 0
        for k in kinds:
            live += 1 if k == "F" else -1
            peak = max(peak, live)
        assert peak == cost.activations_held(p, m, "1f1b", r)


def test_p2p_messages_counts_cross_rank_boundaries():
    for p, m, v in ((4, 8, 1), (4, 8, 2), (2, 4, 3), (1, 5, 1)):
        stages = [(c * p + r) for c in range(v) for r in range(p)]  # virtual stage -> rank r
        crossings = sum(1 for s in range(len(stages) - 1) if s % p != (s + 1) % p)
        assert p2p_messages(p, m, v) == 2 * m * crossings
    with pytest.raises(ValueError, match="multiple of p"):
        ideal_schedule(4, 6, "interleaved", v=2)
