"""Hugging Face encoder-decoders (BART, Marian, T5, Whisper: a decoder over the encoder output)
and MobileBERT (values from the layer input, queries and keys from the bottleneck), from small
configs with random weights, imported from ONNX (TorchScript exporter, eager and sdpa attention)
and through `bz.import_torch`: every self- and cross-attention fuses into a FusedAttentionBlock,
no attention miss is left, and the fused graph reproduces PyTorch (padded source, S_kv != S) in
the interpreter, the compiled executor and ONNX Runtime."""
import functools
import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch

import braze as bz
from braze.ir.ops.fused import QkvInputs
from braze.models.hf import perturb_weights
from braze.runtime.kernels import Dispatch

VOCAB, SRC, TGT = 128, 8, 5
_SEQ2SEQ = dict(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2,
                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                decoder_ffn_dim=128, max_position_embeddings=64, pad_token_id=1,
                decoder_start_token_id=2)
CONFIGS = {
    "bart": ("BartConfig", "BartModel", _SEQ2SEQ),
    "marian": ("MarianConfig", "MarianModel", _SEQ2SEQ),
    "t5": ("T5Config", "T5Model", dict(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128,
                                       num_layers=2, num_heads=4,
                                       relative_attention_num_buckets=8,
                                       relative_attention_max_distance=16)),
    "mobilebert": ("MobileBertConfig", "MobileBertModel",
                   dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64, intra_bottleneck_size=32,
                        embedding_size=32, max_position_embeddings=64,
                        num_feedforward_networks=2)),
}
# family -> blocks per layout once fused (2 encoder and 2 decoder layers; MobileBERT 2 layers)
LAYOUTS = {f: {QkvInputs.SELF: 4, QkvInputs.CROSS: 2} for f in ("bart", "marian", "t5")}
LAYOUTS["mobilebert"] = {QkvInputs.SEPARATE_V: 2}
IMPORTS = ("eager", "sdpa", "torch")


class Seq2SeqHidden(torch.nn.Module):
    """(input_ids, attention_mask, decoder_input_ids) -> the decoder's last hidden state."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, decoder_input_ids):
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          decoder_input_ids=decoder_input_ids, use_cache=False).last_hidden_state


class AudioSeq2SeqHidden(torch.nn.Module):
    """(input_features, decoder_input_ids) -> the decoder's last hidden state (Whisper)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_features, decoder_input_ids):
        return self.model(input_features=input_features, decoder_input_ids=decoder_input_ids,
                          use_cache=False).last_hidden_state


class EncoderHidden(torch.nn.Module):
    """(input_ids, attention_mask) -> the last hidden state."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def module(family: str, attn: str):
    import transformers

    cfg_cls, model_cls, kw = CONFIGS[family]
    torch.manual_seed(0)
    cfg = getattr(transformers, cfg_cls)(**kw)
    cfg._attn_implementation = attn
    model = getattr(transformers, model_cls)(cfg).eval()
    perturb_weights(model, 0)
    wrap = EncoderHidden if family == "mobilebert" else Seq2SeqHidden
    return wrap(model).eval()


def feeds(family: str, batch: int, src: int, tgt: int, seed: int) -> dict[str, np.ndarray]:
    """Token ids, a source mask with the second row's last two positions padded, and (for the
    encoder-decoders) decoder ids of another length."""
    rng = np.random.default_rng(seed)
    out = {"input_ids": rng.integers(3, VOCAB, (batch, src)),
           "attention_mask": np.ones((batch, src), np.int64)}
    out["attention_mask"][min(1, batch - 1), src - 2:] = 0
    if family != "mobilebert":
        out["decoder_input_ids"] = rng.integers(3, VOCAB, (batch, tgt))
    return out


def _onnx(m, names, args, path) -> str:
    axes = {n: {0: "batch", 1: "tgt" if n.startswith("decoder") else "src"} for n in names}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, args, path, input_names=names, output_names=["hidden"],
                          dynamic_axes=axes, opset_version=17, dynamo=False)
    return path


@functools.cache
def imported(family: str, how: str, tmp: str):
    """(torch module, imported graph, cpu-fused graph, report), once per session."""
    m = module(family, "sdpa" if how == "torch" else how)
    ex = feeds(family, 2, SRC, TGT, seed=1)
    names = list(ex)
    args = tuple(torch.from_numpy(ex[n]) for n in names)
    if how == "torch":
        g = bz.import_torch(m, args)
    else:
        g = bz.import_onnx(_onnx(m, names, args, f"{tmp}/{family}_{how}.onnx"))
    fused, report = bz.fuse(g, "cpu")
    return m, g, fused, report


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("hf_cross"))


def _want(m, f):
    with torch.no_grad():
        return m(*(torch.from_numpy(v) for v in f.values())).numpy()


def _by_position(g, f):
    """Feeds keyed by the graph's input names (import_torch names them its own way)."""
    return {i.op.name: v for i, v in zip(g.inputs, f.values())}


