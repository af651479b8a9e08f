"""bz.compile: every op kind runs (kernel or reference fallback), programs are planned per
binding of the symbolic dims, static values are computed once, the arena plan is tight, and
outputs equal the reference interpreter's."""
import numpy as np
import pytest

import braze as bz
import braze.models as models
from braze.op_examples import OP_EXAMPLES, example_graph
from braze.runtime.kernels import Dispatch
from braze.testing import assert_equivalent  # noqa: F401  (the same comparison rules)


def _check(g, exe, feeds, params, rtol=1e-5, atol=1e-5):
    want = bz.interpret(g, feeds, params)
    got = exe(feeds)
    assert len(got) == len(want)
    for w, a in zip(want, got, strict=True):
        assert a.shape == w.shape and a.dtype == w.dtype
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(a, w)
        else:
            np.testing.assert_allclose(a, w, rtol=rtol, atol=atol)


@pytest.mark.parametrize("kind", sorted(OP_EXAMPLES))
def test_every_op_kind_runs_compiled(kind):
    g = example_graph(kind)
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params, fuse=False)
    feeds = bz.random_feeds(g, 1)
    _check(g, exe, feeds, params)


@pytest.mark.parametrize("build", [
    lambda: models.bert_encoder(2, 64, 4, batch="batch", seq="seq", with_mask=True),
    lambda: models.gpt2_blocks(2, 64, 4, batch="batch", seq="seq"),
    lambda: models.llama_tiny(),
    lambda: models.resnet_basic_block(),
], ids=["bert", "gpt2", "llama", "resnet"])
def test_builtin_models_match_the_interpreter_at_two_bindings(build):
    g = build()
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params)
    for i, sym in enumerate(({"batch": 2, "seq": 5}, {"batch": 1, "seq": 7})):
        feeds = bz.random_feeds(g, i, sym)
        _check(g, exe, feeds, params, rtol=1e-4, atol=1e-4)
        assert exe.plan.ratio <= 1.2, exe.plan.summary()


def test_programs_are_cached_per_binding_and_outputs_are_copies():
    g = models.bert_encoder(1, 32, 2, batch="batch", seq="seq")
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params)
    f1 = bz.random_feeds(g, 0, {"batch": 2, "seq": 4})
    a = exe(f1)[0]
    prog = exe.program(f1)
    a[...] = 0
    b = exe(f1)[0]
    assert exe.program(f1) is prog and np.abs(b).max() > 0
    exe(bz.random_feeds(g, 0, {"batch": 1, "seq": 6}))
    assert len(exe._programs) == 2


def test_values_computed_from_a_dim_follow_each_binding():
    """seq - 1 from a sym_const of seq is a static scalar whose value depends on the binding
    through its input: never cached across programs (it read 2 for seq = 3, 7, 3)."""
    g = bz.Graph("dims")
    x = g.input("x", bz.Shape(("seq",)))
    last = g.sub(g.sym_const(("seq",), (), bz.i64), 1)
    g.set_outputs([g.mul(last, 2), g.add(x, g.cast(last, bz.f32))])
    exe = bz.compile(g)
    for seq in (3, 7, 3, 1):
        got = exe({"x": np.zeros(seq, np.float32)})
        assert int(got[0]) == 2 * (seq - 1)
        np.testing.assert_array_equal(got[1], np.full(seq, seq - 1, np.float32))


@pytest.mark.parametrize("precision", [None, "bf16"])
def test_a_weight_scaled_by_a_dim_is_prepared_per_binding(precision):
    """w * seq is a static weight whose numbers, not shape, change with the binding: its packed
    GEMM weight (and a conv's prepared weight) is this binding's own (seq = 5 and 7 had
    multiplied by the 3 packed first)."""
    g = bz.Graph("scaled")
    x = g.input("x", bz.Shape(("seq", 16)))
    img = g.input("img", bz.Shape(("seq", 16, 10, 10)))
    seq = g.cast(g.sym_const(("seq",), ()), bz.f32)
    w = g.mul(g.param("w", bz.Shape((16, 16))), seq)
    k = g.mul(g.param("k", bz.Shape((32, 16, 3, 3))), seq)
    g.set_outputs([g.mm(x, w), g.conv2d(img, k, padding=1)])
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params, precision=precision)
    policy = exe.graph if precision else g
    for n in (3, 5, 3, 7):
        feeds = bz.random_feeds(g, n, {"seq": n})
        _check(policy, exe, feeds, params, 2e-3, 2e-3)


