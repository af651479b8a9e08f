"""Bad arguments to the pass API are braze errors naming the argument: fusion limits below 1
(or not whole numbers), and run_passes given something that is no pass (a pass's name)."""
import pytest

import braze as bz
from braze.passes.limits import FusionLimits, with_fusion_limits


@pytest.mark.parametrize("kw", [dict(max_steps=-2), dict(max_steps=0), dict(max_inputs=1.5),
                                dict(max_inputs=True)])
def test_fusion_limits_below_one_or_not_whole_are_refused(kw):
    with pytest.raises(bz.PassError, match=f"{next(iter(kw))} must be a whole number >= 1"):
        with with_fusion_limits(**kw):
            pass
    with pytest.raises(bz.PassError):
        FusionLimits(**kw)


def test_none_is_unbounded_and_a_positive_limit_is_kept():
    with with_fusion_limits(max_steps=8) as lim:
        assert lim == FusionLimits(8, None) and lim.allows(8, 100) and not lim.allows(9, 1)
    assert FusionLimits().allows(10**6, 10**6)


def test_run_passes_refuses_a_pass_name():
    g = bz.Graph("g")
    g.set_outputs([g.relu(g.input("x", bz.Shape((2, 3))))])
    with pytest.raises(bz.PassError, match="run_passes takes pass objects.*'FuseMatMulBiasAct'"):
        bz.run_passes(g, ["FuseMatMulBiasAct"])
