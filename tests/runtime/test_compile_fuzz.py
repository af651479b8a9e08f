"""Property: random graphs, fused for the cpu target and compiled with `bz.compile`, give the
reference interpreter's outputs on fresh random inputs.

Graphs: braze.testing's random graphs and transformer stacks (every mask kind, GQA, rope, gated
MLPs, residual norms), plus the strategies here: attention with edge-valued masks (large
negatives, all -inf rows), softcap, cross lengths and strided q/k/v views; conv + BatchNorm +
activation stacks with odd strides / dilations / groups / padding and pooling; elementwise
chains over transposed / narrowed / expanded inputs with broadcasting and edge values.
One Executable is called at two bindings of its symbolic dims and twice per binding (the arena
is reused: no state may leak between calls), with threads 1 and 2, then once more after
`update_weights` with new params.

Tolerances: float32 within rtol 1e-4 (atol 1e-5 scaled by the output's magnitude), widened
per element by the problem's own float32 noise where an output is ill-conditioned (a norm
over 2 nearly equal features amplifies the last bit of its input): 8x the largest change two
interpreter runs on inputs and params perturbed by ~1 ulp make there. The bf16
policy (`precision="bf16"`: matmul / conv operands rounded to bf16, f32 accumulation) is checked
against the interpreter run of the same policy graph (`exe.graph`) within rtol 1e-3 / atol 1e-4
(only the summation order differs), and against float32 loosely: L2 error <= 8e-2 relative to
the output's L2 norm, taken as at least that of an all-ones output (a norm over 2 features
of a small output can lose more than 5% to bf16 rounding, and a random one-layer transformer
drawn on 2026-11-27 lost 5.7%, with or without the bf16 GEMM: the policy's own cost, which
the exact check against the policy graph does not bound)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import braze as bz
from braze.runtime.executable import Executable
from braze.testing import _compare, random_graphs, random_transformer_graphs

# no shrinking: a failing example is printed as drawn (shrinking a compiled graph takes minutes)
FUZZ = dict(deadline=None, suppress_health_check=list(HealthCheck),
            phases=(Phase.explicit, Phase.reuse, Phase.generate))
BINDINGS = ({"batch": 3, "seq": 5}, {"batch": 1, "seq": 1})
F32 = dict(rtol=1e-4, atol=1e-5)
BF16_POLICY = dict(rtol=1e-3, atol=1e-4)
BF16_VS_F32 = 8e-2


def _scaled_atol(ref: np.ndarray, atol: float) -> float:
    finite = np.abs(ref[np.isfinite(ref)]) if ref.dtype.kind == "f" else np.zeros(1)
    return atol * max(1.0, float(finite.max()) if finite.size else 1.0)


def _compare_all(want, got, seed, rtol, atol, noise=None) -> None:
    assert len(want) == len(got)
    for i, (w, a) in enumerate(zip(want, got, strict=True)):
        w, a = np.asarray(w), np.asarray(a)
        tol = _scaled_atol(w, atol) if noise is None else _scaled_atol(w, atol) + 8 * noise[i]
        _compare(w, a, i, len(want), seed, rtol, tol)


def _ulp_noise(g: bz.Graph, feeds, params, want, ulp: float = 2.0 ** -23) -> list:
    """Per output element: the largest change that ~1 ulp of relative noise (float32's, or
    another `ulp`) on every float input and param makes in the interpreter's outputs (two
    draws): the output's own sensitivity at that precision."""
    rng = np.random.default_rng(123)

    def jitter(d):
        return {k: (v * (1 + rng.standard_normal(v.shape) * ulp).astype(v.dtype)
                    if isinstance(v, np.ndarray) and v.dtype == np.float32 else v)
                for k, v in d.items()}

    noise = [np.zeros(np.shape(w)) for w in want]
    for _ in range(2):
        for i, (w, p) in enumerate(zip(want, bz.interpret(g, jitter(feeds), jitter(params)),
                                       strict=True)):
            w, p = np.asarray(w), np.asarray(p)
            if w.dtype.kind == "f":
                noise[i] = np.maximum(noise[i], np.nan_to_num(np.abs(p.astype(np.float64) - w)))
    return noise


def _compare_f32(g, feeds, params, want, got, seed) -> None:
    """Compiled vs interpreted float32 outputs; an element outside the plain tolerance may
    differ by up to 8x the output's own float32 noise (see _ulp_noise)."""
    try:
        _compare_all(want, got, seed, **F32)
    except AssertionError:
        _compare_all(want, got, seed, **F32, noise=_ulp_noise(g, feeds, params, want))


