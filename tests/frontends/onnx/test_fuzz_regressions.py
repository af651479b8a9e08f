"""Edge cases found by differential fuzzing of random ONNX graphs against ONNX Runtime: each
model is small, built by hand, and must match ONNX Runtime (shapes, dtypes, values) through
braze's interpreter and its compiled executable."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def ints(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


@pytest.mark.parametrize("start,end,step", [
    (-9, -3, -1), (-(1 << 62), -6, -1), (-9, -(1 << 63), -2), (-5, 0, -1), (-4, -9, -1),
    (9, -9, -1), (-9, 9, 2), (3, -9, -3)])
@pytest.mark.parametrize("folded", [False, True])
def test_slice_clamps_a_negative_step_start_as_onnx_does(make_model, matches_ort, start, end,
                                                          step, folded):
    """ONNX clamps a negative-step start before the axis to element 0 (`x[-9::-1]` of 4
    elements is [x[0]]); Python's slice gives nothing. Run-time and folded (constant) slices."""
    x = np.arange(12, dtype=np.int64 if folded else np.float32).reshape(3, 4)
    inits = [ints("s", [start]), ints("e", [end]), ints("a", [1]), ints("st", [step])]
    if folded:
        inits.append(numpy_helper.from_array(x, "x"))
        inputs, feeds, et = [], {}, I64
    else:
        inputs, feeds, et = [("x", F, [3, 4])], {"x": x}, F
    node = helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"])
    matches_ort(make_model([node], inputs, [("y", et, None)], inits), feeds)


@pytest.mark.parametrize("shapes,axis", [
    ([(0, 0, 3), (0, 2, 3)], 1), ([(2, 0), (2, 0), (3, 0)], 0), ([(0, 4), (0, 4)], -1),
    ([(0,), (2, 0), (1, 0)], 0)])
def test_concat_of_only_empty_inputs_keeps_their_lengths(make_model, matches_ort, shapes, axis):
    """Concat of empty inputs still adds their lengths along the axis ([0, 0, 3] and
    [0, 2, 3] on axis 1 is [0, 2, 3]); a 1-D [0] beside higher ranks is still dropped."""
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node("Concat", names, ["y"], axis=axis)
    feeds = {n: np.zeros(s, np.float32) for n, s in zip(names, shapes)}
    model = make_model([node], [(n, F, list(s)) for n, s in zip(names, shapes)],
                       [("y", F, None)])
    if len({len(s) for s in shapes}) > 1:  # ONNX Runtime refuses mixed ranks: compare to NumPy
        import braze as bz

        g = bz.import_onnx(model)
        assert bz.interpret(g, feeds)[0].shape == (3, 0)
        return
    matches_ort(model, feeds)


@pytest.mark.parametrize("shape", [(0, 2, 3), (0, 2, 3, 4), (2, 2, 0)])
def test_instance_norm_of_an_empty_batch(make_model, matches_ort, shape):
    """InstanceNormalization (braze's group_norm) of a batch of 0: an empty result, not a
    NumPy reshape error from the reference ('cannot reshape array of size 0')."""
    inits = [numpy_helper.from_array(np.ones(2, np.float32), n) for n in ("s", "b")]
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"])
    matches_ort(make_model([node], [("x", F, list(shape))], [("y", F, None)], inits),
                {"x": np.zeros(shape, np.float32)})


def test_slice_of_a_symbolic_axis_refuses_a_binding_that_empties_it(make_model, ort_run):
    """`x[4:-4]` of an axis N imports unclamped as a narrow of N-8 rows; fed N = 4 the
    interpreter had returned an empty slice and the compiled executable raised 'dim -4 is
    negative in (-4, 5)' naming nothing. Both now name the node and the binding; a binding
    that keeps the slice inside the axis still matches ONNX Runtime."""
    import braze as bz
    from braze.errors import InterpretError

    inits = [ints("s", [4]), ints("e", [-4]), ints("a", [0])]
    node = helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])
    model = make_model([node], [("x", F, ["N", 5])], [("y", F, None)], inits)
    g = bz.import_onnx(model)
    exe = bz.compile(g, threads=1)
    big = {"x": np.arange(50, dtype=np.float32).reshape(10, 5)}
    np.testing.assert_array_equal(exe(big)[0], ort_run(model, big)[0])
    small = {"x": np.ones((4, 5), np.float32)}
    with pytest.raises(InterpretError, match=r"narrow length N-8 is -4 < 0"):
        bz.interpret(g, small)
    with pytest.raises(InterpretError, match=r"Slice.*\[4, 4\+N-8\) = \[4, 0\).*\{'N': 4\}"):
        exe(small)


