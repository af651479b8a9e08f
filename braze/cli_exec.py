"""The executing commands of `braze`: `run` (compile a model and run it on feeds), `bench`
(compiled latency, with ONNX Runtime side by side for ONNX files) and `demo` (what `make demo`
runs: BERT-base built, fused, and run compiled against the unfused graph)."""
from __future__ import annotations

import statistics
import time

import numpy as np

from .errors import BrazeError


def _feeds(g, path: str | None, symbols: dict | None = None) -> dict[str, np.ndarray]:
    from .interpret import random_feeds

    if path is None:
        return random_feeds(g, 0, symbols)
    if symbols:
        raise BrazeError(f"--dim draws random inputs of the bound sizes; with --feeds the sizes "
                         f"come from the arrays in {path}: drop --dim {', '.join(symbols)}")
    from .ir.files import load_npz

    try:  # each array's header is checked against its size before it is allocated
        feeds = load_npz(path)
    except (OSError, ValueError) as e:
        raise BrazeError(f"cannot read feeds from {path}: {e} (save them with np.savez)") \
            from None
    missing = [n.op.name for n in g.inputs if n.op.name not in feeds]
    if missing:
        raise BrazeError(f"{path} has no arrays for inputs {missing} (it has {sorted(feeds)})")
    return feeds


def _params(g) -> dict[str, np.ndarray]:
    """Random weights for params without stored values (builtin models carry none)."""
    from .interpret import init_params

    missing = [n.op.name for n in g.params if n.op.name not in g.weights]
    if missing:
        print(f"note: {len(missing)} params have no stored values; using random weights")
        return init_params(g, 0)
    return {}


def _symbols(items: list[str] | None) -> dict[str, int]:
    out = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not value.isdigit():
            raise BrazeError(f"--dim takes NAME=INT (e.g. seq=128), got {item!r}")
        if name in out and out[name] != int(value):
            raise BrazeError(f"--dim {name} is given twice ({out[name]} and {value}); give it once")
        out[name] = int(value)
    return out


def _graph_symbols(g, items: list[str] | None) -> dict[str, int]:
    """--dim bindings for `g`; a name the graph has no dim for is an error, not ignored."""
    syms = _symbols(items)
    known = set(g.dynamic_symbols())
    unknown = sorted(set(syms) - known)
    if unknown:
        has = ", ".join(sorted(known)) or "none: its shapes are static"
        raise BrazeError(f"--dim {', '.join(unknown)}: graph {g.name!r} has no such symbolic "
                         f"dim (its symbolic dims: {has})")
    return syms


