"""parlab.models: seeding, module names, tied weights, causality, training."""
import pytest
import torch
import torch.nn.functional as F

from parlab.data import get_batch
from parlab.models import GPT, GPTConfig, build, lm_loss, logits_of, tiny_gpt

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

NAMES = ["gpt", "llama", "gpt2"]


def _state(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_weights_different_seed_different(name):
    a, b, c = build(name, seed=0), build(name, seed=0), build(name, seed=1)
    sa, sb, sc = _state(a), _state(b), _state(c)
    assert all(torch.equal(sa[n], sb[n]) for n in sa)
    random_ones = [n for n in sa if sa[n].std() > 0]  # skip norms and zero biases
    assert random_ones and all(not torch.equal(sa[n], sc[n]) for n in random_ones)


@pytest.mark.parametrize("name", NAMES)
def test_building_leaves_global_rng_alone(name):
    before = torch.get_rng_state()
    build(name, seed=3)
    assert torch.equal(before, torch.get_rng_state())


def test_init_weights_resets_to_seed():
    m = tiny_gpt(seed=5)
    want = _state(m)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(1.0)
    m.init_weights(5)
    assert all(torch.equal(want[n], p) for n, p in m.named_parameters())


def test_module_names_are_addressable():
    m = tiny_gpt(n_layer=2)
    for i in range(2):
        for sub in ["attn.q", "attn.k", "attn.v", "attn.o", "mlp.up", "mlp.down", "ln1", "ln2"]:
            assert isinstance(m.get_submodule(f"blocks.{i}.{sub}"), torch.nn.Module)
    assert isinstance(m.get_submodule("blocks.0.attn.q"), torch.nn.Linear)
    with pytest.raises(AttributeError):
        m.get_submodule("blocks.2.attn.q")
    llama = build("llama")
    assert isinstance(llama.get_submodule("model.layers.1.self_attn.q_proj"), torch.nn.Linear)


def test_tied_weights_are_one_parameter():
    m = tiny_gpt()
    assert m.lm_head.weight is m.tok_emb.weight
    names = [n for n, _ in m.named_parameters()]
    assert "tok_emb.weight" in names and "lm_head.weight" not in names
    untied = tiny_gpt(tie_weights=False)
    assert untied.lm_head.weight is not untied.tok_emb.weight
    assert "lm_head.weight" in [n for n, _ in untied.named_parameters()]
    gpt2 = build("gpt2")
    assert gpt2.lm_head.weight is gpt2.transformer.wte.weight


def test_param_count_matches_textbook_formula():
    # h·V + L(12h² + 13h) + 2h (Ultra-Scale Playbook), plus s·h learned positions
    for L, h, s in [(4, 64, 32), (2, 32, 16)]:
        m = GPT(GPTConfig(n_layer=L, d_model=h, seq_len=s))
        V = 256
        assert m.num_params() == h * V + L * (12 * h * h + 13 * h) + 2 * h + s * h
    # untied: one more V·h matrix
    assert tiny_gpt(tie_weights=False).num_params() == tiny_gpt().num_params() + 256 * 64


def test_forward_shapes_and_loss():
    m = tiny_gpt()
    x, y = get_batch(0, 4)
    logits, loss = m(x, y)
    assert logits.shape == (4, 32, 256) and loss.shape == ()
    assert m(x)[1] is None
    assert torch.allclose(loss, lm_loss(m, x, y))
    with pytest.raises(ValueError, match="seq_len"):
        m(torch.zeros(1, 33, dtype=torch.long))


@pytest.mark.parametrize("name", NAMES)
def test_causal(name):
    m = build(name).eval()
    x, _ = get_batch(0, 2)
    x2 = x.clone()
    x2[:, 10] = (x2[:, 10] + 1) % 256
    with torch.no_grad():
        a, b = logits_of(m, x), logits_of(m, x2)
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, 10:], b[:, 10:], atol=1e-3)  # the change is seen later


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_lm_loss_uses_already_shifted_targets(name):
    m = build(name)
    x, y = get_batch(0, 2)
    logits = logits_of(m, x)
    # Hugging Face shifts labels itself: labels=x scores logits[:, :-1] against x[:, 1:] == y[:, :-1]
    hf = m(input_ids=x, labels=x).loss
    ours_trimmed = F.cross_entropy(logits[:, :-1].reshape(-1, 256), y[:, :-1].reshape(-1))
    assert torch.allclose(hf, ours_trimmed, atol=1e-6)
    # passing our shifted y as labels would shift twice: a different (wrong) loss
    assert not torch.allclose(m(input_ids=x, labels=y).loss, lm_loss(m, x, y), atol=1e-3)


def test_build_rejects_unknown_name():
    with pytest.raises(ValueError, match="unknown model"):
        build("bert")


@pytest.mark.parametrize("name,opt,lr", [("gpt", "adamw", 1e-2), ("gpt", "sgd", 0.5),
                                         ("llama", "adamw", 1e-2), ("gpt2", "adamw", 1e-2)])
def test_model_trains_on_corpus(name, opt, lr):
    m = build(name)
    held_x, held_y = get_batch(10_000, 16, seed=1)  # a batch never trained on
    with torch.no_grad():
        before = lm_loss(m, held_x, held_y).item()
    o = (torch.optim.AdamW if opt == "adamw" else torch.optim.SGD)(m.parameters(), lr=lr)
    for step in range(20):
        x, y = get_batch(step, 16)
        loss = lm_loss(m, x, y)
        o.zero_grad()
        loss.backward()
        o.step()
    with torch.no_grad():
        after = lm_loss(m, held_x, held_y).item()
    assert before == pytest.approx(5.55, abs=0.1)  # about ln 256 at init
    assert after < 0.9 * before
