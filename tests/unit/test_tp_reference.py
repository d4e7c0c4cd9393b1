"""parlab.parallel.tp_reference: the full layers Lab 03's parallel layers must reproduce."""
import pytest
import torch

from parlab.models.gpt import Block, GPTConfig
from parlab.parallel.tp_reference import randomize_, reference_linear

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def test_reference_linear_depends_on_the_seed_only():
    torch.manual_seed(123)
    a = reference_linear(6, 10, seed=3)
    state = torch.get_rng_state()
    b = reference_linear(6, 10, seed=3)
    assert torch.equal(torch.get_rng_state(), state), "building it moved the global RNG"
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
    c = reference_linear(6, 10, seed=4)
    assert not torch.equal(a.weight, c.weight)
    assert a.bias.abs().min() > 0, "the bias must not be zero, or a bias added on every rank hides"


def test_reference_linear_without_bias_and_bad_sizes():
    assert reference_linear(3, 2, bias=False).bias is None
    with pytest.raises(ValueError, match="out_features must be at least 1"):
        reference_linear(3, 0)


def test_randomize_draws_every_parameter_and_repeats():
    blocks = [randomize_(Block(GPTConfig(d_model=8, n_head=2)), seed=5) for _ in range(2)]
    for (name, p), q in zip(blocks[0].named_parameters(), blocks[1].parameters()):
        assert torch.equal(p, q), name
    ln = blocks[0].ln1
    assert not torch.equal(ln.weight, torch.ones_like(ln.weight)) and ln.bias.abs().min() > 0
