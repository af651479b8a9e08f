"""Hugging Face GPT-2 and LLaMA decode steps (a DynamicCache from plain tensors, one new token
or a chunk of three) imported through `bz.import_torch` and through torch.onnx (TorchScript
with sdpa and eager attention, dynamo): every layer's attention fuses into a FusedAttentionBlock
with a KV cache (causal without a mask input, a padding mask with one), no attention miss is
left, and the fused graph and the compiled executor reproduce PyTorch, present keys and values
included. Mistral (sliding window), Qwen2, Gemma and Phi steps fuse too. A BART decoder step
fuses its self-attention with the cache; its cross-attention reads cached encoder keys /
values and stays an attention op, with a reason."""
import inspect
import warnings

import numpy as np
import pytest
import torch

import braze as bz
from braze.models.hf_decode import decode_input_names, decode_inputs, hf_decode_module
from braze.runtime.kernels import Dispatch

SIZES = ({"past": 5, "seq": 1}, {"past": 3, "seq": 3})


def _import(m, how, tmp_path):
    names = decode_input_names(m)
    feeds = decode_inputs(m, **SIZES[1])
    args = tuple(torch.from_numpy(feeds[n]) for n in names)
    if how == "torch":
        return bz.import_torch(m, args)
    path = str(tmp_path / "decode.onnx")
    outs = ["hidden"] + [f"present_{kv}{i}" for i in range(m.num_layers) for kv in "kv"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if how == "dynamo":
            torch.onnx.export(m, args, path, input_names=names, output_names=outs, dynamo=True,
                              external_data=False, verbose=False)
        else:
            axes = {n: {0: "batch", 2: "past"} for n in names if n.startswith("past_")}
            axes["input_ids"] = {0: "batch", 1: "seq"}
            if m.with_mask:
                axes["attention_mask"] = {0: "batch", 1: "total"}
            torch.onnx.export(m, args, path, input_names=names, output_names=outs,
                              dynamic_axes=axes, opset_version=17, dynamo=False)
    return bz.import_onnx(path)


def _torch_outputs(m, feeds):
    with torch.no_grad():
        return [t.numpy() for t in m(*(torch.from_numpy(feeds[n])
                                       for n in decode_input_names(m)))]


def _feeds(g, feeds):
    names = [n.op.name for n in g.inputs]
    if set(names) <= set(feeds):
        return {n: feeds[n] for n in names}
    return dict(zip(names, feeds.values()))  # import_torch names the inputs by argument


CASES = [(f, how, attn, mask) for f in ("gpt2", "llama")
         for how, attn in (("torch", "sdpa"), ("torch", "eager"), ("ts", "sdpa"),
                           ("ts", "eager"), ("dynamo", "sdpa"))
         for mask in (True, False) if not (how == "dynamo" and not mask)]


@pytest.mark.parametrize("family, how, attn, with_mask", CASES)
def test_every_decode_step_attention_fuses_with_its_cache(family, how, attn, with_mask,
                                                          tmp_path):
    m = hf_decode_module(family, attn=attn, with_mask=with_mask)
    g = _import(m, how, tmp_path)
    fused, report = bz.fuse(g, "cpu")
    blocks = [n for n in fused.nodes if n.op.kind == "fused_attention_block"]
    assert len(blocks) == m.num_layers and all(b.op.kv_cache for b in blocks)
    assert fused.count("attention") == 0
    assert not [x for x in report.missed if "Attention" in x.pattern], report.missed
    if not with_mask and how != "dynamo":  # dynamo folds the static mask into a tensor
        assert {b.op.mask.value for b in blocks} == {"causal"}
    # torch.export and dynamo imports keep the example's static shapes; TorchScript's are
    # dynamic (batch, past, seq)
    sizes = SIZES[1:] if how in ("torch", "dynamo") else SIZES + ({"past": 2, "seq": 2},)
    for size in sizes:
        feeds = decode_inputs(m, **size)
        want = _torch_outputs(m, feeds)
        got = bz.interpret(fused, _feeds(fused, feeds))
        assert len(got) == len(want)
        for a, w in zip(got, want, strict=True):
            np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_the_compiled_decode_step_matches_pytorch(family, tmp_path):
    m = hf_decode_module(family, attn="sdpa", with_mask=False)
    g = _import(m, "ts", tmp_path)
    exe = bz.compile(g, "cpu")
    for size in SIZES:
        feeds = decode_inputs(m, **size)
        rows = [r for r in exe.dispatch_report(_feeds(g, feeds)).rows
                if r[1] == "fused_attention_block"]
        assert len(rows) == m.num_layers and all(r[2] == Dispatch.NATIVE for r in rows), rows
        for a, w in zip(exe(_feeds(g, feeds)), _torch_outputs(m, feeds), strict=True):
            np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-4)


