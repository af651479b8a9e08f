"""`bz.import_torch` of statistics and norms: var / std (integral and float corrections, as
torch.export writes them), linalg_vector_norm (every ord, F.normalize, .norm()), batch norm with
batch statistics (InstanceNorm, BatchNorm without running stats, BiT's weight standardization);
each checked through the interpreter and the compiled CPU executor against PyTorch at two
sizes of the dynamic dims. Also: a dim named dynamic that torch.export specializes is refused
with an error naming it, and an unsupported op in the top-level forward is not reported as a
module named after the op."""
from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import braze as bz  # noqa: E402
from braze.errors import FrontendError, UnsupportedOpsError  # noqa: E402


class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _outputs(y) -> list[np.ndarray]:
    ys = y if isinstance(y, (tuple, list)) else (y,)
    return [t.detach().numpy() for t in ys]


def _check(module, shapes, dynamic, rtol=1e-5, atol=1e-5, seed=0):
    """Import at shapes[0]; interpret and run compiled at every shape, against PyTorch."""
    module = module.eval()
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    g = bz.import_torch(module, (torch.from_numpy(xs[0]),), dynamic_shapes=dynamic)
    name = g.inputs[0].op.name
    exe = bz.compile(g, "cpu")
    for x in xs:
        with torch.no_grad():
            want = _outputs(module(torch.from_numpy(x)))
        for how, got in (("interpret", bz.interpret(g, {name: x})), ("compiled", exe({name: x}))):
            assert len(got) == len(want)
            for a, b in zip(got, want):
                assert a.shape == b.shape and a.dtype == b.dtype, (how, x.shape, a.dtype)
                np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"{how} {x.shape}")
    return g


# -- var / std ------------------------------------------------------------------------------------
VAR_FORMS = {
    "var_last": lambda x: x.var(-1),
    "std_last_keepdim": lambda x: x.std(-1, keepdim=True),
    "var_dims_correction0": lambda x: torch.var(x, dim=(1, 2), correction=0),
    "var_biased": lambda x: x.var(-1, unbiased=False),
    "var_all": lambda x: x.var(),
    "std_all": lambda x: x.std(),
    "var_correction2": lambda x: torch.var(x, 1, correction=2),
    "std_float_correction": lambda x: torch.std(x, (0, 2), correction=0.5, keepdim=True),
    "var_mean": lambda x: torch.var_mean(x, -1),
    "std_mean_float_correction": lambda x: torch.std_mean(x, (1, 2), correction=1.5,
                                                          keepdim=True),
    "var_mean_all_biased": lambda x: torch.var_mean(x, correction=0),
}


@pytest.mark.parametrize("form", sorted(VAR_FORMS))
def test_var_and_std_match_pytorch_at_two_dynamic_sizes(form):
    g = _check(_Fn(VAR_FORMS[form]), [(2, 5, 8), (3, 7, 8)], {"x": ("batch", "seq", None)})
    assert set(g.dynamic_symbols()) == {"batch", "seq"}


def test_var_with_static_dims_folds_the_correction_to_a_constant():
    g = _check(_Fn(lambda x: x.std(-1) + x.var(1, keepdim=True).mean()), [(2, 5, 8)], None)
    assert not g.dynamic_symbols()


# -- linalg_vector_norm ---------------------------------------------------------------------------
ORDS = [2, 1, math.inf, -math.inf, 0, 3, 0.5, -1.5]


@pytest.mark.parametrize("ord_", ORDS, ids=str)
@pytest.mark.parametrize("dim,keepdim", [(None, False), (-1, True), ((0, 2), False)],
                         ids=["all", "last_keepdim", "dims_0_2"])
def test_vector_norm_matches_pytorch_at_two_dynamic_sizes(ord_, dim, keepdim):
    def fn(x):
        return torch.linalg.vector_norm(x, ord_, dim=dim, keepdim=keepdim)

    _check(_Fn(fn), [(2, 5, 8), (3, 7, 8)], {"x": ("batch", "seq", None)}, rtol=1e-4)


NORM_FORMS = {
    "normalize": lambda x: F.normalize(x, dim=-1),
    "normalize_p1_dim1": lambda x: F.normalize(x, p=1.0, dim=1),
    "tensor_norm": lambda x: x.norm(),
    "tensor_norm_p1_dim1": lambda x: x.norm(p=1, dim=1),
    "linalg_norm_last": lambda x: torch.linalg.norm(x, dim=-1),
    "vector_norm_f64": lambda x: torch.linalg.vector_norm(x, 3.0, dim=(0, 2), keepdim=True,
                                                          dtype=torch.float64),
}


@pytest.mark.parametrize("form", sorted(NORM_FORMS))
def test_norm_spellings_match_pytorch(form):
    _check(_Fn(NORM_FORMS[form]), [(2, 5, 8), (3, 7, 8)], {"x": ("batch", "seq", None)},
           rtol=1e-4)


def test_vector_norm_in_f64_keeps_torchs_dtype():
    g = bz.import_torch(_Fn(NORM_FORMS["vector_norm_f64"]).eval(), (torch.randn(2, 5, 8),))
    assert str(g.shape_of(g.outputs[0]).dtype) == "f64"


# -- batch norm with batch statistics (_native_batch_norm_legit.no_stats) -------------------------
@pytest.mark.parametrize("affine", [False, True])
def test_instance_norm_1d(affine):
    m = torch.nn.InstanceNorm1d(4, affine=affine)
    if affine:
        with torch.no_grad():
            m.weight.uniform_(0.5, 1.5)
            m.bias.normal_()
    _check(m, [(2, 4, 9), (3, 4, 6)], {"input": {0: "batch", 2: "length"}})


