"""braze's compiled CPU executor (fp32 and the bf16 policy) against ONNX Runtime (all graph
optimizations) and OpenVINO f32 on 21 Hugging Face families that the fusion work was not tuned
on: encoders (DistilBERT, RoBERTa, ALBERT, DeBERTa-v2, ELECTRA, XLM-R, MPNet, T5 and BART
encoders, CLIP text), decoders (Qwen2, Phi-3, Mistral, Gemma, GPT-NeoX, Falcon, BLOOM, OPT),
ViT, the Whisper encoder and wav2vec2. Median latency per tool, braze's ratio to the fastest
f32 peer, the bf16 policy's ratio to that same fp32 peer, and each output's max difference
from ONNX Runtime relative to ORT's largest |output|. Appends rows to
bench/results/heldout_families.csv and prints a markdown table.

    python bench/heldout_families.py [--models distilbert,wav2vec2,...] [--batches 1]
        [--repeat 15] [--settle 0.2] [--threads 2] [--no-bf16] [--profile 12] [--label NAME]

Models are small (2-4 layers, 384-768 wide, sequence 128; 224x224 images, 2.56 s of 16 kHz
audio) with random, perturbed weights (nothing is downloaded), exported once with the
TorchScript exporter at static shapes to bench/.cache/heldout/<family>.onnx
(<family>_b<N>.onnx for batch N > 1); every tool runs that file. All tools are set up first,
then timed in interleaved rounds (one call of each per round, the order rotated), and the
ratio to the fastest peer is the median over rounds of that round's ratio: load that comes and
goes on a shared machine hits the calls of one round alike, so this is steadier than a ratio
of medians. `--profile N` prints braze's N slowest steps where it is slower than that peer."""
from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # thread pools are sized at library load: pin before any import
    _n = sys.argv[sys.argv.index("--threads") + 1] if "--threads" in sys.argv[:-1] else "2"
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_var, _n)

import argparse  # noqa: E402
import csv  # noqa: E402
import datetime  # noqa: E402
import importlib  # noqa: E402
import inspect  # noqa: E402
import logging  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from executor_vs_peers import (  # noqa: E402
    CACHE,
    Model,
    _export_once,
    braze_executable,
    cpu_description,
    interleaved_ms,
    setup_braze,
    setup_openvino,
    setup_ort,
)

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "heldout_families.csv"
FIELDS = ["when", "label", "cpu", "threads", "load_avg", "model", "batch", "input", "tool",
          "median_ms", "fastest_ms", "ratio_vs_fastest_fp32", "max_rel_diff_vs_ort",
          "compile_s"]
SEQ, VOCAB, WARMUP = 128, 8000, 2
PEERS = ("ort", "ov")  # the f32 peers braze is measured against


@dataclass(frozen=True)
class Family:
    """A model class (`module:Class` where it is not exported by transformers), its config
    class and arguments, what it takes (text ids, an image, mel features or a waveform), its
    attention implementation and extra constructor arguments."""

    model: str
    config: str
    kwargs: dict
    inputs: str = "text"
    attn: str = "sdpa"
    init: dict = field(default_factory=dict)


_BERTISH = dict(hidden_size=768, num_hidden_layers=3, num_attention_heads=12,
                intermediate_size=3072, vocab_size=VOCAB)
_DEC = dict(hidden_size=768, num_hidden_layers=3, num_attention_heads=12, intermediate_size=2048,
            vocab_size=VOCAB, max_position_embeddings=512)