def check_compiled(g: bz.Graph, **kw) -> Executable:
    """Compile `g` once; per binding (and seed), call it twice on the same feeds and once more
    after another binding ran, comparing every output with the interpreter. A failure prints
    the graph (hypothesis does not shrink here)."""
    try:
        return _check_compiled(g, **kw)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{g}") from None


def _check_compiled(g: bz.Graph, *, threads: int = 1, bindings=BINDINGS, feeds_fn=None,
                    precision=None) -> Executable:
    params = bz.init_params(g, 0)
    exe = bz.compile(g, "cpu", params=params, threads=threads, precision=precision)
    runs = []
    for seed, sym in enumerate(bindings):
        feeds = feeds_fn(g, seed, sym) if feeds_fn else bz.random_feeds(g, seed, sym)
        ref = exe.graph if precision else g
        want = bz.interpret(ref, feeds, params)
        tol = BF16_POLICY if precision else F32
        for _ in range(2):
            if precision:
                _compare_all(want, exe(feeds), seed, **tol)
            else:
                _compare_f32(g, feeds, params, want, exe(feeds), seed)
        if precision:
            f32 = bz.interpret(g, feeds, params)
            try:
                _close_in_l2(f32, exe(feeds), seed)
            except AssertionError:  # allow what bf16-sized noise on the inputs alone does
                _close_in_l2(f32, exe(feeds), seed, _ulp_noise(g, feeds, params, f32, 2.0 ** -8))
        runs.append((seed, feeds, want, tol))
    for seed, feeds, want, tol in runs:  # again, after the other bindings' programs ran
        if precision:
            _compare_all(want, exe(feeds), seed, **tol)
        else:
            _compare_f32(g, feeds, params, want, exe(feeds), seed)
    if params and not precision:  # new weights: prepared (packed, folded) weights are redone
        fresh = bz.init_params(g, 7)
        exe.update_weights(fresh)
        seed, feeds, _, tol = runs[0]
        _compare_f32(g, feeds, fresh, bz.interpret(g, feeds, fresh), exe(feeds), seed)
    return exe


def _close_in_l2(want, got, seed, noise=None) -> None:
    """The bf16 policy's outputs within BF16_VS_F32 (relative L2) of float32's, plus 4x the
    output's own sensitivity to bf16-sized noise on its inputs where `noise` is given (a
    LayerNorm over 2 nearly equal values flips sign under any rounding)."""
    for i, (w, a) in enumerate(zip(want, got, strict=True)):
        w64, a64 = np.asarray(w, np.float64), np.asarray(a, np.float64)
        ok = np.isfinite(w64)
        assert np.array_equal(ok, np.isfinite(a64)), f"seed {seed}: output {i} non-finite"
        scale = max(np.linalg.norm(w64[ok]), np.sqrt(ok.sum()), 1.0)  # RMS 1 at least
        err = np.linalg.norm((a64 - w64)[ok]) / scale
        allowed = BF16_VS_F32 + (4 * np.linalg.norm(noise[i][ok]) / scale if noise else 0.0)
        assert err <= allowed, f"seed {seed}: output {i}: bf16 relative L2 error {err:.3g}"


# -- braze.testing's generators ----------------------------------------------------------------
@pytest.mark.parametrize("threads", [1, 2])
@settings(max_examples=12, **FUZZ)
@given(g=random_graphs(max_nodes=14))
def test_random_graphs_run_compiled(threads, g):
    check_compiled(g, threads=threads)


@pytest.mark.parametrize("threads", [1, 2])
@settings(max_examples=6, **FUZZ)
@given(g=random_transformer_graphs(max_layers=2))
def test_random_transformer_layers_run_compiled(threads, g):
    check_compiled(g, threads=threads)


@settings(max_examples=10, **FUZZ)
@given(g=random_graphs(max_nodes=12))
def test_random_graphs_under_the_bf16_policy(g):
    check_compiled(g, precision="bf16")


@settings(max_examples=5, **FUZZ)
@given(g=random_transformer_graphs(max_layers=1))
def test_random_transformer_layers_under_the_bf16_policy(g):
    check_compiled(g, precision="bf16")


