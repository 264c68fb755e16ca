"""PNG plots (matplotlib, Agg backend): overall score vs length per backend, and a needle
depth x length heat map per backend for the recall tasks that record a depth."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from msa_common.atomic import atomic_path
from msa_eval.report.build import OVERALL, Report
from msa_eval.runner.records import SampleRecord


def _save(fig, path: Path) -> None:
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")


def plot_report(rep: Report, records: list[SampleRecord], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    overall = next(r for r in rep.rows if r["kind"] == "overall")
    by_backend: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for b, n in rep.columns:
        v = overall["cells"].get(Report.col(b, n))
        if v is not None:
            by_backend[b].append((n, v))
    fig, ax = plt.subplots(figsize=(6, 4))
    for b, pts in by_backend.items():
        xs, ys = zip(*sorted(pts), strict=True)
        ax.plot(xs, ys, marker="o", label=b)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("target length (tokens)")
    ax.set_ylabel(f"{OVERALL} score (0-100)")
    ax.set_ylim(0, 100)
    ax.set_title("HELMET-style score vs length")
    ax.legend()
    p = out_dir / "score_vs_length.png"
    _save(fig, p)
    plt.close(fig)
    paths.append(p)
    needle = [r for r in records if r.category == "recall" and r.depth is not None]
    for b in dict.fromkeys(r.backend for r in needle):
        rs = [r for r in needle if r.backend == b]
        lengths = sorted({r.length for r in rs})
        bins = [i / 10 for i in range(11)]
        grid = [[float("nan")] * len(lengths) for _ in bins]
        for j, n in enumerate(lengths):
            for i in range(len(bins)):
                sc = [r.score for r in rs if r.length == n and r.depth is not None and round(r.depth * 10) == i]
                if sc:
                    grid[i][j] = 100 * sum(sc) / len(sc)
        fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(lengths), 4))
        im = ax.imshow(grid, aspect="auto", cmap="RdYlGn", vmin=0, vmax=100, origin="upper")
        ax.set_xticks(range(len(lengths)), [f"{n // 1024}k" for n in lengths])
        ax.set_yticks(range(len(bins)), [f"{d:.1f}" for d in bins])
        ax.set_xlabel("target length")
        ax.set_ylabel("needle depth")
        ax.set_title(f"recall by depth: {b}")
        fig.colorbar(im, ax=ax)
        p = out_dir / f"depth_heatmap_{b.replace(':', '_').replace('#', '_')}.png"
        _save(fig, p)
        plt.close(fig)
        paths.append(p)
    return paths