FAMILIES: dict[str, Family] = {
    "distilbert": Family("DistilBertModel", "DistilBertConfig",
                         dict(dim=768, n_layers=3, n_heads=12, hidden_dim=3072,
                              vocab_size=VOCAB)),
    "roberta": Family("RobertaModel", "RobertaConfig",
                      dict(_BERTISH, max_position_embeddings=514, pad_token_id=1)),
    "albert": Family("AlbertModel", "AlbertConfig",
                     dict(_BERTISH, num_hidden_layers=4, embedding_size=128)),
    "deberta_v2": Family("DebertaV2Model", "DebertaV2Config",
                         dict(_BERTISH, relative_attention=True, position_buckets=256,
                              max_relative_positions=512, pos_att_type=["p2c", "c2p"],
                              norm_rel_ebd="layer_norm", share_att_key=True,
                              position_biased_input=False), attn="eager"),
    "electra": Family("ElectraModel", "ElectraConfig",
                      dict(hidden_size=384, num_hidden_layers=4, num_attention_heads=6,
                           intermediate_size=1536, embedding_size=128, vocab_size=VOCAB)),
    "xlm_roberta": Family("XLMRobertaModel", "XLMRobertaConfig",
                          dict(_BERTISH, vocab_size=32000, max_position_embeddings=514,
                               pad_token_id=1)),
    "mpnet": Family("MPNetModel", "MPNetConfig",
                    dict(_BERTISH, max_position_embeddings=514, pad_token_id=1), attn="eager"),
    "t5_enc": Family("T5EncoderModel", "T5Config",
                     dict(d_model=512, d_kv=64, d_ff=2048, num_layers=4, num_heads=8,
                          vocab_size=VOCAB), attn="eager"),
    "bart_enc": Family("transformers.models.bart.modeling_bart:BartEncoder", "BartConfig",
                       dict(d_model=768, encoder_layers=3, encoder_attention_heads=12,
                            encoder_ffn_dim=3072, decoder_layers=1, vocab_size=VOCAB)),
    "qwen2": Family("Qwen2Model", "Qwen2Config", dict(_DEC, num_key_value_heads=2)),
    "phi3": Family("Phi3Model", "Phi3Config", dict(_DEC, num_key_value_heads=12, pad_token_id=0)),
    "mistral": Family("MistralModel", "MistralConfig",
                      dict(_DEC, num_key_value_heads=4, sliding_window=4096)),
    "gemma": Family("GemmaModel", "GemmaConfig",
                    dict(_DEC, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                         intermediate_size=3072, hidden_activation="gelu_pytorch_tanh")),
    "gpt_neox": Family("GPTNeoXModel", "GPTNeoXConfig",
                       dict(_DEC, intermediate_size=3072, rotary_pct=0.25)),
    "falcon": Family("FalconModel", "FalconConfig",
                     dict(hidden_size=768, num_hidden_layers=3, num_attention_heads=12,
                          vocab_size=VOCAB)),
    "bloom": Family("BloomModel", "BloomConfig",
                    dict(hidden_size=768, n_layer=3, n_head=12, vocab_size=VOCAB), attn="eager"),
    "opt": Family("OPTModel", "OPTConfig",
                  dict(hidden_size=768, num_hidden_layers=3, ffn_dim=3072, num_attention_heads=12,
                       vocab_size=VOCAB, max_position_embeddings=512, word_embed_proj_dim=768)),
    "clip_text": Family("CLIPTextModel", "CLIPTextConfig",
                        dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=4,
                             num_attention_heads=8, max_position_embeddings=SEQ,
                             vocab_size=VOCAB, eos_token_id=2)),
    "vit": Family("ViTModel", "ViTConfig",
                  dict(hidden_size=768, num_hidden_layers=3, num_attention_heads=12,
                       intermediate_size=3072, image_size=224, patch_size=16),
                  inputs="image", init=dict(add_pooling_layer=False)),
    "whisper_enc": Family("transformers.models.whisper.modeling_whisper:WhisperEncoder",
                          "WhisperConfig",
                          dict(d_model=384, encoder_layers=4, encoder_attention_heads=6,
                               encoder_ffn_dim=1536, num_mel_bins=80,
                               max_source_positions=SEQ, vocab_size=VOCAB), inputs="mel"),
    "wav2vec2": Family("Wav2Vec2Model", "Wav2Vec2Config",
                       dict(hidden_size=768, num_hidden_layers=3, num_attention_heads=12,
                            intermediate_size=3072), inputs="wave"),
}


def family_feeds(fam: Family, batch: int) -> dict[str, np.ndarray]:
    """Seeded inputs: ids and an all-ones mask of length SEQ, a 224x224 image, 80 mel bins of
    2 * SEQ frames (Whisper), or 320 * SEQ samples (wav2vec2: SEQ - 1 frames)."""
    from braze.models.hf import hf_inputs
    from braze.models.hf_vision import vision_inputs

    if fam.inputs == "text":
        return hf_inputs(batch, SEQ, vocab=fam.kwargs["vocab_size"], padding="none")
    if fam.inputs == "image":
        return vision_inputs(batch, fam.kwargs["image_size"])
    rng = np.random.default_rng(0)
    if fam.inputs == "mel":
        return {"input_features": rng.standard_normal((batch, 80, 2 * SEQ)).astype(np.float32)}
    return {"input_values": rng.standard_normal((batch, 320 * SEQ)).astype(np.float32)}