# -- conv stacks ----------------------------------------------------------------------------------
@st.composite
def conv_stacks(draw):
    """1-3 conv (+ BatchNorm) (+ activation) (+ pooling) layers on an NCHW input with a symbolic
    batch, odd spatial sizes, strides, dilations, groups (depthwise included) and asymmetric
    padding; sometimes a residual add or a transposed conv."""
    S = bz.Shape
    g = bz.Graph("convs", record_provenance=False)
    c, h, w = draw(st.sampled_from([1, 2, 3, 4])), draw(st.integers(3, 9)), draw(st.integers(3, 9))
    x = g.input("x", S(("batch", c, h, w)))
    n = 0

    def param(*dims):
        nonlocal n
        n += 1
        return g.param(f"p{n}", S(dims))

    for _ in range(draw(st.integers(1, 3))):
        groups = draw(st.sampled_from([1, 1, c] + ([2] if c % 2 == 0 else [])))
        cout = groups * draw(st.integers(1, 3))
        k = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
        stride = (draw(st.integers(1, 3)), draw(st.integers(1, 2)))
        dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
        pad = tuple(draw(st.integers(0, 2)) for _ in range(4))
        span = [(k[i] - 1) * dil[i] + 1 for i in range(2)]
        if h + pad[0] + pad[2] < span[0] or w + pad[1] + pad[3] < span[1]:
            break
        bias = param(cout) if draw(st.booleans()) else None
        y = g.conv2d(x, param(cout, c // groups, *k), bias, stride, pad, dil, groups)
        if draw(st.booleans()):
            y = g.batch_norm(y, param(cout), param(cout), param(cout), _positive(g, param(cout)))
        act = draw(st.sampled_from([None, "relu", "silu", "gelu", "sigmoid", "hard_swish"]))
        if act:
            y = g.activation(y, act)
        if g.shape_of(y).dims == g.shape_of(x).dims and draw(st.booleans()):
            y = g.add(x, y)
        x, c = y, cout
        _, _, h, w = g.shape_of(x).dims
        if draw(st.integers(0, 3)) == 0 and h >= 2 and w >= 2:
            kind = draw(st.sampled_from(["max", "avg"]))
            x = g.pool(x, kind, 2, draw(st.integers(1, 2)), count_include_pad=False)
            _, _, h, w = g.shape_of(x).dims
    if draw(st.integers(0, 4)) == 0:
        x = g.conv_transpose2d(x, param(c, 2, 2, 2), None, 2, 0)
    g.set_outputs([x])
    return g


def _positive(g, v):
    """A variance: |v| + 0.5."""
    return g.add(g.abs(v), 0.5)


@pytest.mark.parametrize("threads", [1, 2])
@settings(max_examples=10, **FUZZ)
@given(g=conv_stacks())
def test_conv_stacks_run_compiled(threads, g):
    check_compiled(g, threads=threads, bindings=({"batch": 2}, {"batch": 1}))


@settings(max_examples=6, **FUZZ)
@given(g=conv_stacks())
def test_conv_stacks_under_the_bf16_policy(g):
    check_compiled(g, precision="bf16", bindings=({"batch": 2}, {"batch": 1}))


# -- elementwise chains over views ----------------------------------------------------------------
_CHAIN_UNARY = ("relu", "tanh", "sigmoid", "neg", "abs", "gelu", "silu", "square", "exp")
_CHAIN_BINARY = ("add", "sub", "mul", "max", "min")


@st.composite
def view_chains(draw):
    """Elementwise chains whose operands are transposed, narrowed, expanded or reshaped views of
    the inputs and of interior values, broadcasting against each other, with reductions,
    softmax, where and matmuls (by params or transposed / row-broadcast views) in between;
    1-3 outputs."""
    S = bz.Shape
    g = bz.Graph("views", record_provenance=False)
    a, b = draw(st.sampled_from([1, 3, 17])), draw(st.sampled_from([1, 2, 5, 65]))
    x = g.input("x", S(("batch", a, b)))
    y = g.input("y", S((b, a)))
    z = g.input("z", S((1, b)))
    vals = [x, g.transpose(y, (1, 0)), z, g.expand(z, (a, b))]
    for _ in range(draw(st.integers(2, 10))):
        kind = draw(st.sampled_from(["unary", "binary", "binary", "view", "reduce", "softmax",
                                     "where", "matmul"]))
        v = draw(st.sampled_from(vals))
        dims = g.shape_of(v).dims
        if kind == "unary":
            vals.append(g.activation(v, draw(st.sampled_from(_CHAIN_UNARY))))
        elif kind == "binary":
            u = draw(st.sampled_from(vals))
            try:
                vals.append(g.binary(v, u, draw(st.sampled_from(_CHAIN_BINARY))))
            except bz.BrazeError:  # shapes that do not broadcast
                continue
        elif kind == "view":
            axis = draw(st.integers(0, len(dims) - 1))
            if isinstance(dims[axis], int) and dims[axis] > 1:
                start = draw(st.integers(0, dims[axis] - 1))
                vals.append(g.narrow(v, axis, start, draw(st.integers(1, dims[axis] - start))))
            elif len(dims) >= 2:
                perm = tuple(reversed(range(len(dims))))
                vals.append(g.transpose(v, perm))
        elif kind == "reduce" and len(dims) >= 2:
            fn = draw(st.sampled_from(["sum", "mean", "max"]))
            vals.append(g.reduce(v, fn, (len(dims) - 1,), keepdims=True))
        elif kind == "softmax":
            vals.append(g.softmax(v, axis=-1))
        elif kind == "where":
            vals.append(g.where(g.compare(v, 0.0, "gt"), v, g.mul(v, 0.1)))
        elif kind == "matmul" and isinstance(dims[-1], int):
            vals.append(g.matmul(v, _weight_view(draw, g, dims[-1], len(vals))))
    outs = list(dict.fromkeys(draw(st.lists(st.sampled_from(vals[4:] or vals), min_size=1,
                                            max_size=3))))
    g.set_outputs(outs)
    return g


def _weight_view(draw, g: bz.Graph, k: int, tag: int):
    """A [k, m] matmul operand: a param, or a transposed or row-broadcast (stride 0) view."""
    m = draw(st.sampled_from([1, 3, 17]))
    how = draw(st.sampled_from(["plain", "transposed", "broadcast"]))
    if how == "plain":
        return g.param(f"w{tag}", bz.Shape((k, m)))
    if how == "transposed":
        return g.transpose(g.input(f"wt{tag}", bz.Shape((m, k))), (1, 0))
    return g.expand(g.input(f"wrow{tag}", bz.Shape((1, m))), (k, m))


def edge_feeds(g: bz.Graph, seed: int, sym) -> dict:
    """Random feeds with some zeros, large negatives (-1e9, -1e30) and exact ties."""
    feeds = bz.random_feeds(g, seed, sym)
    rng = np.random.default_rng(seed)
    for name, arr in feeds.items():
        if arr.dtype.kind == "f" and arr.size > 1:
            pick = rng.random(arr.shape)
            arr[pick < 0.1] = 0.0
            arr[(pick >= 0.1) & (pick < 0.15)] = -1e9
            arr[(pick >= 0.15) & (pick < 0.18)] = -1e30
            arr[(pick >= 0.18) & (pick < 0.25)] = 1.0
            feeds[name] = arr
    return feeds


@pytest.mark.parametrize("threads", [1, 2])
@settings(max_examples=15, **FUZZ)
@given(g=view_chains())
def test_elementwise_chains_over_views_run_compiled(threads, g):
    check_compiled(g, threads=threads, bindings=({"batch": 2}, {"batch": 3}))


@settings(max_examples=10, **FUZZ)
@given(g=view_chains())
def test_elementwise_chains_with_edge_values(g):
    check_compiled(g, feeds_fn=edge_feeds, bindings=({"batch": 1}, {"batch": 2}))


@pytest.mark.parametrize("precision", ["bf16", "f16"])
@settings(max_examples=4, **FUZZ)
@given(g=view_chains())
def test_elementwise_chains_over_views_under_low_precision_policies(precision, g):
    check_compiled(g, precision=precision, bindings=({"batch": 2}, {"batch": 1}))


# -- attention ------------------------------------------------------------------------------------
@st.composite
def attention_graphs(draw):
    """One attention op (every mask kind; GQA; softcap; scale; key length != query length) on
    q / k / v that are transposed or narrowed views of packed inputs, sometimes after rope, and
    sometimes followed by an output projection."""
    S = bz.Shape
    g = bz.Graph("attn", record_provenance=False)
    hkv = draw(st.sampled_from([1, 2]))
    hq = hkv * draw(st.sampled_from([1, 2, 3]))
    d = draw(st.sampled_from([2, 3, 4, 8]))
    kind = draw(st.sampled_from(["none", "causal", "sliding_window", "custom", "bias"]))
    extra = draw(st.sampled_from([0, 0, 2]))  # keys before the queries (a kv cache)
    sk = "seq" if extra == 0 else 3
    q = g.transpose(g.input("q", S(("batch", "seq", hq, d))), (0, 2, 1, 3))
    if draw(st.booleans()):
        kv = g.input("kv", S(("batch", hkv, sk, 2 * d)))
        k, v = g.narrow(kv, 3, 0, d), g.narrow(kv, 3, d, d)
    else:
        k, v = g.input("k", S(("batch", hkv, sk, d))), g.input("v", S(("batch", hkv, sk, d)))
    if d % 2 == 0 and extra == 0 and draw(st.booleans()):
        cos, sin = g.input("cos", S(("seq", d // 2))), g.input("sin", S(("seq", d // 2)))
        inter = draw(st.booleans())
        q, k = g.rope(q, cos, sin, inter), g.rope(k, cos, sin, inter)
    opts = dict(scale=draw(st.sampled_from([None, 0.3])),
                softcap=draw(st.sampled_from([None, None, 1.5])))
    if kind in ("custom", "bias"):
        dims = ("batch", 1, 1, sk) if kind == "custom" else (1, hq, "seq", sk)
        out = g.attention(q, k, v, g.input("mask", S(dims)), kind=kind, **opts)
    else:
        out = g.attention(q, k, v, kind=kind, window=2 if kind == "sliding_window" else 0,
                          **opts)
    if draw(st.booleans()):
        merged = g.reshape(g.transpose(out, (0, 2, 1, 3)), ("batch", "seq", hq * d))
        out = g.matmul(merged, g.param("wo", S((hq * d, 5))))
    g.set_outputs([out])
    return g


def mask_feeds(g: bz.Graph, seed: int, sym) -> dict:
    """Random feeds; an additive mask is padding-like: 0 or -1e9, some entries -inf and the
    first batch row's mask fully -inf (every key masked: the output row is 0, as in the
    reference's safe softmax)."""
    feeds = bz.random_feeds(g, seed, sym)
    if "mask" in feeds:
        rng = np.random.default_rng(seed)
        m = np.where(rng.random(feeds["mask"].shape) < 0.3, -1e9, 0.0).astype(np.float32)
        m[rng.random(m.shape) < 0.1] = -np.inf
        m[0] = -np.inf
        feeds["mask"] = m
    return feeds


@pytest.mark.parametrize("threads", [1, 2])
@settings(max_examples=15, **FUZZ)
@given(g=attention_graphs())
def test_attention_with_every_mask_kind_runs_compiled(threads, g):
    check_compiled(g, threads=threads, feeds_fn=mask_feeds,
                   bindings=({"batch": 2, "seq": 5}, {"batch": 1, "seq": 1},
                             {"batch": 3, "seq": 17}))


@settings(max_examples=6, **FUZZ)
@given(g=attention_graphs())
def test_attention_under_the_bf16_policy(g):
    check_compiled(g, precision="bf16", feeds_fn=mask_feeds,
                   bindings=({"batch": 2, "seq": 5}, {"batch": 1, "seq": 3}))


@settings(max_examples=4, **FUZZ)
@given(g=random_transformer_graphs(max_layers=1))
def test_transformer_layers_with_padding_masks(g):
    check_compiled(g, feeds_fn=mask_feeds)

# -- regressions ----------------------------------------------------------------------------------
def test_in_place_output_never_overwrites_a_view_the_step_still_reads():
    """a - a[0:1] (a broadcast row of a) used to be written in place into a's buffer: the
    generated region overwrote row 0 first, then read the new row 0 for every later row."""
    g = bz.Graph("narrow_in_place")
    x = g.input("x", bz.Shape((4, 8)))
    a = g.matmul(x, g.param("w", bz.Shape((8, 8))))
    g.set_outputs([g.relu(g.sub(a, g.narrow(a, 0, 0, 1)))])
    exe = check_compiled(g, bindings=({},))
    assert not any(b.shares for b in exe.plan.buffers)


def test_native_kernels_keep_their_contiguous_copies_alive():
    """rope / softmax / activation / gated kernels copy a strided input (a narrow view) to a
    contiguous temporary and used to pass only `_c(x).ctypes.data` to C: the copy was freed
    before the call and its memory reused by the next copy (wrong values or NaN)."""
    S = bz.Shape
    g = bz.Graph("strided")
    kv = g.input("kv", S((3, 2, 17, 16)))
    cos, sin = g.input("cos", S((17, 4))), g.input("sin", S((17, 4)))
    k, v = g.narrow(kv, 3, 0, 8), g.narrow(kv, 3, 8, 8)
    outs = [g.rope(k, cos, sin), g.softmax(v, -1), g.gelu(k),
            g.fused_swiglu(g.narrow(kv, 3, 2, 12))]
    g.set_outputs(outs)
    exe = bz.compile(g, fuse=False)
    names = {kind: impl for _, kind, _, impl in exe.dispatch_report(bz.random_feeds(g, 0)).rows}
    assert names["rope"] == "C rope" and names["softmax"] == "C safe softmax rows"
    for seed in range(4):
        feeds = bz.random_feeds(g, seed)
        _compare_all(bz.interpret(g, feeds), exe(feeds), seed, **F32)


@pytest.mark.parametrize("fuse", [True, False])
def test_gemm_operands_broadcast_along_their_rows_are_not_given_to_blas_as_strided(fuse):
    """An expanded (stride-0) operand has no BLAS leading dimension: matmul, the fused GEMM
    epilogue and attention used to pass stride 0 (MKL: 'parameter incorrect', output left
    unwritten) or the row length (reading past the one real row)."""
    S = bz.Shape
    g = bz.Graph("broadcast_operands")
    x, w = g.input("x", S((3, 4, 5))), g.input("w", S((1, 6)))
    row = g.input("row", S((1, 5)))
    wide = g.expand(w, (5, 6))
    q, k0 = g.input("q", S((2, 1, 1, 4))), g.input("k", S((2, 2, 1, 4)))
    v = g.input("v", S((2, 2, 5, 4)))
    g.set_outputs([
        g.matmul(x, wide),
        g.gelu(g.add(g.matmul(x, wide), g.input("b", S((6,))))),
        g.matmul(g.expand(row, (7, 5)), wide),
        g.attention(g.expand(q, (2, 4, 3, 4)), g.expand(k0, (2, 2, 5, 4)), v, kind="causal"),
    ])
    exe = bz.compile(g, fuse=fuse)
    for seed in (0, 1):
        feeds = bz.random_feeds(g, seed)
        _compare_all(bz.interpret(g, feeds), exe(feeds), seed, **F32)


def test_kernels_above_the_threading_threshold():
    """Memory-bound kernels split across threads only above cc.PARALLEL_MIN_ELEMENTS (2^21):
    regions with broadcasting, norms, softmax, rope and gated halves at 2051 x 1027."""
    S = bz.Shape
    rows, cols = 2051, 1027
    g = bz.Graph("big")
    x, b = g.input("x", S((rows, cols))), g.input("b", S((cols,)))
    h = g.gelu(g.add(g.mul(x, g.input("r", S((rows, 1)))), b))
    cos, sin = g.input("cos", S((rows, 6))), g.input("sin", S((rows, 6)))
    g.set_outputs([
        h, g.layer_norm(g.add(h, x), g.input("gamma", S((cols,))), b), g.softmax(x, -1),
        g.rms_norm(x, b), g.rope(g.input("x4", S((1, 1, rows, 1020))), cos, sin, False, 12),
        g.fused_swiglu(g.narrow(x, 1, 0, 1026)), g.sigmoid(x)])
    assert rows * cols > 1 << 21
    check_compiled(g, threads=2, bindings=({},))


@pytest.mark.parametrize("act", ["silu", "sigmoid", "quick_gelu", "gelu", "gelu_approx", "tanh"])
def test_native_activations_at_large_finite_magnitudes(act):
    """The native activation kernels (and GEMM epilogues) are built with -ffast-math, where
    libmvec's expf gives NaN instead of inf past e^88.7: SiLU / sigmoid / quick GELU of x <= -89
    came out NaN (the reference: 0). Inf and NaN inputs are not promised there."""
    S = bz.Shape
    g = bz.Graph("extremes")
    x = g.input("x", S((4, 24)))
    g.set_outputs([g.activation(x, act),
                   g.activation(g.add(g.matmul(x, g.param("w", S((24, 5)))),
                                      g.input("b", S((5,)))), act)])
    ladder = np.array([-1e30, -1e9, -200, -100, -89, -88, -87, -53, -52, -51, -20, -1e-30,
                       0.0, 1e-30, 20, 51, 52, 87, 88, 89, 100, 1e9, 1e30, -0.0], np.float32)

    def feeds_fn(g, seed, sym):
        feeds = bz.random_feeds(g, seed, sym)
        feeds["x"] = np.stack([ladder, -ladder, ladder[::-1], ladder * 1e-3])
        feeds["b"] = np.array([-1e9, -100.0, 0.0, 100.0, 1e9], np.float32)
        return feeds

    exe = check_compiled(g, bindings=({},), feeds_fn=feeds_fn)
    assert exe.dispatch_report().counts().get("native", 0) >= 1