class BartDecodeStep(torch.nn.Module):
    """A BART decoder step: (ids, encoder states, then per layer the self-attention cache k, v
    and the cross-attention cache k, v) -> (hidden, present self-attention k, v per layer)."""

    def __init__(self, model, layers=2):
        super().__init__()
        self.decoder, self.layers = model.decoder, layers

    def forward(self, ids, enc, *past):
        import transformers

        own, cross = transformers.DynamicCache(), transformers.DynamicCache()
        for i in range(self.layers):
            own.update(past[4 * i], past[4 * i + 1], i)
            cross.update(past[4 * i + 2], past[4 * i + 3], i)
        cache = transformers.EncoderDecoderCache(own, cross)
        params = inspect.signature(type(self.decoder).forward).parameters
        kw = {"cache" if "cache" in params else "past_key_values": cache}
        out = self.decoder(input_ids=ids, encoder_hidden_states=enc, use_cache=True, **kw)
        return (out.last_hidden_state,
                *(t for layer in own.layers[:self.layers] for t in (layer.keys, layer.values)))


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_bart_decoder_step_fuses_its_self_attention_with_the_cache(attn):
    """The self-attention fuses with its cache; the cross-attention reads the cached encoder
    keys / values as they are (nothing to project), stays an attention op, and says so."""
    import transformers

    from braze.models.hf import perturb_weights

    cfg = transformers.BartConfig(vocab_size=128, d_model=64, encoder_layers=2,
                                  decoder_layers=2, encoder_attention_heads=4,
                                  decoder_attention_heads=4, encoder_ffn_dim=128,
                                  decoder_ffn_dim=128, max_position_embeddings=64)
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    model = transformers.BartModel(cfg).eval()
    perturb_weights(model, 0)
    m = BartDecodeStep(model).eval()
    rng = np.random.default_rng(0)
    b, past, seq, src = 2, 5, 3, 7
    arrays = [rng.integers(0, 128, (b, seq)).astype(np.int64),
              rng.standard_normal((b, src, 64)).astype(np.float32)]
    for _ in range(2):
        arrays += [rng.standard_normal((b, 4, n, 16)).astype(np.float32)
                   for n in (past, past, src, src)]
    args = tuple(torch.from_numpy(a) for a in arrays)
    g = bz.import_torch(m, args)
    fused, report = bz.fuse(g, "cpu")
    blocks = [n for n in fused.nodes if n.op.kind == "fused_attention_block"]
    assert len(blocks) == 2 and all(x.op.kv_cache for x in blocks)
    assert fused.count("attention") == 2
    misses = [x for x in report.missed if x.pattern == "FuseAttentionBlock"]
    assert len(misses) == 2 and all("cache" in x.hint for x in misses)
    with torch.no_grad():
        want = [t.numpy() for t in m(*args)]
    got = bz.interpret(fused, dict(zip([n.op.name for n in fused.inputs], arrays)))
    for a, w in zip(got, want, strict=True):
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family, mask", [("mistral", "sliding_window"), ("qwen2", "causal"),
                                          ("gemma", "causal"), ("phi", "causal")])
def test_other_decoder_families_fuse_their_decode_steps(family, mask, tmp_path):
    """Mistral's sliding window over a cache (query i sees the `window` keys ending at P + i),
    Qwen2's biased projections, Gemma's multi-query heads, Phi's partial rope: each step's
    attention becomes a block with the cache, and compiled it matches PyTorch."""
    m = hf_decode_module(family, with_mask=False)
    g = _import(m, "torch", tmp_path)
    fused, _ = bz.fuse(g, "cpu")
    blocks = [n for n in fused.nodes if n.op.kind == "fused_attention_block"]
    assert len(blocks) == m.num_layers and fused.count("attention") == 0
    assert {(b.op.kv_cache, b.op.mask.value) for b in blocks} == {(True, mask)}
    feeds = decode_inputs(m, **SIZES[1])
    exe = bz.compile(g, "cpu")
    for a, w in zip(exe(_feeds(g, feeds)), _torch_outputs(m, feeds), strict=True):
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-4)
