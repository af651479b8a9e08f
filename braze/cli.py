"""The `braze` command: `inspect` a model, `fuse` it for a target with a report (and export the
fused ONNX), and `demo` (what `make demo` runs). A model is a builtin name, a saved graph
(.json), an ONNX file (.onnx) or a saved torch.export program (.pt2)."""
from __future__ import annotations

import argparse
import os
import sys

from .errors import BrazeError, FrontendError, UnsupportedOpsError
from .progress import Progress


def _parse_input_shapes(items: list[str] | None) -> dict:
    """["x=1x3x48x320", "ids=batch,seq"] -> {"x": (1, 3, 48, 320), "ids": ("batch", "seq")}.
    Dims are split at commas when there are any (a name may hold an 'x': "ids=1,max_len"),
    else at 'x'."""
    shapes = {}
    for item in items or []:
        name, sep, dims = item.partition("=")
        if not sep or not name or not dims:
            raise BrazeError(f"--input-shape takes NAME=DIMS (e.g. x=1x3x48x320), got {item!r}")
        parts = dims.split(",") if "," in dims or not dims[0].isdigit() else dims.split("x")
        shapes[name] = tuple(int(p) if p.strip().isdigit() else p.strip() for p in parts)
    return shapes


def _load_model(spec: str, progress: Progress | None = None, input_shapes=None,
                has_dim: bool = False):
    """A builtin model name, a saved graph (.json), an ONNX file or a .pt2 program. `has_dim`:
    the command takes --dim (run, bench), which an error may then point to."""
    from .ir.serialize import load
    from .models import BUILTIN_MODELS, build_model

    progress = progress or Progress(False)
    ext = os.path.splitext(spec)[1].lower()  # model.ONNX is an ONNX file too
    if input_shapes and ext != ".onnx":
        raise BrazeError("--input-shape fixes an ONNX model's input dims; builtin models, saved "
                         "graphs and .pt2 programs " + (
                             "take --dim NAME=INT for their symbolic dims" if has_dim else
                             "keep theirs (`braze run` / `bench` bind them with --dim NAME=INT)"))
    if spec in BUILTIN_MODELS:
        with progress.step(f"building {spec}"):
            return build_model(spec)
    if not os.path.exists(spec):
        raise BrazeError(f"{spec!r} is neither a builtin model ({', '.join(BUILTIN_MODELS)}) nor "
                         "an existing file (.json graph, .onnx model or .pt2 program)")
    size = os.path.getsize(spec) / 2**20
    if ext == ".onnx":
        from .frontends.onnx import import_onnx

        with progress.step(f"importing {os.path.basename(spec)} ({size:.1f} MiB)"):
            try:
                return import_onnx(spec, input_shapes=input_shapes)
            except FrontendError as e:
                if "input_shapes=" not in str(e) or isinstance(e, UnsupportedOpsError):
                    raise
                raise FrontendError(f"{e}\n  (on the command line: --input-shape NAME=DIMS, "
                                    "e.g. x=1x3x224x224, or x=batch,3,32*h,32*w to keep the "
                                    "size dynamic)") from None
    if ext == ".pt2":
        from . import import_torch

        with progress.step(f"importing {os.path.basename(spec)} ({size:.1f} MiB)"):
            return import_torch(spec)
    with progress.step(f"loading {os.path.basename(spec)}"):
        return load(spec)


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


def _progress(args) -> Progress:
    return Progress(not getattr(args, "quiet", False))


def cmd_inspect(args) -> int:
    progress = _progress(args)
    g = _load_model(args.model, progress, _parse_input_shapes(args.input_shape))
    if args.pipeline:
        from .pipeline_inspect import inspect_pipeline

        with progress.step(f"running the {args.target} pipeline on {len(g.nodes)} nodes"):
            inspection = inspect_pipeline(g, args.target, dump_dir=args.dump_dir)
        print(inspection.index() if args.summary_only else inspection)
        if args.dump_dir:
            print(f"{len(inspection.stages)} stages written to {args.dump_dir} (index.txt)")
        return 0
    if args.dump_dir:
        raise BrazeError("--dump-dir writes the pipeline's stages: use it with --pipeline")
    if not args.summary_only:
        print(g)
    print(_summary(g))
    return 0


def _max_abs_diff(a_outs, b_outs) -> float:
    from .cli_exec import _max_abs_diff as diff

    return diff(a_outs, b_outs)


def cmd_fuse(args) -> int:
    from .ir.serialize import save
    from .passes.pipeline import fuse

    progress = _progress(args)
    g = _load_model(args.model, progress, _parse_input_shapes(args.input_shape))
    opts = {}
    if args.whole_layer:
        opts["transformer_layer"] = True
    if args.no_regions:
        opts["regions"] = False
    with progress.step(f"fusing {len(g.nodes)} nodes for target {args.target}"):
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
    if args.export:
        from .export.onnx import export_onnx

        target = args.export_target or ("onnxruntime" if args.target == "onnxruntime"
                                        else "standard")
        params = None
        missing = [n.op.name for n in fused.params if n.op.name not in fused.weights]
        if missing:  # builtin models carry no weights: export random ones, as `run` does
            from .interpret import init_params

            print(f"note: {len(missing)} params have no stored values; exporting random weights")
            params = init_params(fused, 0)
        with progress.step(f"exporting {os.path.basename(args.export)} for {target}"):
            export_onnx(fused, args.export, target=target, params=params)
        print(f"fused model exported to {args.export} (ONNX, target {target})")
    return 0