def build_module(fam: Family, names: list[str]):
    """The eval-mode model with seeded random weights, every 1-D parameter perturbed (as
    braze.models.hf does), wrapped to take `names` positionally and return last_hidden_state
    (without a KV cache where the model has one)."""
    import torch
    import transformers

    from braze.models.hf import perturb_weights

    owner, _, cls_name = fam.model.rpartition(":")
    cls = getattr(importlib.import_module(owner) if owner else transformers, cls_name)
    torch.manual_seed(0)
    cfg = getattr(transformers, fam.config)(**fam.kwargs)
    cfg._attn_implementation = fam.attn
    model = cls(cfg, **fam.init).eval()
    perturb_weights(model, 0)
    extra = {"use_cache": False} if "use_cache" in inspect.signature(cls.forward).parameters \
        else {}

    class LastHidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            return self.model(**dict(zip(names, args)), **extra).last_hidden_state

    return LastHidden().eval()


def export_family(name: str, batch: int) -> tuple[Model, dict[str, np.ndarray]]:
    """The family's ONNX export (made once, at the static shapes of its feeds) and feeds."""
    fam = FAMILIES[name]
    feeds = family_feeds(fam, batch)

    def export(path: Path) -> None:
        import torch

        module = build_module(fam, list(feeds))
        args = tuple(torch.from_numpy(v) for v in feeds.values())
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, args, str(path), input_names=list(feeds),
                              output_names=["last_hidden_state"], opset_version=17,
                              dynamo=False)

    (CACHE / "heldout").mkdir(parents=True, exist_ok=True)
    path = _export_once(CACHE / "heldout" / (name + (f"_b{batch}" if batch > 1 else "") +
                                             ".onnx"), export)
    return Model(name, None, path, tuple(feeds), fam.kwargs.get("vocab_size", 0)), feeds


def recording(calls: dict) -> tuple[dict, dict[str, list[float]]]:
    """`calls` wrapped to append each call's seconds to the returned lists (interleaved_ms
    keeps only medians; the per-round ratios need every call)."""
    times: dict[str, list[float]] = {t: [] for t in calls}

    def timed(fn, out):
        def call():
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return call

    return {t: timed(fn, times[t]) for t, fn in calls.items()}, times


def round_ratio(times: dict[str, list[float]], tool: str) -> float | None:
    """Median over rounds of `tool`'s time over the fastest f32 peer's time in that round."""
    peers = [p for p in PEERS if times.get(p)]
    if not peers or not times.get(tool):
        return None
    n = min(len(times[t]) for t in (tool, *peers))
    return statistics.median(times[tool][i] / min(times[p][i] for p in peers)
                             for i in range(n))


