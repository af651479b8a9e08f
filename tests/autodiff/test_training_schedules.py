"""Learning-rate schedules and gradient clipping in compiled training, against PyTorch:
each schedule's learning rates against torch.optim.lr_scheduler (and Hugging Face's warmup
schedules), `bz.clip_grad_norm` against torch.nn.utils.clip_grad_norm_ (clipped arrays and the
returned norm), and whole compiled runs (AdamW + warmup-cosine + clipping) against the same
run in torch, on a small MLP and on an imported BERT built from a config."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

import braze as bz
from braze.errors import BrazeError

torch = pytest.importorskip("torch")

_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_small_models.py"
_spec = importlib.util.spec_from_file_location("train_small_models", _EXAMPLE)
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)


def _torch_lrs(make_scheduler, steps: int, base_lr: float = 0.5) -> list[float]:
    """The lr each of `steps` optimizer steps uses under a torch scheduler."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base_lr)
    sched = make_scheduler(opt)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


def _hf(name):
    transformers = pytest.importorskip("transformers")
    return getattr(transformers, name)


SCHEDULES = [
    (bz.StepDecay(step_size=4, gamma=0.5),
     lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=4, gamma=0.5)),
    (bz.WarmupCosine(total_steps=20),
     lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=20)),
    (bz.WarmupCosine(total_steps=20, min_factor=0.1),
     lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=20, eta_min=0.05)),
    (bz.WarmupCosine(total_steps=20, warmup_steps=5),
     lambda o: _hf("get_cosine_schedule_with_warmup")(o, 5, 20)),
    (bz.WarmupLinear(total_steps=20, warmup_steps=5),
     lambda o: _hf("get_linear_schedule_with_warmup")(o, 5, 20)),
    (bz.WarmupLinear(total_steps=20),
     lambda o: torch.optim.lr_scheduler.LinearLR(o, 1.0, 0.0, total_iters=20)),
]


@pytest.mark.parametrize("ours, theirs", SCHEDULES,
                         ids=[repr(s) for s, _ in SCHEDULES])
def test_schedule_matches_torch(ours, theirs):
    """Up to total_steps; after it braze stays at the floor (torch's cosine climbs back up)."""
    want = _torch_lrs(theirs, 21)
    got = [ours.lr(0.5, k) for k in range(21)]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    if not isinstance(ours, bz.StepDecay):
        assert ours.factor(21) == ours.factor(40) == ours.min_factor


def test_schedule_arguments_are_checked():
    with pytest.raises(BrazeError, match="StepDecay: needs step_size >= 1"):
        bz.StepDecay(step_size=0)
    with pytest.raises(BrazeError, match="warmup_steps <= total_steps"):
        bz.WarmupCosine(total_steps=3, warmup_steps=5)
    with pytest.raises(BrazeError, match="total_steps must be an int"):
        bz.WarmupLinear(total_steps=2.5)


@pytest.mark.parametrize("max_norm, norm_type", [(0.5, 2.0), (1e3, 2.0), (0.3, math.inf),
                                                 (0.7, 1.0)])
def test_clip_grad_norm_matches_torch(max_norm, norm_type):
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=s) for s in [(3, 4), (5,), (2, 2, 2)]]
    leaves = [torch.zeros(a.shape, dtype=torch.float64, requires_grad=True) for a in grads]
    for leaf, a in zip(leaves, grads):
        leaf.grad = torch.tensor(a.copy())
    want = torch.nn.utils.clip_grad_norm_(leaves, max_norm, norm_type)
    got = bz.clip_grad_norm(grads, max_norm, norm_type)
    np.testing.assert_allclose(got, want.item(), rtol=1e-12)
    for a, leaf in zip(grads, leaves):
        np.testing.assert_allclose(a, leaf.grad.numpy(), rtol=1e-12)