@pytest.mark.parametrize("affine", [False, True])
def test_instance_norm_2d(affine):
    m = torch.nn.InstanceNorm2d(3, affine=affine, eps=1e-3)
    if affine:
        with torch.no_grad():
            m.weight.uniform_(0.5, 1.5)
            m.bias.normal_()
    _check(m, [(2, 3, 6, 5), (3, 3, 4, 7)], {"input": {0: "batch", 2: "h", 3: "w"}})


class _WSConv(torch.nn.Conv2d):
    """BiT's weight-standardized conv (transformers' WeightStandardizedConv2d)."""

    def forward(self, x):
        w = F.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None,
                         training=True, momentum=0.0, eps=1e-6).reshape_as(self.weight)
        return F.conv2d(x, w, self.bias, self.stride, self.padding)


def test_weight_standardized_conv():
    torch.manual_seed(0)
    _check(_WSConv(3, 8, 3, padding=1), [(2, 3, 10, 12), (1, 3, 7, 9)],
           {"x": {0: "batch", 2: "h", 3: "w"}}, rtol=1e-4, atol=1e-4)


class _ConvBatchStats(torch.nn.Module):
    """A conv then a BatchNorm2d without running statistics (batch statistics in eval too)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4, track_running_stats=False)
        with torch.no_grad():
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.normal_()

    def forward(self, x):
        return self.bn(self.conv(x))


def test_batch_norm_without_running_stats_after_a_conv_is_not_folded_as_inference():
    torch.manual_seed(0)
    m = _ConvBatchStats()
    g = _check(m, [(2, 3, 8, 8), (3, 3, 6, 9)], {"x": {0: "batch", 2: "h", 3: "w"}},
               rtol=1e-4, atol=1e-4)
    assert g.count("batch_norm") == 0
    fused, _ = bz.fuse(g, "cpu")
    x = np.random.default_rng(1).standard_normal((2, 3, 7, 7)).astype(np.float32)
    with torch.no_grad():
        want = m(torch.from_numpy(x)).numpy()
    (got,) = bz.interpret(fused, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


class _BatchStatsOutputs(torch.nn.Module):
    """The op itself, reading its save_mean and save_invstd outputs."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(3) + 0.5)
        self.bias = torch.nn.Parameter(torch.randn(3))

    def forward(self, x):
        y, mean, invstd = torch.ops.aten._native_batch_norm_legit(x, self.weight, self.bias,
                                                                  True, 0.1, 1e-5)
        return y, mean, invstd


def test_batch_stats_op_returns_output_mean_and_invstd():
    _check(_BatchStatsOutputs(), [(2, 3, 5), (4, 3, 2)], {"x": {0: "batch", 2: "length"}},
           rtol=1e-4, atol=1e-5)


# -- a dim named dynamic that torch.export specialized --------------------------------------------
class _FixedSeq(torch.nn.Module):
    def forward(self, x):  # [B, S, 4]: the reshape only works for S == 6
        return x.reshape(x.shape[0], 2, 3, 4).sum(1)


def test_a_named_dim_torch_specialized_is_an_error_naming_input_axis_and_size():
    with pytest.raises(FrontendError) as e:
        bz.import_torch(_FixedSeq().eval(), (torch.randn(2, 6, 4),),
                        dynamic_shapes={"x": {0: "batch", 1: "seq"}})
    msg = str(e.value)
    assert "dim 1 of input 'x'" in msg and "'seq'" in msg and "specialized it to 6" in msg
    assert "leave dim 1 of 'x' out of dynamic_shapes" in msg


def test_an_example_size_of_one_for_a_named_dim_is_an_error():
    with pytest.raises(FrontendError, match="dim 0 of input 'x' was named 'batch'.*to 1"):
        bz.import_torch(_Fn(lambda x: x * 2.0).eval(), (torch.randn(1, 5),),
                        dynamic_shapes={"x": ("batch", "seq")})


def test_the_dims_torch_keeps_dynamic_still_import():
    _check(_FixedSeq(), [(2, 6, 4), (5, 6, 4)], {"x": {0: "batch"}})


# -- where an unsupported op is reported ----------------------------------------------------------
class _Inner(torch.nn.Module):
    def forward(self, x):
        return torch.fft.rfft(x).abs()


class _Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Inner()

    def forward(self, x):
        return torch.fft.rfft(self.inner(x)).abs()


def test_unsupported_op_names_its_module_or_the_top_level_forward():
    with pytest.raises(UnsupportedOpsError) as e:
        bz.import_torch(_Inner().eval(), (torch.randn(2, 8),))
    assert "in the top-level module's forward" in str(e.value)
    assert "in module '_fft_r2c'" not in str(e.value)
    with pytest.raises(UnsupportedOpsError, match="in module 'inner'"):
        bz.import_torch(_Outer().eval(), (torch.randn(2, 8),))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_rms_norm_without_eps_takes_the_eps_torch_computes_with(dtype):
    """nn.RMSNorm(eps=None) adds the eps of its compute type: float32's for f16 / bf16 inputs
    (not float16's 2**-10, which moves small activations' norms by tens of percent)."""
    dt = getattr(torch, dtype)
    m = torch.nn.RMSNorm(8).to(dt).eval()
    x = (torch.randn(2, 8, generator=torch.Generator().manual_seed(0)) * 0.05).to(dt)
    g = bz.import_torch(m, (x,))
    (n,) = [n for n in g.nodes if n.op.kind == "rms_norm"]
    assert n.op.eps == torch.finfo(torch.float64 if dtype == "float64" else torch.float32).eps
    feed = x.float().numpy().astype(g.shape(g.inputs[0].value).dtype.np)
    got = bz.interpret(g, {g.inputs[0].op.name: feed})[0].astype(np.float64)
    want = m(x).detach().double().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)