def bench_family(name: str, batch: int, args) -> list[dict]:
    """Set up every tool on one family and batch, time them interleaved, return CSV rows."""
    try:
        model, feeds = export_family(name, batch)
    except Exception as e:  # noqa: BLE001 - a family that does not export is reported
        print(f"{name} b{batch}: export failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
        return []
    calls, outs, exes, compile_s = {}, {}, {}, {}
    setups = {"ort": lambda: setup_ort(model, feeds, args.threads),
              "ov": lambda: setup_openvino(model, feeds, args.threads, "f32")}
    for tool in ("braze", "ort", "ov") + (() if args.no_bf16 else ("braze_bf16",)):
        try:
            t0 = time.perf_counter()
            if tool.startswith("braze"):
                exes[tool] = braze_executable(model, "bf16" if tool == "braze_bf16" else None,
                                              args.threads)
                calls[tool], outs[tool] = setup_braze(exes[tool], feeds)
                compile_s[tool] = f"{time.perf_counter() - t0:.2f}"
            else:
                calls[tool], outs[tool] = setups[tool]()
        except Exception as e:  # noqa: BLE001 - a tool failing is a result, reported
            print(f"  {name} {tool} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
    load = f"{os.getloadavg()[0]:.2f}"
    wrapped, times = recording(calls)
    timed = interleaved_ms(wrapped, args.repeat, warmup=WARMUP, settle=args.settle)
    times = {t: v[WARMUP:] for t, v in times.items()}
    load = f"{load}-{os.getloadavg()[0]:.2f}"
    ref = np.asarray(outs["ort"], np.float32) if "ort" in outs else None
    rows = []
    for tool, (ms, fastest) in timed.items():
        x = round_ratio(times, tool)
        diff = ""
        if ref is not None:
            out = np.asarray(outs[tool], np.float32).reshape(ref.shape)
            diff = f"{np.max(np.abs(out - ref)) / max(float(np.max(np.abs(ref))), 1e-6):.1e}"
        rows.append({"load_avg": load, "model": name, "batch": batch,
                     "input": "x".join(map(str, next(iter(feeds.values())).shape)),
                     "tool": tool, "median_ms": f"{ms:.2f}", "fastest_ms": f"{fastest:.2f}",
                     "ratio_vs_fastest_fp32": "" if x is None else f"{x:.3f}",
                     "max_rel_diff_vs_ort": diff, "compile_s": compile_s.get(tool, "")})
        print(f"{name:12} b{batch:<2} {tool:10} {ms:9.2f} ms (fastest {fastest:8.2f})  "
              f"x{rows[-1]['ratio_vs_fastest_fp32'] or '-':>6} fastest f32 peer  diff {diff}",
              flush=True)
        if args.profile and tool in exes and x is not None and x > 1.0:
            print(f"--- {name} b{batch} {tool} profile (top {args.profile})")
            print("\n".join(str(exes[tool].profile(feeds)).splitlines()[:args.profile + 3]))
    return rows


def markdown(rows: list[dict]) -> str:
    """One line per family and batch: each tool's median ms, braze's and the bf16 policy's
    per-round ratio to the fastest f32 peer, their differences from ORT, the load average."""
    lines = ["| model | batch | braze ms | ORT ms | OV f32 ms | braze / fastest f32 | "
             "bf16 ms | bf16 / fastest f32 | diff braze | diff bf16 | load |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    by_run: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        by_run.setdefault((r["model"], r["batch"]), {})[r["tool"]] = r
    cells = (("braze", "median_ms"), ("ort", "median_ms"), ("ov", "median_ms"),
             ("braze", "ratio_vs_fastest_fp32"), ("braze_bf16", "median_ms"),
             ("braze_bf16", "ratio_vs_fastest_fp32"), ("braze", "max_rel_diff_vs_ort"),
             ("braze_bf16", "max_rel_diff_vs_ort"))
    for (model, batch), tools in by_run.items():
        vals = [tools.get(tool, {}).get(key, "") or "-" for tool, key in cells]
        vals[3] = f"**{vals[3]}**"
        load = next(iter(tools.values()))["load_avg"]
        lines.append(f"| {model} | {batch} | {' | '.join(vals)} | {load} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(FAMILIES))
    ap.add_argument("--batches", default="1")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--settle", type=float, default=0.2,
                    help="seconds of idle before each timed call (spinning pools settle)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-bf16", action="store_true", help="skip braze's bf16 policy")
    ap.add_argument("--profile", type=int, default=0,
                    help="print braze's top N profile steps where it is slower than the peer")
    ap.add_argument("--label", default="", help="a note stored with every row (before/after)")
    args = ap.parse_args()
    unknown = [m for m in args.models.split(",") if m not in FAMILIES]
    if unknown:
        ap.error(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    stamp, machine = datetime.datetime.now().isoformat(timespec="seconds"), cpu_description()
    print(f"{stamp} {machine}, {args.threads} threads", flush=True)
    everything = []
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            rows = [{"when": stamp, "label": args.label, "cpu": machine,
                     "threads": args.threads, **r} for r in bench_family(name, batch, args)]
            RESULTS.parent.mkdir(exist_ok=True)
            with open(RESULTS, "a", newline="") as f:  # as each finishes: a stopped run keeps
                w = csv.DictWriter(f, fieldnames=FIELDS)  # what it measured
                if f.tell() == 0:
                    w.writeheader()
                w.writerows(rows)
            everything += rows
    print(markdown(everything))


if __name__ == "__main__":
    main()
