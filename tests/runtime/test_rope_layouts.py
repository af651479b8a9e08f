"""RoPE for cos / sin tables broadcasting over any leading dims of x
(runtime/kernels/rope_layouts.py) gives the reference interpreter's bits on fresh random
inputs: x [B, S, H, D] with tables [S, 1, D/2] or [1, S, 1, D/2], x [S, B, H, D] with
[S, 1, 1, D/2] (wav2vec2-conformer before its transpose back), per-batch tables, partial
rotation, interleaved pairs, float64, in place after a producer and in parallel; a
wav2vec2-conformer self-attention imported from PyTorch runs its rope on this kernel."""
import numpy as np
import pytest

import braze as bz
from braze.runtime.kernels import Dispatch, rope_layouts
from braze.runtime.kernels.rope_layouts import table_rows

pytestmark = pytest.mark.skipif(rope_layouts.lib() is None,
                                reason="no C compiler on this machine")

LAYOUTS = [((2, 5, 3, 8), (5, 1, 4), None), ((2, 5, 3, 8), (1, 5, 1, 4), None),
           ((5, 2, 3, 8), (5, 1, 1, 4), None), ((2, 5, 3, 10), (5, 1, 3), 6),
           ((2, 3, 5, 8), (2, 1, 5, 4), None), ((3, 7, 64), (3, 1, 32), None),
           ((4, 6), (1, 3), None), ((1, 9, 2, 16), (9, 1, 6), 12)]


def _rope_graph(x_shape, table_shape, dtype, interleaved, n_rot):
    g = bz.Graph("rope")
    x = g.input("x", bz.Shape(x_shape, dtype))
    cos, sin = (g.input(n, bz.Shape(table_shape, dtype)) for n in ("cos", "sin"))
    g.set_outputs([g.rope(x, cos, sin, interleaved=interleaved, n_rot=n_rot)])
    return g


def _same_bits(g, feeds, threads=None):
    exe = bz.compile(g, "cpu", threads=threads)
    want, got = bz.interpret(g, feeds)[0], exe(feeds)[0]
    assert want.dtype == got.dtype and want.shape == got.shape
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    return exe


def _implementation(exe):
    rows = [(d, impl) for _, k, d, impl in exe.dispatch_report().rows if k == "rope"]
    assert rows and all(d == Dispatch.NATIVE for d, _ in rows), rows
    return rows[0][1]


@pytest.mark.parametrize("dtype", [bz.f32, bz.f64], ids=str)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("x_shape, table_shape, n_rot", LAYOUTS)
def test_rope_any_table_layout_matches_reference(dtype, interleaved, x_shape, table_shape,
                                                 n_rot):
    g = _rope_graph(x_shape, table_shape, dtype, interleaved, n_rot)
    for seed in (0, 1):
        exe = _same_bits(g, bz.random_feeds(g, seed))
        assert _implementation(exe) == "C rope (table row per x row)"


def test_rope_existing_layout_keeps_its_kernel_in_float32_and_gets_one_in_float64():
    """[..., S, D] x [S, D/2] is fused.rope's in float32; in float64 it had none."""
    g = _rope_graph((2, 3, 5, 8), (5, 4), bz.f32, False, None)
    exe = bz.compile(g, "cpu")
    exe(bz.random_feeds(g, 0))
    assert _implementation(exe) == "C rope"
    g64 = _rope_graph((2, 3, 5, 8), (5, 4), bz.f64, False, None)
    assert _implementation(_same_bits(g64, bz.random_feeds(g64, 0))) == \
        "C rope (table row per x row)"


def test_rope_in_place_after_a_producer_and_in_parallel():
    g = bz.Graph("rope_chain")
    x = g.input("x", bz.Shape((8, 128, 40, 64)))
    cos, sin = (g.input(n, bz.Shape((1, 128, 1, 32))) for n in ("cos", "sin"))
    g.set_outputs([g.rope(g.mul(x, 0.5), cos, sin)])
    exe = _same_bits(g, bz.random_feeds(g, 2), threads=2)
    assert _implementation(exe) == "C rope (table row per x row)"


def test_table_rows_broadcast_the_tables_row_numbers():
    assert table_rows((2, 3, 2), (3, 1)).tolist() == [0, 0, 1, 1, 2, 2] * 2
    assert table_rows((3, 2, 2), (3, 1, 1)).tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    assert table_rows((2, 2), (2, 2)).tolist() == [0, 1, 2, 3]


def test_wav2vec2_conformer_rotary_attention_runs_this_kernel():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import Wav2Vec2ConformerConfig
    from transformers.models.wav2vec2_conformer import modeling_wav2vec2_conformer as hf

    cfg = Wav2Vec2ConformerConfig(hidden_size=32, num_attention_heads=4,
                                  position_embeddings_type="rotary")

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rotary = hf.Wav2Vec2ConformerRotaryPositionalEmbedding(cfg)
            self.attn = hf.Wav2Vec2ConformerSelfAttention(cfg)

        def forward(self, x):
            return self.attn(x, relative_position_embeddings=self.rotary(x))[0]

    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(2, 11, 32)
    g = bz.import_torch(model, (x,))
    exe = bz.compile(g, "cpu")
    out = exe({g.inputs[0].op.name: x.numpy()})[0]
    with torch.no_grad():
        np.testing.assert_allclose(out, model(x).numpy(), rtol=1e-4, atol=1e-5)
    assert _implementation(exe) == "C rope (table row per x row)"
