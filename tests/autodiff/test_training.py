"""Compiled training: the optimizers against torch.optim on the same weights and gradients,
the worked example's models (MLP, one-layer encoder + head) against torch.autograd at step 0
and with a falling loss, a whole training run against the same run in PyTorch, the one weight
region and the shared arena, and the errors."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import braze as bz
from braze.errors import BrazeError

_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_small_models.py"
_spec = importlib.util.spec_from_file_location("train_small_models", _EXAMPLE)
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)

OPTIMIZERS = [
    (bz.SGD(lr=0.1), "SGD", dict(lr=0.1)),
    (bz.SGD(lr=0.05, momentum=0.9, weight_decay=0.01), "SGD",
     dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
    (bz.SGD(lr=0.05, momentum=0.8, dampening=0.3), "SGD",
     dict(lr=0.05, momentum=0.8, dampening=0.3)),
    (bz.SGD(lr=0.05, momentum=0.9, nesterov=True), "SGD",
     dict(lr=0.05, momentum=0.9, nesterov=True)),
    (bz.Adam(lr=1e-2), "Adam", dict(lr=1e-2)),
    (bz.Adam(lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1), "Adam",
     dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    (bz.AdamW(), "AdamW", {}),
    (bz.AdamW(lr=3e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.3), "AdamW",
     dict(lr=3e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.3)),
]


@pytest.mark.parametrize("ours, torch_name, kwargs", OPTIMIZERS,
                         ids=[f"{t}-{i}" for i, (_, t, _) in enumerate(OPTIMIZERS)])
def test_optimizer_matches_torch_optim(ours, torch_name, kwargs):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    weights = rng.normal(size=40)
    tw = torch.tensor(weights.copy(), requires_grad=True)
    topt = getattr(torch.optim, torch_name)([tw], **kwargs)
    state = ours.init(weights)
    for _ in range(6):
        grads = rng.normal(size=40)
        tw.grad = torch.tensor(grads.copy())
        topt.step()
        ours.apply(weights, grads, state)
        np.testing.assert_allclose(weights, tw.detach().numpy(), rtol=1e-12, atol=1e-14)
    assert not np.allclose(weights, 0)


def test_optimizer_arguments_are_checked():
    with pytest.raises(BrazeError, match="lr must be >= 0"):
        bz.SGD(lr=-1.0)
    with pytest.raises(BrazeError, match="nesterov needs momentum"):
        bz.SGD(lr=0.1, nesterov=True)
    with pytest.raises(BrazeError, match="betas"):
        bz.Adam(betas=(0.9, 1.5))


@pytest.mark.parametrize("build", [example.mlp_regression, example.encoder_regression])
def test_step0_gradients_match_torch(build):
    pytest.importorskip("torch")
    g = build()
    params = bz.init_params(g, seed=1)
    assert example.max_grad_error(g, params, example.synthetic_data(g, 1)) < 1e-5


@pytest.mark.parametrize("build, optimizer", [
    (example.mlp_regression, bz.Adam(lr=1e-2)),
    (example.mlp_regression, bz.SGD(lr=0.05, momentum=0.9)),
    (example.encoder_regression, bz.Adam(lr=3e-3)),
])
def test_loss_falls(build, optimizer):
    losses, step = example.train(build(), optimizer, steps=80)
    assert losses[-1] < 0.2 * losses[0]
    assert step.steps == 80


def test_training_run_matches_torch():
    """Ten SGD-with-momentum steps on the MLP: the same losses and weights as torch.optim."""
    torch = pytest.importorskip("torch")
    g = example.mlp_regression()
    params = bz.init_params(g, seed=2)
    feeds = example.synthetic_data(g, 2)
    step = bz.compile_training(g, list(params), bz.SGD(lr=0.05, momentum=0.9), params=params)
    _, t = example.torch_loss(g, params, feeds)
    topt = torch.optim.SGD(list(t.values()), lr=0.05, momentum=0.9)
    for _ in range(10):
        got = step.step(feeds)
        topt.zero_grad()
        loss, _ = example.torch_loss(g, t, feeds)
        loss.backward()
        topt.step()
        np.testing.assert_allclose(got, loss.item(), rtol=1e-5)
    for name, leaf in t.items():
        np.testing.assert_allclose(step.params[name], leaf.detach().numpy(), rtol=1e-4,
                                   atol=1e-6, err_msg=name)


def test_one_weight_region_and_one_arena():
    """The params are views of one flat array that both executables read without a copy: an
    optimizer step is visible to eval with no update call, and the forward and backward
    programs plan into the front of one buffer."""
    g = example.mlp_regression()
    params = bz.init_params(g, seed=3)
    feeds = example.synthetic_data(g, 3)
    step = bz.compile_training(g, list(params), bz.SGD(lr=0.1), params=params)
    (flat,) = step.region.flat.values()
    assert flat.size == sum(v.size for v in params.values())
    assert all(np.shares_memory(view, flat) for view in step.params.values())
    before = {k: v.copy() for k, v in step.params.items()}
    step.step(feeds)
    moved = {k: -0.1 * step.grads[k] for k in before}
    for k, v in step.params.items():
        np.testing.assert_allclose(v - before[k], moved[k], rtol=1e-5, atol=1e-7)
    (loss,) = step.eval(feeds)
    np.testing.assert_allclose(loss, bz.interpret(g, feeds, dict(step.params))[0], rtol=1e-5)
    fwd, bwd = step.forward.program(feeds | step.params), step.backward.program(
        feeds | step.params)
    assert np.shares_memory(fwd.arena, step.arena.buffer)
    assert np.shares_memory(bwd.arena, step.arena.buffer)
    mem = step.memory()
    assert mem.arena == max(mem.forward_peak, mem.backward_peak) > 0
    assert mem.weights == flat.nbytes


def test_backward_graph_is_fused_and_frozen_params_stay_params():
    g = example.encoder_regression()
    params = bz.init_params(g, seed=4)
    trained = ["head.weight", "head.bias", "layer0.ffn.down.weight"]
    step = bz.compile_training(g, trained, bz.Adam(lr=1e-2), params=params)
    counts = step.backward.graph.op_counts()
    assert counts.get("fused_matmul_bias_act", 0) >= 1
    assert "fused" in step.report.summary_line()
    kept = {n.op.name for n in step.backward.graph.params}
    assert "layer0.ffn.up.weight" in kept and not kept & set(trained)
    assert set(trained) <= {n.op.name for n in step.backward.graph.inputs}
    frozen = params["layer0.ffn.up.weight"].copy()
    feeds = example.synthetic_data(g, 4)
    losses = [step.step(feeds) for _ in range(20)]
    assert losses[-1] < losses[0]
    np.testing.assert_array_equal(params["layer0.ffn.up.weight"], frozen)
    assert set(step.params) == set(trained)


def test_errors_name_the_problem():
    g = example.mlp_regression()
    params = bz.init_params(g, seed=0)
    with pytest.raises(BrazeError, match="no param.*'w9'"):
        bz.compile_training(g, ["w1", "w9"], bz.SGD(lr=0.1), params=params)
    with pytest.raises(BrazeError, match="'b2'.*no initial value"):
        bz.compile_training(g, ["w1", "b2"], bz.SGD(lr=0.1),
                            params={k: v for k, v in params.items() if k != "b2"})
    with pytest.raises(BrazeError, match="optimizer must be"):
        bz.compile_training(g, ["w1"], "sgd", params=params)
    step = bz.compile_training(g, ["w1"], bz.SGD(lr=0.1), params=params)
    with pytest.raises(BrazeError, match="feeds name trained params"):
        step.step({**example.synthetic_data(g), "w1": params["w1"]})


def _sweep_mlp():
    g = bz.Graph("mlp")
    x, y = g.input("x", bz.Shape(("batch", 4))), g.input("y", bz.Shape(("batch", 1)))
    out = g.mm(g.tanh(g.mm(x, g.param("w1", bz.Shape((4, 8))))), g.param("w2", bz.Shape((8, 1))))
    g.set_outputs([g.mean(g.square(g.sub(out, y)))])
    return g


def test_params_cannot_be_rebound_only_assigned_into():
    """Found by a held-out sweep: `step.params["w1"] = new` replaced the dict entry; the step
    then fed the new array (never updated) while the optimizer updated the region: w1 froze
    silently and the loss still fell."""
    g = _sweep_mlp()
    step = bz.compile_training(g, ["w1", "w2"], bz.SGD(lr=0.1), params=bz.init_params(g, 0))
    feeds = {"x": np.ones((3, 4), np.float32), "y": np.zeros((3, 1), np.float32)}
    with pytest.raises(BrazeError, match=r"assign into it instead"):
        step.params["w1"] = np.full((4, 8), 0.5, np.float32)
    with pytest.raises(BrazeError, match=r"cannot be replaced"):
        step.grads["w1"] = np.zeros((4, 8), np.float32)
    step.params["w1"][...] = 0.5                      # the supported way
    step.step(feeds)
    assert not np.allclose(step.params["w1"], 0.5)    # trained from the assigned value
    assert sorted(step.params) == ["w1", "w2"] and len(step.grads) == 2


def test_feeds_that_are_no_mapping_are_a_clear_error():
    g = _sweep_mlp()
    step = bz.compile_training(g, ["w1", "w2"], bz.SGD(lr=0.1), params=bz.init_params(g, 0))
    xs = [np.ones((3, 4), np.float32), np.zeros((3, 1), np.float32)]
    for call in (step.step, step.gradients, step.eval):
        with pytest.raises(BrazeError, match=r"feeds must map input names.*inputs: x, y"):
            call(xs)


@pytest.mark.parametrize("make", [lambda: bz.SGD(lr="0.1"), lambda: bz.Adam(eps=None),
                                  lambda: bz.SGD(lr=0.1, momentum=True)])
def test_optimizer_hyperparameters_that_are_no_numbers_are_braze_errors(make):
    with pytest.raises(BrazeError, match=r"must be a number >= 0"):
        make()


def test_a_frozen_param_read_only_by_an_extra_output_compiles():
    """The backward graph drops a frozen param that only a metric output reads; compiling it
    with every frozen param was refused ("no param named 's'")."""
    g = bz.Graph("with_metric")
    x = g.input("x", bz.Shape((4, 3)))
    y = g.mm(x, g.param("w", bz.Shape((3, 2))))
    g.set_outputs([g.mean(g.square(y)), g.mul(y, g.param("s", bz.Shape((2,))))])
    params = bz.init_params(g, seed=0)
    step = bz.compile_training(g, ["w"], bz.SGD(lr=0.1), params=params)
    feeds = {"x": np.ones((4, 3), np.float32)}
    loss = step.step(feeds)
    np.testing.assert_allclose(loss, np.mean((feeds["x"] @ params["w"]) ** 2), rtol=1e-6)
    np.testing.assert_allclose(step.eval(feeds)[1], feeds["x"] @ step.params["w"] * params["s"],
                               rtol=1e-6)


def test_params_held_in_a_branch_train():
    """grad_with_loss reaches a param held in an if body; compile_training refused it ("graph
    has no param ['w']") since it looked for top-level params only."""
    then_g = bz.Graph("then")
    v = then_g.input("in0", bz.Shape((3,)))
    then_g.set_outputs([then_g.mul(then_g.log(v), then_g.param("w", bz.Shape((3,))))])
    then_g.set_weight("w", np.full(3, 2.0, np.float32))
    else_g = bz.Graph("else")
    else_g.set_outputs([else_g.mul(else_g.input("in0", bz.Shape((3,))), 2.0)])
    g = bz.Graph("branch")
    x = g.input("x", bz.Shape((3,)))
    y = g.cond(g.gt(g.reduce(x, "min"), 0.0), then_g, else_g, x)
    g.set_outputs([g.sum(g.square(g.sub(y, 1.0)))])
    step = bz.compile_training(g, ["w"], bz.SGD(lr=0.1))
    xs = np.array([1.0, 2.0, 3.0], np.float32)
    step.step({"x": xs})
    dw = 2 * (2.0 * np.log(xs) - 1.0) * np.log(xs)
    np.testing.assert_allclose(step.params["w"], 2.0 - 0.1 * dw, rtol=1e-6)