def cmd_demo(args) -> int:
    from .cli_exec import cmd_demo as demo

    return demo(args)


def _loader(spec, progress, shapes):
    return _load_model(spec, progress, _parse_input_shapes(shapes), has_dim=True)


def cmd_run(args) -> int:
    from .cli_exec import cmd_run as run

    return run(args, _loader, _progress(args))


def cmd_bench(args) -> int:
    from .cli_exec import cmd_bench as bench

    return bench(args, _loader, _progress(args))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="braze", description="braze: an ML graph compiler built "
                                "around operator fusion")
    sub = p.add_subparsers(dest="cmd", required=True)
    model_help = "builtin model name, saved graph (.json), ONNX model (.onnx) or .pt2 program"
    shape_help = "fix an input's dims on import, e.g. x=1x3x48x320 or ids=batch,seq (repeatable)"
    s = sub.add_parser("inspect", help="print a graph's IR and a summary, or (--pipeline) the "
                       "graph at every stage of compiling it")
    s.add_argument("model", help=model_help)
    s.add_argument("--summary-only", action="store_true",
                   help="skip the text IR (with --pipeline: print only the stage index)")
    s.add_argument("--pipeline", action="store_true", help="the graph as built, after each "
                   "pass that changed it, legalized, and the compiled plan")
    s.add_argument("--target", default="cpu", help="target of --pipeline: reference, cpu, gpu "
                   "or onnxruntime")
    s.add_argument("--dump-dir", metavar="DIR", help="with --pipeline: write one numbered file "
                   "per stage and index.txt here")
    s.add_argument("--input-shape", action="append", metavar="NAME=DIMS", help=shape_help)
    s.add_argument("--quiet", action="store_true", help="no progress display")
    s.set_defaults(fn=cmd_inspect)
    s = sub.add_parser("fuse", help="fuse a graph for a target and print the fusion report")
    s.add_argument("model", help=model_help)
    s.add_argument("--input-shape", action="append", metavar="NAME=DIMS", help=shape_help)
    s.add_argument("--export", metavar="FILE.onnx", help="export the fused graph to ONNX")
    s.add_argument("--export-target", choices=("onnxruntime", "standard"),
                   help="contrib ops for ONNX Runtime, or standard ONNX only (default: "
                        "onnxruntime when --target onnxruntime, else standard)")
    s.add_argument("--quiet", action="store_true", help="no progress display")
    s.add_argument("--target", default="cpu", help="reference, cpu, gpu or onnxruntime")
    s.add_argument("--json", help="write the report as JSON here")
    s.add_argument("--html", help="write the report as an HTML page here")
    s.add_argument("--save", help="save the fused graph here (.json)")
    s.add_argument("--whole-layer", action="store_true", help="also fuse whole transformer layers")
    s.add_argument("--no-regions", action="store_true", help="do not mark elementwise regions")
    s.add_argument("--verify", action="store_true", help="verify the graph after every pass")
    s.add_argument("--check", action="store_true", help="compare outputs with the unfused graph")
    s.set_defaults(fn=cmd_fuse)
    for name, fn, what in (("run", cmd_run, "compile a model and run it"),
                           ("bench", cmd_bench, "time a model compiled for the CPU")):
        s = sub.add_parser(name, help=what)
        s.add_argument("model", help=model_help)
        s.add_argument("--feeds", metavar="FEEDS.npz", help="input arrays by name (np.savez); "
                       "default: random inputs")
        s.add_argument("--dim", action="append", metavar="NAME=INT",
                       help="value of a symbolic dim for random inputs (repeatable)")
        s.add_argument("--precision", choices=("bf16", "f16"), help="mixed-precision policy")
        s.add_argument("--input-shape", action="append", metavar="NAME=DIMS", help=shape_help)
        s.add_argument("--quiet", action="store_true", help="no progress display")
        if name == "run":
            s.add_argument("--out", metavar="OUT.npz", help="write the outputs here")
        else:
            s.add_argument("--repeat", type=_positive, default=10, help="timed runs (median)")
            s.add_argument("--profile", action="store_true", help="print the per-node profile")
        s.set_defaults(fn=fn)
    s = sub.add_parser("demo", help="build, fuse and run the builtin models compiled")
    s.set_defaults(fn=cmd_demo)
    return p


def _positive(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"needs a whole number >= 1, got {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (BrazeError, OSError) as e:
        print(f"braze: error: {e}", file=sys.stderr)
        return 2
    except MemoryError as e:
        print(f"braze: error: out of memory ({e or 'an allocation failed'}); use smaller input "
              "sizes (--dim, --input-shape)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("braze: interrupted", file=sys.stderr)
        return 130
    except RecursionError:
        print(f"braze: error: {args.model if hasattr(args, 'model') else 'the input'} is nested "
              "too deeply to read (a corrupt or hostile file?)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