def test_compiled_mlp_run_matches_torch_adamw_warmup_cosine_clipping():
    """Twelve steps of AdamW with warmup + cosine decay and clipping at a norm the gradients
    exceed: the same losses, norms, learning rates and weights as torch."""
    g = example.mlp_regression()
    params = bz.init_params(g, seed=5)
    feeds = example.synthetic_data(g, 5)
    schedule = bz.WarmupCosine(total_steps=12, warmup_steps=3)
    step = bz.compile_training(g, list(params), bz.AdamW(lr=3e-2, weight_decay=0.1),
                               params=params, schedule=schedule, clip_grad_norm=0.5)
    _, t = example.torch_loss(g, params, feeds)
    topt = torch.optim.AdamW(list(t.values()), lr=3e-2, weight_decay=0.1)
    sched = _hf("get_cosine_schedule_with_warmup")(topt, 3, 12)
    clipped = 0
    for _ in range(12):
        np.testing.assert_allclose(step.lr, topt.param_groups[0]["lr"], rtol=1e-12)
        got = step.step(feeds)
        topt.zero_grad()
        loss, _ = example.torch_loss(g, t, feeds)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(t.values()), 0.5)
        topt.step()
        sched.step()
        np.testing.assert_allclose(got, loss.item(), rtol=1e-5)
        np.testing.assert_allclose(step.grad_norm, norm.item(), rtol=1e-4)
        clipped += step.grad_norm > 0.5
    assert clipped >= 3
    for name, leaf in t.items():
        np.testing.assert_allclose(step.params[name], leaf.detach().numpy(), rtol=1e-4,
                                   atol=1e-5, err_msg=name)


def test_training_arguments_are_checked():
    g = example.mlp_regression()
    params = bz.init_params(g, seed=0)
    with pytest.raises(BrazeError, match="schedule must be"):
        bz.compile_training(g, ["w1"], bz.SGD(lr=0.1), params=params, schedule=0.5)
    with pytest.raises(BrazeError, match="clip_grad_norm must be a number > 0"):
        bz.compile_training(g, ["w1"], bz.SGD(lr=0.1), params=params, clip_grad_norm=-1)
    with pytest.raises(BrazeError, match="AdamW: betas"):
        bz.AdamW(betas=(0.9, 1.0))


def test_imported_bert_run_matches_torch_adamw_warmup_linear_clipping():
    """A tiny BERT built from a config (random weights) with a regression head, imported with
    bz.import_torch: six compiled AdamW steps (linear warmup + decay, clipping) against the
    same steps in torch. Imported linear weights are stored transposed (`<name>.T`)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=16, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)

    class Regression(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = transformers.BertModel(cfg, add_pooling_layer=False)
            self.head = torch.nn.Linear(32, 1)

        def forward(self, ids, y):
            h = self.bert(input_ids=ids).last_hidden_state
            return ((self.head(h.mean(1)) - y) ** 2).mean()

    model = Regression().eval()
    ids, y = torch.randint(0, 50, (2, 8)), torch.randn(2, 1)
    g = bz.import_torch(model, (ids, y))
    leaves = dict(model.named_parameters())
    source = {n: n.removesuffix(".T") for n in g.weights if n.removesuffix(".T") in leaves}
    assert len(source) == len(leaves)
    step = bz.compile_training(g, list(source), bz.AdamW(lr=1e-2),
                               schedule=bz.WarmupLinear(total_steps=6, warmup_steps=2),
                               clip_grad_norm=1.0)
    topt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = _hf("get_linear_schedule_with_warmup")(topt, 2, 6)
    feeds = {"ids": ids.numpy(), "y": y.numpy()}
    for _ in range(6):
        got = step.step(feeds)
        topt.zero_grad()
        loss = model(ids, y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        topt.step()
        sched.step()
        np.testing.assert_allclose(got, loss.item(), rtol=1e-4)
        np.testing.assert_allclose(step.grad_norm, norm.item(), rtol=1e-3)
    for ours, theirs in source.items():
        want = leaves[theirs].detach().numpy()
        np.testing.assert_allclose(step.params[ours], want.T if ours != theirs else want,
                                   rtol=1e-3, atol=1e-4, err_msg=ours)
