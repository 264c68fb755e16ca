"""Engine on one GPU: decode roofline, against HF transformers, MSA against dense end to end.

    python -m benchmarks.engine_gpu.run --preset headline --model /root/models/smollm2.gguf --json OUT

`--model`: the default model, a built-in name or its GGUF path (on the device machine the file is
carried in; benchmarks/README.md gives the command). Random-weight stacks (`engine.testing`)
stand in for the 8B and M3 shapes. Timing: wall-clock engine steps (scheduling, packing, graph
replay, sampling and the host copy of the tokens included), medians after warm-up; see each section.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchmarks.cli import env_row, parser, run_sections
from benchmarks.engine_gpu.decode import Roofline, VersusHF
from benchmarks.engine_gpu.m3 import M3Slice, M3Telemetry, M3VersusHF
from benchmarks.engine_gpu.msa import Decode, MSAGraphs, Prefill
from benchmarks.engine_gpu.step import Step
from benchmarks.engine_gpu.tables import markdown

Section = Roofline | VersusHF | Prefill | Decode | MSAGraphs | Step | M3Slice | M3VersusHF


@dataclass(frozen=True)
class Preset:
    doc: str
    sections: tuple[Section, ...]


HEADLINE_DECODE = (Roofline(graphs=(True,)),
                   VersusHF(cases=("default",), hf_modes=("compiled",), repeats=3))
HEADLINE_MSA = (Prefill(lengths=(131072, 524288, 1048576), msa_only=(), chunk=524288, dense_chunk=1048576),
                Decode(batches=(64,), contexts=(131072,)))

PRESETS: dict[str, Preset] = {
    "headline": Preset("the README's rows: headline-decode then headline-msa (about 6 min on an H200)",
                       HEADLINE_DECODE + HEADLINE_MSA),
    "headline-decode": Preset("8B roofline (graphs on) + default model vs HF compiled, batch 1 and 8, 3 timings",
                              HEADLINE_DECODE),
    "headline-msa": Preset("M3 stack MSA vs dense: prefill TTFT 128K / 512K / 1M (dense 1M one chunk), decode "
                           "128K batch 64", HEADLINE_MSA),
    "roofline": Preset("8B shape, batch 1, 4K context, CUDA graphs on and off", (Roofline(),)),
    "vs-hf": Preset("default model and 8B shape vs HF eager and compiled, batch 1 and 8", (VersusHF(),)),
    "vs-self": Preset("ours alone, default model, batch 1 and 8, 5 timings (before/after an engine change)",
                      (VersusHF(cases=("default",), hf_modes=(), repeats=5),)),
    "msa": Preset("M3 stack MSA vs dense: prefill 32K / 128K / 512K (+ MSA 1M), decode batch 8/32/64 at 32K / 128K",
                  (Decode(), Prefill())),
    "msa-chunked": Preset("M3 stack prefill at 128K in 16K chunks, MSA vs dense",
                          (Prefill(lengths=(131072,), msa_only=(), chunk=16384),)),
    "msa-graphs": Preset("MSA decode eager / plan / graphs vs dense graphs, default model and M3 stack",
                         (MSAGraphs(),)),
    "m3-slice": Preset("MiniMax-M3 at full width, 4 layers (1 full + dense MLP, 3 MSA + 128-expert MoE), random bf16: "
                       "TTFT MSA 32K-1M, dense 32K-512K (128K chunks), decode batch 1/8/64 at 32K / 128K, per-layer "
                       "times", (M3Slice(),)),
    "m3-prefill": Preset("the m3-slice prefill rows only", (M3Slice(decode_contexts=()),)),
    "m3-decode": Preset("the m3-slice decode rows only, then m3-vs-hf", (M3Slice(prefill=(), dense_prefill=()),
                                                                        M3VersusHF())),
    "m3-decode-fp8": Preset("M3 slice decode at 128K batch 64, MSA and dense, on a bf16 and an fp8 cache (e4m3 K/V, "
                            "int8 index keys: --kv-cache-dtype fp8)",
                            (M3Slice(prefill=(), dense_prefill=(), decode_contexts=(131072,), batches=(64,),
                                     kv_caches=("bf16", "fp8")),)),
    "m3-vs-hf": Preset("M3 slice (16 experts) TTFT 4K-32K: ours (msa) vs transformers' own M3 (sdpa, its Hopper path)",
                       (M3VersusHF(),)),
    "m3-split": Preset("where an M3 decode step goes: eager steps (per-layer CUDA events) at 128K batch 64, and "
                       "m3-vs-hf at 16K", (M3Slice(prefill=(), dense_prefill=(), decode_contexts=(131072,),
                                                   batches=(64,), graphs=False), M3VersusHF(lengths=(16384,)))),
    "m3-telemetry": Preset("selection telemetry of the M3 slice (random weights: shape and cost only) at 32K-1M",
                           (M3Telemetry(),)),
    "m3-smoke": Preset("the M3 slice at tiny sizes (8 experts, 8K / 16K, batch 1 and 4): checks the section",
                       (M3Slice(prefill=(8192, 16384), dense_prefill=(8192,), decode_contexts=(8192,),
                                batches=(1, 4), experts=8, chunk=8192, steps=4, kv_caches=("bf16", "fp8")),
                        M3VersusHF(lengths=(4096,), experts=8), M3Telemetry(lengths=(8192,), experts=8, chunk=8192))),
    "step": Preset("where a decode step's time goes, default model, sync and async, batch 1 and 8", (Step(),)),
    "smoke": Preset("every section at tiny sizes (checks the runner on a GPU in about a minute)",
                    (Roofline(ctx=512, steps=8, graphs=(True,)),
                     VersusHF(cases=("default",), hf_modes=("eager",), batches=(1,), prompt=64, new=8),
                     Prefill(lengths=(8192,), msa_only=(), chunk=8192),
                     Decode(batches=(2,), contexts=(4096,), steps=4),
                     MSAGraphs(batches=(1,), ctx=1024, m3_cases=((4096, 2),), steps=4),
                     Step(batches=(1,), prompt=64, new=16))),
}


@dataclass(frozen=True)
class Options:
    model: str  # the default model: a built-in name or a GGUF path
    msa_model: str  # the same with its shipped MSA indexer


def msa_model(model: str) -> str:
    """A GGUF path gets the default model's shipped indexer (`BASE+ADAPTER_DIR`); a name finds its own."""
    if Path(model).is_file():
        import engine

        return f"{model}+{Path(engine.__file__).parent / 'adapters' / 'smollm2-135m'}"
    return model


def main(argv: list[str] | None = None) -> None:
    ap = parser("python -m benchmarks.engine_gpu.run", __doc__, PRESETS)
    ap.add_argument("--model", default="smollm2-135m", help="the default model: built-in name or GGUF path "
                    "[smollm2-135m]")
    ap.add_argument("--label", default=None, help="tag every row (e.g. before / after an engine change)")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        ap.error("the engine GPU benchmarks need a CUDA GPU")
    opts = Options(args.model, msa_model(args.model))
    rows: list[dict] = [env_row(args.preset, ("triton", "transformers"), model=args.model, label=args.label)]
    sections = [(s.name, lambda s=s: [dict(r, label=args.label) if args.label else r for r in s.run(opts)])
                for s in PRESETS[args.preset].sections]
    run_sections(sections, rows, args.json)
    print(markdown(rows))


if __name__ == "__main__":
    main()