def _median_ms(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _interleaved_ms(calls: dict, rounds: int) -> dict:
    """{name: median ms} of `calls` timed in turns (the order flipped each round), so a shared
    machine's load and clock drift hit each alike."""
    times: dict = {name: [] for name in calls}
    for fn in calls.values():
        fn()
    for r in range(rounds):
        for name in (list(calls) if r % 2 else list(calls)[::-1]):
            t0 = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def cmd_run(args, load_model, progress) -> int:
    from .runtime import compile as compile_graph

    g = load_model(args.model, progress, args.input_shape)
    feeds = _feeds(g, args.feeds, _graph_symbols(g, args.dim))
    params = _params(g)
    with progress.step("compiling"):
        exe = compile_graph(g, params=params, precision=args.precision)
        outs = exe(feeds)
    for i, o in enumerate(outs):
        o = np.asarray(o)
        stats = "" if o.dtype.kind not in "fc" or not o.size else (
            f"  mean {float(np.mean(o)):.6g}  std {float(np.std(o)):.6g}")
        print(f"output {i}: {o.dtype}{list(o.shape)}{stats}")
    if args.out:
        out = args.out if args.out.endswith(".npz") else args.out + ".npz"  # as np.savez names it
        np.savez(out, **{f"output_{i}": o for i, o in enumerate(outs)})
        print(f"outputs written to {out}")
    return 0


def cmd_bench(args, load_model, progress) -> int:
    from .runtime import compile as compile_graph

    g = load_model(args.model, progress, args.input_shape)
    feeds = _feeds(g, args.feeds, _graph_symbols(g, args.dim))
    params = _params(g)
    t0 = time.perf_counter()
    with progress.step("compiling"):
        exe = compile_graph(g, params=params, precision=args.precision)
        exe(feeds)
    compile_s = time.perf_counter() - t0
    ms = _median_ms(lambda: exe(feeds), args.repeat)
    print(f"braze compiled ({args.precision or 'f32'}): {ms:.2f} ms median of {args.repeat} "
          f"(compile + first run {compile_s:.2f} s)")
    if args.model.lower().endswith(".onnx"):  # model.ONNX loads as ONNX too
        try:
            import onnxruntime as ort
        except ImportError:
            ort = None
        if ort is not None:
            try:
                sess = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
                names = {i.name for i in sess.get_inputs()}
                run = lambda: sess.run(None, {k: v for k, v in feeds.items() if k in names})  # noqa
                ort_ms = _median_ms(run, args.repeat)
            except Exception as e:  # noqa: BLE001 - ORT refusing a model braze runs is no error
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                print(f"onnxruntime: cannot run this model ({first[:300]}); braze timed only")
            else:
                print(f"onnxruntime: {ort_ms:.2f} ms (braze / onnxruntime = {ms / ort_ms:.2f}x)")
    if args.profile:
        print(exe.profile(feeds))
    return 0


def cmd_demo(args) -> int:
    from .interpret import init_params, interpret, random_feeds
    from .ir.verify import verify
    from .models import bert_base, llama_small
    from .passes.pipeline import fuse
    from .runtime import compile as compile_graph

    print("== braze demo: BERT-base encoder (12 layers, hidden 768, batch 1, seq 128) ==")
    t0 = time.perf_counter()
    g = bert_base()
    verify(g)
    print(f"built and verified {len(g.nodes)} nodes in {(time.perf_counter() - t0) * 1e3:.0f} ms")
    feeds, params = random_feeds(g, 0), init_params(g, 0)
    t0 = time.perf_counter()
    ref = interpret(g, feeds, params)
    print(f"reference interpreter: {[o.shape for o in ref]} in "
          f"{(time.perf_counter() - t0) * 1e3:.0f} ms")
    for label, model in (("BERT-base", g), ("LLaMA-style (small)", llama_small())):
        print(f"\n== fusing {label} for target cpu ==")
        fused, report = fuse(model, "cpu")
        print(report)
        f2, p2 = random_feeds(model, 1), init_params(model, 1)
        diff = _max_abs_diff(interpret(model, f2, p2), interpret(fused, f2, p2))
        print(f"numeric check: max abs diff fused vs unfused = {diff:.3e}")
    print("\n== BERT-base compiled for the CPU: fused vs unfused ==")
    t0 = time.perf_counter()
    fused_exe = compile_graph(g, params=params)
    out = fused_exe(feeds)
    print(f"compiled (fused) in {time.perf_counter() - t0:.2f} s; "
          f"max abs diff vs interpreter {_max_abs_diff(out, ref):.3e}")
    plain_exe = compile_graph(g, params=params, fuse=False)
    plain_exe(feeds)
    bf16_exe = compile_graph(g, params=params, precision="bf16")
    bf16_out = bf16_exe(feeds)
    ms = _interleaved_ms({"fused": lambda: fused_exe(feeds), "unfused": lambda: plain_exe(feeds),
                          "bf16": lambda: bf16_exe(feeds)}, 9)
    print(f"unfused {ms['unfused']:.1f} ms, fused {ms['fused']:.1f} ms (medians of 9 calls "
          f"each, in turns): {ms['unfused'] / ms['fused']:.2f}x faster fused")
    rel = _max_abs_diff(bf16_out, out) / max(float(np.max(np.abs(out[0]))), 1e-30)
    print(f"bf16 policy (precision='bf16'): {ms['bf16']:.1f} ms, {ms['fused'] / ms['bf16']:.2f}x "
          f"the fused f32 speed; largest difference from f32 {rel:.1e} of the output's range")
    print(fused_exe.plan.summary())
    return 0


def _max_abs_diff(a_outs, b_outs) -> float:
    return max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
               for a, b in zip(a_outs, b_outs, strict=True))