def test_slice_to_a_negative_end_of_a_short_symbolic_axis_is_refused(make_model):
    """`x[0:-4]` of an axis N is a narrow of N-4 rows: fed N = 3, NumPy's x[0:-1] had given 2
    rows where ONNX gives none."""
    import braze as bz
    from braze.errors import InterpretError

    inits = [ints("s", [0]), ints("e", [-4]), ints("a", [0])]
    node = helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])
    g = bz.import_onnx(make_model([node], [("x", F, ["N"])], [("y", F, None)], inits))
    assert bz.interpret(g, {"x": np.ones(6, np.float32)})[0].shape == (2,)
    with pytest.raises(InterpretError, match=r"narrow length N-4 is -1 < 0"):
        bz.interpret(g, {"x": np.ones(3, np.float32)})


def test_concat_keeps_symbolic_inputs_empty_in_another_dim(make_model, matches_ort):
    """[N, 0], [3, 0] and [3, 0] on axis 0 is [N+6, 0]: only a zero length along the axis
    adds nothing (the symbolic input's empty second dim had dropped the static ones)."""
    node = helper.make_node("Concat", ["a", "b", "c"], ["y"], axis=0)
    model = make_model([node], [("a", F, ["N", 0]), ("b", F, [3, 0]), ("c", F, [3, 0])],
                       [("y", F, None)])
    matches_ort(model, {"a": np.zeros((5, 0), np.float32), "b": np.zeros((3, 0), np.float32),
                        "c": np.zeros((3, 0), np.float32)})


@pytest.mark.parametrize("start,end", [
    (-(1 << 63), 3), (-(1 << 62), (1 << 63) - 1), ((1 << 63) - 1, (1 << 63) - 1),
    ((1 << 63) - 1, 0), (1, -(1 << 63)), (0, -(1 << 62))])
def test_slice_of_a_symbolic_axis_with_int64_extreme_bounds(make_model, matches_ort, start,
                                                            end):
    """INT64_MIN / INT64_MAX bounds on a symbolic axis are its ends: `x[INT64_MIN:]` had
    become a slice 2**62 rows long (or N - 2**63 rows) instead of the whole axis."""
    inits = [ints("s", [start]), ints("e", [end]), ints("a", [0])]
    node = helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])
    model = make_model([node], [("x", F, ["N", 2])], [("y", F, None)], inits)
    for n in (3, 5):
        matches_ort(model, {"x": np.arange(2 * n, dtype=np.float32).reshape(n, 2)})


@pytest.mark.parametrize("row", [[-np.inf, -np.inf], [np.inf, 1, 2], [-np.inf, 0.5, 1],
                                 [1e30, 3e38, -2], [np.nan, 1]])
def test_reduce_log_sum_exp_of_infinite_values(make_model, matches_ort, row):
    """log(sum(exp(x))) of all -inf is -inf (a fully masked row) and of a +inf is +inf; the
    max-shifted form had given inf - inf = NaN for both."""
    node = helper.make_node("ReduceLogSumExp", ["x"], ["y"], axes=[1], keepdims=0)
    model = make_model([node], [("x", F, [2, len(row)])], [("y", F, None)], opset=17)
    x = np.array([row, [0.0] * len(row)], np.float32)
    matches_ort(model, {"x": x})


@pytest.mark.parametrize("tail", ["MatMul", "Softmax", "Add"])
def test_slice_longer_than_a_short_symbolic_axis_is_refused_when_compiled(make_model, tail):
    """`x[0:6]` of an axis N imports as a narrow of 6 rows: fed N = 5, the compiled
    executable had read a sixth row past the input (a (6, 4) result of garbage rows) or failed
    in a later node with a NumPy broadcast error; the binding is now refused naming the Slice."""
    import braze as bz
    from braze.errors import InterpretError

    inits = [ints("s", [0]), ints("e", [6]), ints("a", [0]),
             numpy_helper.from_array(np.ones((3, 4), np.float32), "w")]
    nodes = [helper.make_node("Slice", ["x", "s", "e", "a"], ["y"]),
             helper.make_node(tail, ["y", "w"] if tail == "MatMul" else ["y", "y"] if
                              tail == "Add" else ["y"], ["z"])]
    g = bz.import_onnx(make_model(nodes, [("x", F, ["N", 3])], [("z", F, None)], inits))
    exe = bz.compile(g, threads=1)
    assert exe({"x": np.ones((7, 3), np.float32)})[0].shape[0] == 6
    with pytest.raises(InterpretError, match=r"Slice.*\[0, 6\) of axis 0, of size 5"):
        exe({"x": np.ones((5, 3), np.float32)})