def test_weight_preparation_is_static_and_update_weights_recomputes_it():
    g = models.bert_encoder(1, 32, 2, batch=2, seq=4)        # QKV concat of unstored params
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params)
    feeds = bz.random_feeds(g, 0)
    exe(feeds)
    report = exe.dispatch_report()
    static = report.by_dispatch(Dispatch.STATIC)
    assert any(kind == "concat" for _, kind, _, _ in static)
    params2 = bz.init_params(g, 5)
    exe.update_weights(params2)
    np.testing.assert_allclose(exe(feeds)[0], bz.interpret(g, feeds, params2)[0], rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("build", [
    lambda: models.bert_encoder(1, 32, 2, batch=2, seq=5, seed=0),  # q / k / v joined
    lambda: models.resnet_basic_block(8, 8, seed=0),                 # BatchNorms folded
], ids=["bert", "resnet"])
def test_new_values_of_stored_weights_reach_the_weights_fusion_made_of_them(build):
    """Fusion bakes stored values into joined / folded weights: params= and update_weights
    naming a stored param had reached its other uses only (bert's attention read the old
    q / k / v, resnet's convs the old BatchNorms)."""
    g = build()
    feeds = bz.random_feeds(g, 0)
    new = {k: np.asarray(v) * 1.5 + 0.25 for k, v in g.weights.items()}
    _check(g, bz.compile(g, params=new), feeds, new, 1e-4, 1e-4)
    exe = bz.compile(g)
    _check(g, exe, feeds, {}, 1e-4, 1e-4)
    name = next(k for k in new if k.endswith(("q.weight", "bn1.var")))
    exe.update_weights({name: new[name]})
    _check(g, exe, feeds, {name: new[name]}, 1e-4, 1e-4)


def test_dispatch_report_lists_reference_fallbacks_and_decompositions():
    g = bz.Graph("odd")
    x = g.input("x", bz.Shape((3, 4), bz.f32))
    y = g.cumsum(g.cast(g.abs(x), bz.i16), 1)  # an int16 cumsum has no kernel
    g.set_outputs([g.gelu(g.cast(y, bz.f32))])
    exe = bz.compile(g, fuse=False)
    exe(bz.random_feeds(g, 0))
    rep = exe.dispatch_report()
    kinds = {kind: d for _, kind, d, _ in rep.rows}
    assert kinds["cumsum"] == Dispatch.REFERENCE
    assert kinds["abs"] == kinds["gelu"] == Dispatch.NATIVE
    assert "reference fallback" in str(rep)


def test_bad_feeds_are_clear_errors():
    g = models.bert_encoder(1, 32, 2, batch="batch", seq="seq")
    exe = bz.compile(g, params=bz.init_params(g, 0))
    with pytest.raises(bz.InterpretError, match="needs input 'hidden'"):
        exe({})
    with pytest.raises(bz.InterpretError, match="cast the feed"):
        exe({"hidden": np.zeros((1, 2, 32), np.float64)})
    with pytest.raises(bz.InterpretError, match="param .* has no value"):
        bz.compile(g)(bz.random_feeds(g, 0))


@pytest.mark.parametrize("axis", [0, 1])
def test_gather_indices_wrap_only_when_negative_and_out_of_range_is_an_error(axis):
    """The compiled gather takes NumPy's fast path after checking the indices itself:
    negative indices count from the end, as the reference's; one out of range raises a braze
    error naming the node, not a raw IndexError (nor a silently wrapped row)."""
    g = bz.Graph("emb")
    table = g.input("t", bz.Shape((10, 6)))
    ids = g.input("ids", bz.Shape((2, 3), bz.i64))
    g.set_outputs([g.gather(table, ids, axis=axis)])
    exe = bz.compile(g, fuse=False)
    n = 10 if axis == 0 else 6
    t = np.random.default_rng(0).standard_normal((10, 6)).astype(np.float32)
    good = np.array([[0, -1, n - 1], [-n, 2, 1]])
    want = bz.interpret(g, {"t": t, "ids": good})[0]
    np.testing.assert_array_equal(exe({"t": t, "ids": good})[0], want)
    for bad in (n, -n - 1):
        ids_bad = good.copy()
        ids_bad[1, 2] = bad
        with pytest.raises(bz.InterpretError, match=r"gather.*out of bounds"):
            exe({"t": t, "ids": ids_bad})
    np.testing.assert_array_equal(exe({"t": t, "ids": good})[0], want)  # still runs after


def test_profile_names_every_step():
    g = models.bert_encoder(1, 32, 2, batch=1, seq=4)
    exe = bz.compile(g, params=bz.init_params(g, 0))
    feeds = bz.random_feeds(g, 0)
    prof = exe.profile(feeds, repeat=2)
    assert len(prof.rows) == len(exe.program(feeds).steps)
    assert prof.total_seconds > 0 and "matmul" in str(prof)


def test_weights_not_aligned_to_their_element_size_are_copied_aligned_once():
    """Weights viewed straight out of a file's bytes can sit at odd addresses; the program
    keeps an aligned copy (NumPy's slow paths, e.g. a gather, otherwise run on them)."""
    raw = np.zeros(50 * 8 * 4 + 1, np.uint8)
    table = raw[1:].view(np.float32).reshape(50, 8)
    table[...] = np.random.default_rng(0).standard_normal((50, 8))
    assert not table.flags.aligned
    g = bz.Graph("emb")
    ids = g.input("ids", bz.Shape((3, 5), bz.i64))
    w = g.param("w", bz.Shape((50, 8)))
    g.set_outputs([g.gather(w, ids, axis=0)])
    exe = bz.compile(g, params={"w": table}, fuse=False)
    feeds = {"ids": np.random.default_rng(1).integers(0, 50, (3, 5))}
    np.testing.assert_array_equal(exe(feeds)[0], table[feeds["ids"]])
    prog = exe.program(feeds)
    step = prog.steps[0]
    assert step.node.op.label == "gather"
    kept = prog.env[step.slots[0]]
    assert kept.flags.aligned and kept is exe.program(feeds).env[step.slots[0]]


def test_an_executable_pickles_as_what_it_was_compiled_from():
    """A spawned worker gets its executable by pickle: it failed on the executable's lock
    (and, once called, on the kernels' closures). The copy keeps the weights, precision and
    threads, and plans its programs again."""
    import pickle

    g = bz.Graph("p")
    x = g.input("x", bz.Shape(("batch", 32)))
    g.set_outputs([g.softmax(g.gelu(g.mm(x, g.param("w", bz.Shape((32, 48))))), -1)])
    params = bz.init_params(g, seed=0)
    exe = bz.compile(g, params=params, precision="bf16", threads=1)
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)}
    exe(feeds)
    exe.update_weights({"w": params["w"] * 2})
    copy = pickle.loads(pickle.dumps(exe))
    assert (copy.precision, copy.threads) == (exe.precision, exe.threads)
    np.testing.assert_array_equal(copy(feeds)[0], exe(feeds)[0])
