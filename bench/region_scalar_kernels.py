"""Generated region kernels with their scalar constants as arguments (today) against the same
regions with every constant a literal (codegen.scalars switched off), in one process: the
programs' region steps alone, one thread, CPU time (process_time), alternating over 21 rounds,
medians; outputs asserted bit-identical. 16K floats (in cache) and 4M floats (memory-bound).

    python bench/region_scalar_kernels.py
"""
import statistics
import time

import numpy as np

import braze as bz
from braze.runtime.codegen import elementwise
from braze.runtime.codegen.scalars import ScalarArgs

CASES = {
    "tanh_chain": lambda g, x, y: g.tanh(g.add(g.mul(x, 0.5), g.mul(y, 0.25))),
    "exp_scale": lambda g, x, y: g.mul(g.exp(g.neg(g.square(x))), 3.0),
    "affine_clip": lambda g, x, y: g.clamp(g.add(g.mul(x, 0.3), y), -2.5, 2.5),
    "leaky_bias": lambda g, x, y: g.leaky_relu(g.add(x, g.mul(y, 0.7)), 0.05),
}
real = elementwise.scalar_args
for n in (1 << 14, 1 << 22):
    for name, build in CASES.items():
        g = bz.Graph(name)
        x, y = g.input("x", bz.Shape((n,))), g.input("y", bz.Shape((n,)))
        g.set_outputs([build(g, x, y)])
        rng = np.random.default_rng(0)
        feeds = {v: rng.standard_normal(n, dtype=np.float32) for v in ("x", "y")}
        arg = bz.compile(g, threads=1)
        elementwise.scalar_args = lambda body, vt: ScalarArgs({}, ())
        lit = bz.compile(g, threads=1)
        lit(feeds)
        arg(feeds)
        elementwise.scalar_args = real
        assert np.array_equal(arg(feeds)[0], lit(feeds)[0])
        steps = {k: e.program(feeds).steps[0].call
                 for k, e in (("literal", lit), ("argument", arg))}
        reps = max(1, (1 << 24) // n)
        t = {k: [] for k in steps}
        for _ in range(21):
            for k, call in steps.items():
                t0 = time.process_time()
                for _ in range(reps):
                    call()
                t[k].append((time.process_time() - t0) / reps)
        ml, ma = (statistics.median(t[k]) * 1e6 for k in ("literal", "argument"))
        print(f"{name:12s} n={n:8d} literal {ml:9.1f} us  argument {ma:9.1f} us  "
              f"ratio {ma / ml:.3f}", flush=True)