def _sizes(how):
    """Static torch imports run at the traced sizes; ONNX imports also at others."""
    return [(2, SRC, TGT)] if how == "torch" else [(2, SRC, TGT), (3, 6, 9)]


@pytest.mark.parametrize("how", IMPORTS)
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_every_self_and_cross_attention_fuses_and_matches_pytorch(family, how, tmp):
    m, g, fused, report = imported(family, how, tmp)
    layouts = {}
    for n in fused.nodes:
        if n.op.kind == "fused_attention_block":
            layouts[n.op.qkv_inputs] = layouts.get(n.op.qkv_inputs, 0) + 1
    assert layouts == LAYOUTS[family], report
    assert fused.count("attention") == 0
    assert not [x for x in report.misses if "ttention" in x.pattern], report.misses
    for batch, src, tgt in _sizes(how):
        f = feeds(family, batch, src, tgt, seed=3)
        want = _want(m, f)
        (got,) = bz.interpret(fused, _by_position(g, f))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["bart", "t5", "mobilebert"])
def test_compiled_executor_and_onnxruntime_match_pytorch(family, tmp):
    m, g, fused, _ = imported(family, "eager", tmp)
    f = feeds(family, 2, SRC, TGT, seed=5)
    want = _want(m, f)
    exe = bz.compile(fused, target="cpu")
    np.testing.assert_allclose(exe(f)[0], want, rtol=1e-4, atol=1e-4)
    rows = [r for r in exe.dispatch_report().rows if r[1] == "fused_attention_block"]
    assert rows and all(r[2] == Dispatch.NATIVE for r in rows)
    ort_fused, _ = bz.fuse(g, "onnxruntime")
    assert ort_fused.count("fused_attention_block") == sum(LAYOUTS[family].values())
    path = bz.export_onnx(ort_fused, f"{tmp}/{family}_fused.onnx", target="onnxruntime")
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, f)[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["bart", "t5"])  # post-norm and pre-norm layers
def test_whole_layers_take_the_cross_attention_and_say_why_not_the_self_attention(family, tmp):
    m, g, _, _ = imported(family, "eager", tmp)
    fused, report = bz.fuse(g, "cpu", transformer_layer=True)
    layers = [n.op for n in fused.nodes if n.op.kind == "fused_transformer_layer"]
    assert sorted(op.attn.qkv_inputs.value for op in layers) == ["cross"] * 2 + ["self"] * 2
    blocks = [n.op for n in fused.nodes if n.op.kind == "fused_attention_block"]
    assert [op.qkv_inputs for op in blocks] == [QkvInputs.SELF] * 2  # the decoder's
    why = [x for x in report.misses if x.pattern == "FuseTransformerLayer"]
    assert len(why) == 2 and all("cross-attention" in x.detail for x in why), why
    f = feeds(family, 2, SRC, TGT, seed=7)
    (got,) = bz.interpret(fused, f)
    np.testing.assert_allclose(got, _want(m, f), rtol=1e-4, atol=1e-4)


def test_whisper_decoder_over_the_audio_encoder_fuses_through_import_torch():
    """Whisper through bz.import_torch (its TorchScript ONNX export fails in torch itself:
    aten::diff has no ONNX symbolic at opset 17)."""
    import transformers

    torch.manual_seed(0)
    kw = {k: v for k, v in _SEQ2SEQ.items() if k != "max_position_embeddings"}
    cfg = transformers.WhisperConfig(**kw, num_mel_bins=16, max_source_positions=8,
                                     max_target_positions=16)
    cfg._attn_implementation = "sdpa"
    model = transformers.WhisperModel(cfg).eval()
    perturb_weights(model, 0)
    m = AudioSeq2SeqHidden(model).eval()
    rng = np.random.default_rng(2)
    f = {"input_features": rng.standard_normal((2, 16, 16)).astype(np.float32),
         "decoder_input_ids": rng.integers(3, VOCAB, (2, TGT))}
    args = tuple(torch.from_numpy(v) for v in f.values())
    g = bz.import_torch(m, args)
    fused, report = bz.fuse(g, "cpu")
    layouts = sorted(n.op.qkv_inputs.value for n in fused.nodes
                     if n.op.kind == "fused_attention_block")
    assert layouts == ["cross"] * 2 + ["self"] * 4 and fused.count("attention") == 0, report
    assert not [x for x in report.misses if "ttention" in x.pattern], report.misses
    (got,) = bz.interpret(fused, _by_position(g, f))
    want = _want(m, f)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
