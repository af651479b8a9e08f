"""Equivalence gate for pass changes that must not change what `bz.fuse` builds: record, per case,
the fused graph's text IR (stored, and its sha256), its op-kind counts, the per-rule match counts
and the misses (pattern, node, reason); later compare the working tree against that record.

    python bench/fuse_equivalence.py record DIR     # before the change (e.g. at HEAD)
    python bench/fuse_equivalence.py compare DIR    # after it: OK / BAD per case, then ALL OK

Cases: every cached export in bench/.cache (written by bench/vs_ort_optimizer.py; partial, _ext
and fused outputs skipped) for each of TARGETS, and the builder models of BUILDERS for `cpu`.
`compare` says which part of a BAD case differs: the graph text (the head of a unified diff),
the op counts, the match counts (a speedup that finds the same graph in fewer sweeps changes
only these), or the misses. It exits with status 1 when any case is BAD."""
from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import logging
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import braze as bz  # noqa: E402
from braze import models  # noqa: E402

CACHE = HERE / ".cache"
TARGETS = ("cpu", "onnxruntime", "gpu")
BUILDERS = {
    "bert_tiny": models.bert_tiny,
    "bert_base": models.bert_base,
    "gpt2": models.gpt2_blocks,
    "llama_tiny": models.llama_tiny,
    "llama_small": models.llama_small,
    "resnet_block": models.resnet_basic_block,
}
PARTS = ("sha256", "counts", "matches", "misses")


def exports() -> list[Path]:
    skip = ("partial", "_ext", "fused")
    return sorted(p for p in CACHE.glob("*.onnx") if not any(s in p.stem for s in skip))


def cases():
    """(case name, zero-argument graph maker, target), exports first."""
    for path in exports():
        for target in TARGETS:
            yield f"{path.stem}@{target}", (lambda p=path: bz.import_onnx(str(p))), target
    for name, build in BUILDERS.items():
        yield f"builder_{name}@cpu", build, "cpu"


def record_case(make, target: str) -> tuple[dict, str]:
    """The case's record and its fused graph's text."""
    fused, report = bz.fuse(make(), target)
    text = str(fused)
    misses = sorted([m.pattern, m.node, m.reason.value] for m in report.misses)
    return {
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "counts": dict(sorted(fused.op_counts().items())),
        "matches": {k: s.matches for k, s in sorted(report.rule_stats.items()) if s.matches},
        "misses": misses,
    }, text


def _dict_diff(a: dict, b: dict) -> str:
    keys = sorted(set(a) | set(b))
    return ", ".join(f"{k} {a.get(k, 0)}->{b.get(k, 0)}" for k in keys if a.get(k) != b.get(k))


def describe(part: str, ref: dict, now: dict, ref_text: str, now_text: str) -> list[str]:
    """Lines saying how `part` differs."""
    if part == "sha256":
        diff = difflib.unified_diff(ref_text.splitlines(), now_text.splitlines(), "ref", "now",
                                    lineterm="", n=1)
        return ["graph text differs:"] + [f"    {line}" for line in list(diff)[:24]]
    if part == "misses":
        old, new = {tuple(m) for m in ref[part]}, {tuple(m) for m in now[part]}
        lines = [f"misses differ ({len(old)} -> {len(new)}):"]
        lines += [f"    - {m}" for m in sorted(old - new)[:8]]
        lines += [f"    + {m}" for m in sorted(new - old)[:8]]
        return lines
    return [f"{part} differ: {_dict_diff(ref[part], now[part])}"]


def record(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    summary = {}
    for name, make, target in cases():
        summary[name], text = record_case(make, target)
        (out / f"{name}.txt").write_text(text)
        print(f"recorded {name}: {summary[name]['sha256'][:12]}", flush=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    print(f"{len(summary)} cases recorded in {out}")


def compare(ref_dir: Path) -> int:
    ref = json.loads((ref_dir / "summary.json").read_text())
    bad = 0
    seen = set()
    for name, make, target in cases():
        seen.add(name)
        if name not in ref:
            print(f"NEW  {name} (not in the record)")
            continue
        now, text = record_case(make, target)
        parts = [p for p in PARTS if ref[name][p] != now[p]]
        if not parts:
            print(f"OK   {name}", flush=True)
            continue
        bad += 1
        print(f"BAD  {name}: {', '.join(parts)}")
        ref_text = (ref_dir / f"{name}.txt").read_text()
        for p in parts:
            for line in describe(p, ref[name], now, ref_text, text):
                print(f"  {line}")
    for name in sorted(set(ref) - seen):
        print(f"GONE {name} (recorded, no longer a case)")
    print("ALL OK" if not bad else f"{bad} BAD of {len(seen)}")
    return 1 if bad else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("record", "compare"))
    ap.add_argument("dir", type=Path)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    if args.mode == "record":
        record(args.dir)
    else:
        sys.exit(compare(args.dir))


if __name__ == "__main__":
    main()
