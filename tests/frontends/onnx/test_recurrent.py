"""LSTM, GRU and RNN (ops/recurrent.py) against ONNX Runtime, through the reference interpreter
and the compiled CPU executable: every direction with every optional input, layout 1 (which ORT
does not run: compared with ORT on the layout-0 model), sequence_lens (constant and computed,
including 0), clip, input_forget, linear_before_reset, every activation with and without
alpha / beta, partial outputs, and a symbolic sequence length (a While loop) run at two
lengths. Malformed nodes are refused naming the node."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import braze as bz  # noqa: E402
from braze.errors import FrontendError  # noqa: E402

F = TensorProto.FLOAT
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
OUTPUTS = {"LSTM": ("Y", "Y_h", "Y_c"), "GRU": ("Y", "Y_h"), "RNN": ("Y", "Y_h")}
ACTIVATIONS = ["Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu",
               "ScaledTanh", "HardSigmoid", "Elu", "Softsign", "Softplus"]
T, B, IN, H = 5, 3, 4, 6  # odd sizes: sequence, batch, input, hidden


def recurrent_model(kind, *, direction="forward", layout=0, bias=True, lens=None,
                    lens_input=False, states=False, peepholes=False, outputs=None,
                    seq: int | str = T, batch: int | str = B, seed=0, **attrs):
    """(model, feeds): weights are initializers, X and the initial states inputs."""
    rng = np.random.default_rng(seed)
    g, d = GATES[kind], 2 if direction == "bidirectional" else 1
    inits, inputs, feeds = [], [], {}
    x_dims = [batch, seq, IN] if layout else [seq, batch, IN]
    inputs.append(helper.make_tensor_value_info("X", F, x_dims))
    feeds["X"] = rng.standard_normal((B, T, IN) if layout else (T, B, IN)).astype(np.float32)
    names = ["X", "W", "R"]
    inits += [numpy_helper.from_array((rng.standard_normal((d, g * H, IN)) * 0.5)
                                      .astype(np.float32), "W"),
              numpy_helper.from_array((rng.standard_normal((d, g * H, H)) * 0.5)
                                      .astype(np.float32), "R")]
    names.append("B" if bias else "")
    if bias:
        inits.append(numpy_helper.from_array((rng.standard_normal((d, 2 * g * H)) * 0.5)
                                             .astype(np.float32), "B"))
    names.append("lens" if lens is not None else "")
    if lens is not None:
        arr = np.asarray(lens, np.int32)
        if lens_input:
            inputs.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [batch]))
            feeds["lens"] = arr
        else:
            inits.append(numpy_helper.from_array(arr, "lens"))
    for name in ("h0", "c0")[:2 if kind == "LSTM" else 1]:
        names.append(name if states else "")
        if states:
            inputs.append(helper.make_tensor_value_info(
                name, F, [batch, d, H] if layout else [d, batch, H]))
            feeds[name] = rng.standard_normal((B, d, H) if layout else (d, B, H)) \
                .astype(np.float32)
    if peepholes:
        names.append("P")
        inits.append(numpy_helper.from_array(rng.standard_normal((d, 3 * H))
                                             .astype(np.float32), "P"))
    while names[-1] == "":
        names.pop()
    outs = [o if outputs is None or o in outputs else "" for o in OUTPUTS[kind]]
    while outs[-1] == "":
        outs.pop()
    if layout:
        attrs["layout"] = 1
    node = helper.make_node(kind, names, outs, name="rnn0", hidden_size=H, direction=direction,
                            **attrs)
    vo = [helper.make_tensor_value_info(o, F, None) for o in outs if o]
    graph = helper.make_graph([node], "recurrent", inputs, vo, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)],
                              ir_version=8)
    return model, feeds


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_every_direction_with_every_optional_input(matches_ort, kind, direction):
    m, feeds = recurrent_model(kind, direction=direction, states=True,
                               peepholes=kind == "LSTM")
    g = matches_ort(m, feeds, atol=1e-5)
    assert g.count("scan") == (2 if direction == "bidirectional" else 1)


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_defaults_without_bias_or_states(matches_ort, kind):
    m, feeds = recurrent_model(kind, direction="bidirectional", bias=False)
    matches_ort(m, feeds, atol=1e-5)


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_layout_1_matches_ort_on_the_layout_0_model(ort_run, kind, direction):
    m1, f1 = recurrent_model(kind, direction=direction, layout=1, states=True)
    m0, _ = recurrent_model(kind, direction=direction, states=True)
    f0 = {k: v.transpose(1, 0, 2) for k, v in f1.items()}
    want = [w.transpose(2, 0, 1, 3) if w.ndim == 4 else w.transpose(1, 0, 2)
            for w in ort_run(m0, f0)]
    g = bz.import_onnx(m1)
    for got in (bz.interpret(g, f1), bz.compile(g, "cpu")(f1)):
        for a, b in zip(got, want, strict=True):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("lens_input", [False, True])
def test_sequence_lens_mask_the_steps_past_each_end(matches_ort, kind, direction, lens_input):
    m, feeds = recurrent_model(kind, direction=direction, states=True, lens=[5, 2, 0],
                               lens_input=lens_input)
    matches_ort(m, feeds, atol=1e-5)


def test_full_length_sequence_lens_add_nothing(matches_ort):
    m, feeds = recurrent_model("GRU", lens=[T] * B)
    masked, _ = recurrent_model("GRU", lens=[T, T, 1])
    g = matches_ort(m, feeds)
    assert len(g.nodes) < len(bz.import_onnx(masked).nodes)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_lstm_clip_peepholes_and_coupled_forget_gate(matches_ort, direction):
    m, feeds = recurrent_model("LSTM", direction=direction, states=True, peepholes=True,
                               clip=0.6, input_forget=1)
    matches_ort(m, feeds, atol=1e-5)


@pytest.mark.parametrize("kind", ["GRU", "RNN"])
def test_clip(matches_ort, kind):
    m, feeds = recurrent_model(kind, direction="bidirectional", states=True, clip=0.5)
    matches_ort(m, feeds, atol=1e-5)


@pytest.mark.parametrize("linear_before_reset", [0, 1])
@pytest.mark.parametrize("bias", [False, True])
def test_gru_linear_before_reset(matches_ort, linear_before_reset, bias):
    m, feeds = recurrent_model("GRU", direction="bidirectional", states=True, bias=bias,
                               linear_before_reset=linear_before_reset, lens=[4, 5, 1])
    matches_ort(m, feeds, atol=1e-5)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_every_activation_with_ort_defaults(matches_ort, activation):
    m, feeds = recurrent_model("RNN", direction="bidirectional", states=True,
                               activations=[activation, "Tanh"])
    matches_ort(m, feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_every_activation_with_alpha_and_beta(matches_ort, activation):
    """The lists are consumed by the activations that use them, in order."""
    m, feeds = recurrent_model("LSTM", states=True, activations=["HardSigmoid", activation,
                                                                 "Tanh"],
                               activation_alpha=[0.3, 0.7], activation_beta=[0.4, 0.9])
    matches_ort(m, feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind, outputs", [("LSTM", ("Y_h",)), ("LSTM", ("Y_c",)),
                                           ("LSTM", ("Y", "Y_c")), ("GRU", ("Y_h",)),
                                           ("RNN", ("Y",))])
def test_partial_outputs(matches_ort, kind, outputs):
    m, feeds = recurrent_model(kind, direction="bidirectional", states=True, outputs=outputs)
    matches_ort(m, feeds, atol=1e-5)


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_symbolic_sequence_length_runs_a_while_loop_at_every_length(ort_run, kind, direction):
    m, _ = recurrent_model(kind, direction=direction, states=True, seq="seq", batch="batch",
                           lens=[3, 1, 0], lens_input=True)
    g = bz.import_onnx(m)
    assert g.count("while") == (2 if direction == "bidirectional" else 1)
    exe = bz.compile(g, "cpu")
    rng = np.random.default_rng(1)
    for steps in (3, 7):
        feeds = {vi.name: rng.standard_normal([d.dim_value or {"seq": steps, "batch": B}[
            d.dim_param] for d in vi.type.tensor_type.shape.dim]).astype(np.float32)
            for vi in m.graph.input if vi.name != "lens"}
        feeds["lens"] = np.array([steps, 1, 0], np.int32)
        want = ort_run(m, feeds)
        for got in (bz.interpret(g, feeds), exe(feeds)):
            for a, b in zip(got, want, strict=True):
                assert a.shape == b.shape
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_pinning_the_sequence_length_gives_a_scan(ort_run):
    m, feeds = recurrent_model("LSTM", seq="seq")
    g = bz.import_onnx(m, input_shapes={"X": (T, B, IN)})
    assert g.count("scan") == 1 and g.count("while") == 0
    for a, b in zip(bz.compile(g, "cpu")(feeds), ort_run(m, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_lowering_a_loop_over_a_symbolic_length_says_to_pin_the_length():
    """Exporting (or lowering, differentiating) the while loop of a symbolic sequence length
    names the importer's fix, not only g.while_loop's max_iterations, which an importer's user
    cannot pass."""
    m, _ = recurrent_model("GRU", seq="seq")
    with pytest.raises(bz.BrazeError, match=r"max_iterations.*import_onnx\(path, input_shapes="):
        bz.unroll_while(bz.import_onnx(m))


# -- refusals -----------------------------------------------------------------------------------
@pytest.mark.parametrize("attrs, message", [
    ({"activations": ["Tanh", "Tanh"]}, r"2 activations given; LSTM takes 3 per direction"),
    ({"activations": ["Sigmoid", "Gelu", "Tanh"]},
     r"activation 'Gelu' is not one of ONNX's recurrent activations"),
    ({"direction": "sideways"}, r"direction='sideways' is not defined"),
])
def test_malformed_attributes_are_refused_naming_the_node(attrs, message):
    m, _ = recurrent_model("LSTM", **attrs)
    with pytest.raises(FrontendError, match=r"rnn0 \(LSTM\).*" + message):
        bz.import_onnx(m)


def test_sequence_lens_of_the_wrong_length_are_refused():
    m, _ = recurrent_model("GRU", lens=[5, 5])
    with pytest.raises(FrontendError, match=r"rnn0 \(GRU\).*sequence_lens must have dims "
                                            r"\(3,\), got \(2,\)"):
        bz.import_onnx(m)


def test_recurrent_ops_are_listed_as_supported():
    from braze.frontends.onnx.importer import SUPPORTED_OPS

    assert {"LSTM", "GRU", "RNN"} <= set(SUPPORTED_OPS())
