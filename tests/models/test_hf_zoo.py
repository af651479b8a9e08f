"""The Hugging Face zoo itself: every family builds, exports in every variant, and braze's
import of each export reproduces PyTorch (padded positions included). Fusion expectations per
family live in tests/models/test_hf_fusion.py."""
import numpy as np
import pytest
import torch

import braze as bz
from braze.models.hf import HF_FAMILIES, family_variants, hf_inputs, variant_attn

CASES = [(f, v) for f in sorted(HF_FAMILIES) for v in family_variants(f)]


@pytest.mark.parametrize("family,variant", CASES)
def test_imported_export_matches_pytorch(hf_zoo, family, variant):
    g = hf_zoo.graph(family, variant)
    m = hf_zoo.module(family, variant_attn(family, variant))
    feeds = hf_inputs(3, 6, vocab=m.vocab_size, seed=1)           # not the export's 2 x 8
    with torch.no_grad():
        want = m(*(torch.from_numpy(feeds[k]) for k in ("input_ids", "attention_mask"))).numpy()
    (got,) = bz.interpret(g, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert g.shape_of(g.outputs[0]).dims[:2] == ("batch", "seq")


def test_perturbed_weights_are_not_identity(hf_zoo):
    m = hf_zoo.module("bert")
    ln = m.model.embeddings.LayerNorm
    assert not torch.allclose(ln.weight, torch.ones_like(ln.weight))
    assert not torch.allclose(ln.bias, torch.zeros_like(ln.bias))
