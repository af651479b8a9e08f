"""The Hugging Face zoo through the compiled CPU executor: each family's ONNX export (the cached
exports of the zoo tests), imported, fused and compiled with `bz.compile`, reproduces PyTorch
and the reference interpreter within 1e-4 of the output's scale, at two bindings of batch / seq
on one Executable (padded positions included); under the bf16 policy it matches the
interpreter run of the same policy graph within 1e-3 and PyTorch's float32 loosely."""
import numpy as np
import pytest
import torch

import braze as bz
from braze.models.hf import HF_FAMILIES, family_variants, hf_inputs, variant_attn

CASES = [(f, family_variants(f)[0]) for f in sorted(HF_FAMILIES)]


def _torch_output(m, feeds) -> np.ndarray:
    with torch.no_grad():
        return m(*(torch.from_numpy(feeds[k]) for k in ("input_ids", "attention_mask"))).numpy()


@pytest.mark.parametrize("family,variant", CASES)
def test_compiled_export_matches_pytorch_and_the_interpreter(hf_zoo, family, variant):
    g = hf_zoo.graph(family, variant)
    m = hf_zoo.module(family, variant_attn(family, variant))
    exe = bz.compile(g, "cpu", threads=2)
    for seed, (batch, seq) in enumerate(((3, 6), (1, 5))):
        feeds = hf_inputs(batch, seq, vocab=m.vocab_size, seed=seed + 1)
        want = _torch_output(m, feeds)
        (ref,) = bz.interpret(g, feeds)
        (got,) = exe(feeds)
        scale = 1e-4 * np.abs(want).max()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=scale)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=scale)
    assert exe.dispatch_report().counts().get("native", 0) > 0


@pytest.mark.parametrize("family,variant", CASES[::4])
def test_compiled_export_under_the_bf16_policy(hf_zoo, family, variant):
    g = hf_zoo.graph(family, variant)
    m = hf_zoo.module(family, variant_attn(family, variant))
    exe = bz.compile(g, "cpu", precision="bf16")
    feeds = hf_inputs(2, 7, vocab=m.vocab_size, seed=4)
    (got,) = exe(feeds)
    (policy,) = bz.interpret(exe.graph, feeds)
    np.testing.assert_allclose(got, policy, rtol=1e-3, atol=1e-3 * np.abs(policy).max())
    want = _torch_output(m, feeds)
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert err < 5e-2, f"{family}: bf16 relative L2 error {err:.3g} against float32 PyTorch"
