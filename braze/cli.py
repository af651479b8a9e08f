"""The `braze` command: `inspect` a graph, `fuse` it for a target with a report, and `demo`
(what `make demo` runs)."""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from .errors import BrazeError


def _load_model(spec: str):
    """A builtin model name or a saved graph file."""
    import os

    from .ir.serialize import load
    from .models import BUILTIN_MODELS, build_model

    if spec in BUILTIN_MODELS:
        return build_model(spec)
    if os.path.exists(spec):
        return load(spec)
    raise BrazeError(f"{spec!r} is neither a builtin model ({', '.join(BUILTIN_MODELS)}) nor an "
                     "existing graph file")


def _summary(g) -> str:
    counts = sorted(g.op_counts().items(), key=lambda kv: -kv[1])
    n_params = 0
    n_bytes = 0
    for node in g.params:
        n = node.op.shape.numel()
        if n is not None:
            n_params += n
            n_bytes += n * node.op.shape.dtype.itemsize
    lines = [f"graph {g.name!r}: {len(g.nodes)} nodes, {len(g.inputs)} inputs, "
             f"{len(g.params)} params ({n_params:,} values, {n_bytes / 2**20:.1f} MiB), "
             f"{len(g.outputs)} outputs", "nodes per op kind:"]
    lines += [f"  {k:<28} {v}" for k, v in counts]
    return "\n".join(lines)


def cmd_inspect(args) -> int:
    g = _load_model(args.model)
    if not args.summary_only:
        print(g)
    print(_summary(g))
    return 0


def _max_abs_diff(a_outs, b_outs) -> float:
    return max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
               for a, b in zip(a_outs, b_outs, strict=True))


def cmd_fuse(args) -> int:
    from .ir.serialize import save
    from .passes.pipeline import fuse

    g = _load_model(args.model)
    opts = {}
    if args.whole_layer:
        opts["transformer_layer"] = True
    if args.no_regions:
        opts["regions"] = False
    fused, report = fuse(g, args.target, verify=args.verify, **opts)
    print(report)
    if args.check:
        from .interpret import init_params, interpret, random_feeds

        feeds, params = random_feeds(g, 0), init_params(g, 0)
        diff = _max_abs_diff(interpret(g, feeds, params), interpret(fused, feeds, params))
        print(f"numeric check: max abs diff vs unfused = {diff:.3e}")
    if args.json:
        with open(args.json, "w") as f:
            f.write(report.to_json())
        print(f"report written to {args.json}")
    if args.html:
        with open(args.html, "w") as f:
            f.write(report.to_html(g, fused))
        print(f"HTML report written to {args.html}")
    if args.save:
        save(fused, args.save)
        print(f"fused graph saved to {args.save}")
    return 0


def cmd_demo(args) -> int:
    from .interpret import init_params, interpret, random_feeds
    from .ir.verify import verify
    from .models import bert_base, llama_small
    from .passes.pipeline import fuse

    print("== braze demo: BERT-base encoder (12 layers, hidden 768, batch 1, seq 128) ==")
    t0 = time.perf_counter()
    g = bert_base()
    t_build = time.perf_counter() - t0
    verify(g)
    feeds, params = random_feeds(g, 0), init_params(g, 0)
    t0 = time.perf_counter()
    outs = interpret(g, feeds, params)
    t_run = time.perf_counter() - t0
    print(f"built {len(g.nodes)} nodes in {t_build * 1e3:.0f} ms; verified; reference interpreter: "
          f"{[o.shape for o in outs]} in {t_run * 1e3:.0f} ms")
    for label, model in (("BERT-base", g), ("LLaMA-style (small)", llama_small())):
        print(f"\n== fusing {label} for target cpu ==")
        fused, report = fuse(model, "cpu")
        print(report)
        f2, p2 = random_feeds(model, 1), init_params(model, 1)
        diff = _max_abs_diff(interpret(model, f2, p2), interpret(fused, f2, p2))
        print(f"numeric check: max abs diff fused vs unfused = {diff:.3e}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="braze", description="braze: an ML graph compiler built "
                                "around operator fusion")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("inspect", help="print a graph's IR and a summary")
    s.add_argument("model", help="builtin model name or saved graph (.json)")
    s.add_argument("--summary-only", action="store_true", help="skip the text IR")
    s.set_defaults(fn=cmd_inspect)
    s = sub.add_parser("fuse", help="fuse a graph for a target and print the fusion report")
    s.add_argument("model", help="builtin model name or saved graph (.json)")
    s.add_argument("--target", default="cpu", help="reference, cpu, gpu or onnxruntime")
    s.add_argument("--json", help="write the report as JSON here")
    s.add_argument("--html", help="write the report as an HTML page here")
    s.add_argument("--save", help="save the fused graph here (.json)")
    s.add_argument("--whole-layer", action="store_true", help="also fuse whole transformer layers")
    s.add_argument("--no-regions", action="store_true", help="do not mark elementwise regions")
    s.add_argument("--verify", action="store_true", help="verify the graph after every pass")
    s.add_argument("--check", action="store_true", help="compare outputs with the unfused graph")
    s.set_defaults(fn=cmd_fuse)
    s = sub.add_parser("demo", help="build, verify, run and fuse the builtin models")
    s.set_defaults(fn=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except BrazeError as e:
        print(f"braze: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"braze: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
