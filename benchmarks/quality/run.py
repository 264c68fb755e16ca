"""Quality of MSA on the default model: needles MSA vs dense paired per sample (dev / test splits),
and the rows measured through `msa-eval run helmet` itself (dense needle rows, the main job's time);
the recall tasks' prompt-construction time on the 32K-1M ladder (`prompts`, CPU only).

    python -m benchmarks.quality.run --preset needles [--setting NAME=ADAPTER_DIR[@b64k8]] [--json OUT]

The needle presets generate on the GPU when there is one (`LLM`'s default device: bf16 on CUDA);
the runner presets run the CLI on this machine. Settings: see benchmarks/quality/needles.py.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from benchmarks.cli import env_row, parser, run_sections
from benchmarks.quality import needles, prompts, runner_rows
from benchmarks.quality.needles import Needles
from benchmarks.quality.runner_rows import RunnerRun


@dataclass(frozen=True)
class Preset:
    doc: str
    needles: Needles | None = None
    runs: tuple[RunnerRun, ...] = ()
    pick: bool = False  # print the best non-dense setting (dev split)
    prompts: prompts.Prompts | None = None


def dense(tasks: str, lengths: str, samples: int) -> RunnerRun:
    return RunnerRun(("--attention", "dense", "--tasks", tasks, "--lengths", lengths, "--samples", str(samples)))


PRESETS: dict[str, Preset] = {
    "needles": Preset("the README's needle rows: test split (seed 42), 100 per cell, dense vs the shipped indexer, "
                      "8K recall", Needles(("dense", "msa"))),
    "needles-dev": Preset("dev split (seed 7), 50 per cell: dense and the shipped indexer with more dense layers; "
                          "picks the best", Needles(("dense", "max-d7=+", "max-d7-20=+20", "max-d7-20-23=+20,23"),
                                                    n=50, seed=7, recall=0), pick=True),
    "calibrate-dev": Preset("real-text dev split (seed 7, 40 per cell, 2K-8K, every MSA setting at the helmet "
                            "suite's top-k 4): dense, msa-oracle, the shipped indexer and the --setting variants; "
                            "picks the best",
                            Needles(("dense", "msa-oracle", "msa"), n=40, seed=7, lengths=(2048, 4096, 8192), recall=0,
                                    topk=4), pick=True),
    "fp8": Preset("FP8 KV cache (issue 22): test split (seed 42), 100 per cell at 4K and 8K, dense and the shipped "
                  "indexer at top-k 4, each on a bf16 and an fp8 (e4m3) cache, paired fp8 vs bf16 (GPU)",
                  Needles(("dense", "dense@fp8", "msa", "msa@fp8"), recall=0, topk=4)),
    "fp8-hadamard": Preset("`fp8` with the rotated cache too (`--kv-cache-dtype fp8-hadamard`): dense and msa on bf16, "
                           "fp8 and fp8-hadamard caches, each fp8 setting paired against bf16 (GPU)",
                           Needles(("dense", "dense@fp8", "dense@fp8-hadamard", "msa", "msa@fp8", "msa@fp8-hadamard"),
                                   recall=0, topk=4)),
    "dense-runner": Preset("dense single needle through the runner on this machine (CPU: hours)",
                           runs=(dense("niah_single", "2k,4k", 20), dense("niah_single", "8k", 20),
                                 dense("niah_single_noise", "8k", 20),
                                 dense("niah_single,niah_single_noise", "7.5k", 12))),
    "main-job": Preset("times `make run` (msa-eval run helmet --backend local: niah_mk2 at 1K, 32 samples, "
                       "dense / msa / msa-oracle): wall, CPU, RSS, load",
                       runs=(RunnerRun(timed=True),)),
    "prompts": Preset("prompt construction of every recall task at 32K-1M (one sample each, cold piece counts; "
                      "goal on 2 cores: 128K <= 5 s, 1M <= 30 s)", prompts=prompts.Prompts()),
    "ci": Preset("tiny: one single-needle sample at 512 tokens, dense vs msa (CPU, about a minute)",
                 Needles(("dense", "msa"), n=1, lengths=(512,), tasks=("niah_single",), recall=0, max_seqs=1)),
}


def markdown(rows: list[dict], p: Preset) -> str:
    lines = needles.markdown(rows) + runner_rows.markdown(rows) + prompts.markdown(rows)
    if p.pick and p.needles:
        among = [s.split("=", 1)[0] for s in p.needles.settings if s not in ("dense", "msa-oracle")]
        best = needles.best_setting(needles.cells(rows), among)
        lines += ["", f"best on this split (summed accuracy, first listed wins ties): **{best}**"]
    return "\n".join(lines + [f"error: {r}" for r in rows if r["bench"] == "error"])


def main(argv: list[str] | None = None) -> None:
    ap = parser("python -m benchmarks.quality.run", __doc__, PRESETS)
    ap.add_argument("--setting", action="append", default=[], metavar="SPEC",
                    help="one more needle setting (repeatable), e.g. twin=DIR@b64k8")
    args = ap.parse_args(argv)
    p = PRESETS[args.preset]
    if args.setting:
        if p.needles is None:
            ap.error(f"--setting needs a needle preset, not {args.preset}")
        p = dataclasses.replace(p, needles=dataclasses.replace(p.needles, settings=p.needles.settings
                                                               + tuple(args.setting)))
    rows: list[dict] = [env_row(args.preset, ("triton",), needles=dataclasses.asdict(p.needles) if p.needles else None)]
    sections = [("needles", lambda: needles.run(p.needles))] if p.needles else []
    sections += [(f"runner {' '.join(r.args)}", lambda r=r: runner_rows.run_helmet(r)) for r in p.runs]
    if (pr := p.prompts) is not None:
        sections.append(("prompts", lambda: prompts.run(pr)))
    run_sections(sections, rows, args.json)
    rows_with_cells = rows + needles.cells(rows)
    if args.json:
        from msa_common.atomic import atomic_write_json

        atomic_write_json(args.json, rows_with_cells, indent=1)
    print(markdown(rows, p))


if __name__ == "__main__":
    main()
