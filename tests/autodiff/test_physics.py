"""Physics-style losses on a small learned pair potential (an MLP on the pairwise distances of
N atoms): grad_subgraph's forces against central finite differences of the energy, and the
force/energy loss and its weight gradients (second order through the graph) against finite
differences of the loss, in float64 through the reference interpreter."""
from __future__ import annotations

import numpy as np
import pytest

import braze as bz
from braze.autodiff.physics import ForceEnergyLossWeights, build_force_energy_loss, grad_subgraph
from braze.errors import AutodiffError

N_ATOMS, HIDDEN = 5, 8
WEIGHTS = ["w1", "b1", "w2"]


def pair_potential(dtype=bz.f64) -> bz.Graph:
    """E = sum_ij mlp(sqrt(|p_i - p_j|^2 + 0.1)), mlp = tanh(d w1 + b1) w2."""
    g = bz.Graph("pair_potential")
    pos = g.input("pos", bz.Shape((N_ATOMS, 3), dtype))
    diff = g.sub(g.reshape(pos, (N_ATOMS, 1, 3)), g.reshape(pos, (1, N_ATOMS, 3)))
    r2 = g.sum(g.square(diff), axes=-1, keepdims=True)
    dist = g.sqrt(g.add(r2, g.constant(np.array(0.1, dtype.np), dtype)))
    w1 = g.param("w1", bz.Shape((1, HIDDEN), dtype))
    b1 = g.param("b1", bz.Shape((HIDDEN,), dtype))
    w2 = g.param("w2", bz.Shape((HIDDEN, 1), dtype))
    pair = g.mm(g.tanh(g.add(g.mm(dist, w1), b1)), w2)
    g.set_outputs([g.sum(pair)])
    return g


def _setup(seed: int = 0):
    rng = np.random.default_rng(seed)
    g = pair_potential()
    params = bz.init_params(g, seed=seed)
    pos = rng.normal(size=(N_ATOMS, 3))
    return g, params, pos, rng


def _central(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    out = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += eps
        down[i] -= eps
        out[i] = (f(up) - f(down)) / (2 * eps)
    return out


def test_forces_match_finite_differences_of_energy():
    g, params, pos, _ = _setup()
    fg = grad_subgraph(g, positions="pos")
    bz.verify(fg)
    energy, forces = bz.interpret(fg, {"pos": pos}, params)

    def e(p):
        return float(bz.interpret(g, {"pos": p}, params)[0])

    np.testing.assert_allclose(energy, e(pos), rtol=1e-12)
    assert forces.shape == pos.shape
    np.testing.assert_allclose(forces, -_central(e, pos), rtol=1e-6, atol=1e-8)
    assert np.abs(forces).max() > 1e-3  # the potential is not flat


def test_force_energy_loss_value():
    g, params, pos, rng = _setup(1)
    w = ForceEnergyLossWeights(forces=0.7, energy=0.2)
    lg = build_force_energy_loss(g, "pos", w)
    f_ref, e_ref = rng.normal(size=pos.shape), np.array(rng.normal())
    energy, forces = bz.interpret(grad_subgraph(g, "pos"), {"pos": pos}, params)
    (loss,) = bz.interpret(lg, {"pos": pos, "F_ref": f_ref, "E_ref": e_ref}, params)
    want = 0.7 * np.mean((forces - f_ref) ** 2) + 0.2 * (energy - e_ref) ** 2
    np.testing.assert_allclose(loss, want, rtol=1e-12)


def test_loss_weight_gradients_match_finite_differences():
    """Second order: d/dweights of a loss on -dE/dpos."""
    g, params, pos, rng = _setup(2)
    lg = build_force_energy_loss(g, "pos", ForceEnergyLossWeights(1.0, 0.5))
    feeds = {"pos": pos, "F_ref": rng.normal(size=pos.shape), "E_ref": np.array(0.3)}
    gg = bz.grad_with_loss(lg, WEIGHTS, unused="error")
    bz.verify(gg)
    _, *grads = bz.interpret(gg, feeds, params)
    for name, grad in zip(WEIGHTS, grads):
        def loss_at(v, name=name):
            return float(bz.interpret(lg, feeds, {**params, name: v})[0])

        want = _central(loss_at, params[name])
        assert np.abs(want).max() > 1e-4
        np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-8, err_msg=name)


def test_only_force_term_still_depends_on_weights():
    """With w_e = 0 the loss holds the weights only through the gradient of the energy."""
    g, params, pos, rng = _setup(3)
    lg = build_force_energy_loss(g, "pos", ForceEnergyLossWeights(1.0, 0.0))
    feeds = {"pos": pos, "F_ref": rng.normal(size=pos.shape), "E_ref": np.array(0.0)}
    _, dw1, *_ = bz.interpret(bz.grad_with_loss(lg, WEIGHTS), feeds, params)
    want = _central(lambda v: float(bz.interpret(lg, feeds, {**params, "w1": v})[0]),
                    params["w1"])
    np.testing.assert_allclose(dw1, want, rtol=1e-5, atol=1e-8)


def test_errors_name_the_problem():
    g, *_ = _setup()
    with pytest.raises(AutodiffError, match="no input or param named 'positions'"):
        grad_subgraph(g, positions="positions")
    with pytest.raises(AutodiffError, match="already has an input or param named 'w1'"):
        build_force_energy_loss(g, "pos", force_ref="w1")


def test_grad_subgraph_does_not_change_its_input():
    g, *_ = _setup()
    before = str(g)
    grad_subgraph(g, "pos")
    build_force_energy_loss(g, "pos")
    assert str(g) == before


def test_compiled_training_on_forces_and_energy():
    """The second-order loss compiles (f32) and trains: a potential with other weights is
    fitted to reference forces and energy; step-0 gradients equal the interpreter's."""
    g = pair_potential(bz.f32)
    rng = np.random.default_rng(5)
    pos = rng.normal(size=(N_ATOMS, 3)).astype(np.float32)
    energy, forces = bz.interpret(grad_subgraph(g, "pos"), {"pos": pos},
                                  bz.init_params(g, seed=7))
    lg = build_force_energy_loss(g, "pos", ForceEnergyLossWeights(1.0, 0.1))
    feeds = {"pos": pos, "F_ref": forces, "E_ref": np.asarray(energy, np.float32)}
    params = bz.init_params(g, seed=0)
    step = bz.compile_training(lg, WEIGHTS, bz.Adam(lr=1e-2), params=params)
    step.gradients(feeds)
    _, *want = bz.interpret(bz.grad_with_loss(lg, WEIGHTS), feeds, params)
    for name, w in zip(WEIGHTS, want):
        np.testing.assert_allclose(step.grads[name], w, rtol=1e-4, atol=1e-5, err_msg=name)
    losses = [step.step(feeds) for _ in range(100)]
    assert losses[-1] < 0.05 * losses[0]
