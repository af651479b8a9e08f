"""A KV-cache decode step's FusedAttentionBlock exports for ONNX Runtime as MultiHeadAttention
with past_key / past_value, its present outputs the block's present keys / values; ONNX Runtime
reproduces braze's interpreter, and the exported model imports and fuses back (causal mask).
A block ORT's MultiHeadAttention cannot express (GQA) exports as its decomposition."""
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import braze as bz

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from test_fuse_attention_block_kv_cache import SYMS, decode_block  # noqa: E402


def _export(g, tmp_path):
    fused, _ = bz.fuse(g, "onnxruntime")
    params = bz.init_params(g, 0)
    path = str(tmp_path / "decode.onnx")
    bz.export_onnx(fused, path, target="onnxruntime", params=params)
    return path, params


def _matches_ort(g, path, params):
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for syms in SYMS:
        feeds = bz.random_feeds(g, 0, syms)
        want = bz.interpret(g, feeds, params)
        got = sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})
        assert len(got) == 3
        for a, w in zip(got, want, strict=True):
            np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mask", ["causal", "custom", None])
def test_a_decode_block_exports_as_multi_head_attention_with_past(mask, tmp_path):
    g = decode_block(packed=True, mask=mask)
    path, params = _export(g, tmp_path)
    mha = [n for n in onnx.load(path).graph.node if n.op_type == "MultiHeadAttention"]
    assert len(mha) == 1 and len(mha[0].output) == 3 and all(mha[0].output)
    assert [bool(x) for x in mha[0].input[6:8]] == [True, True]  # past_key, past_value
    _matches_ort(g, path, params)
    if mask == "causal":  # no isnan guard: every query sees a key, and the model fuses back
        back, report = bz.fuse(bz.import_onnx(path), "cpu")
        (block,) = [n for n in back.nodes if n.op.kind == "fused_attention_block"]
        assert block.op.kv_cache and block.op.mask.value == "causal"


def test_a_gqa_decode_block_exports_its_decomposition(tmp_path):
    g = decode_block(kv_heads=2)
    path, params = _export(g, tmp_path)
    assert "MultiHeadAttention" not in {n.op_type for n in onnx.load(path).graph.node}
    _matches_ort(g, path, params)
