"""PNG plots (matplotlib, Agg backend): score vs length per task and backend, a needle depth x length
heat map per backend for the recall tasks that record a depth, and for MSA arms with selection telemetry
the indexer's block recall by layer x needle depth."""
from __future__ import annotations

from pathlib import Path

from msa_common.atomic import atomic_path
from msa_eval.report.build import Report
from msa_eval.report.telemetry import DEPTH_BINS, recall_by_layer_depth
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
    p = out_dir / "score_vs_length.png"
    _score_vs_length(plt, rep, p)
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
    paths += _recall_by_layer_depth(plt, records, out_dir)
    return paths


def _score_vs_length(plt, rep: Report, path: Path) -> dict[str, tuple[tuple[int, ...], tuple[float, ...]]]:
    """One line per task x backend (color: task, line style: backend): each point averages the same task,
    so a line never joins different mixes of tasks (an "overall" over seven categories at one length and
    over one at the next). Returns the lines drawn: {"task (backend)": (lengths, scores)}."""
    tasks = [r for r in rep.rows if r["kind"] == "task"]
    backends = list(dict.fromkeys(b for b, _ in rep.columns))
    styles = ["-", "--", ":", "-."]
    cmap = plt.get_cmap("tab20" if len(tasks) > 10 else "tab10")
    lines: dict[str, tuple[tuple[int, ...], tuple[float, ...]]] = {}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for ti, row in enumerate(tasks):
        for bi, b in enumerate(backends):
            pts = [(n, row["cells"].get(Report.col(b, n))) for bb, n in rep.columns if bb == b]
            pts = [(n, v) for n, v in pts if v is not None]
            if not pts:
                continue
            xs, ys = zip(*sorted(pts), strict=True)
            lines[f"{row['name']} ({b})"] = (xs, ys)
            ax.plot(xs, ys, marker="o", color=cmap(ti % cmap.N), linestyle=styles[bi % len(styles)],
                    label=f"{row['name']} ({b})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("target length (tokens)")
    ax.set_ylabel("task score (0-100)")
    ax.set_ylim(0, 100)
    ax.set_title("score vs length, per task")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    _save(fig, path)
    plt.close(fig)
    return lines


def _recall_by_layer_depth(plt, records: list[SampleRecord], out_dir: Path) -> list[Path]:
    """Per MSA arm with telemetry: a heat map of the indexer's block recall (vs the oracle) by MSA layer x
    needle depth, one panel per length."""
    paths = []
    tel = [r for r in records if r.msa_telemetry and r.depth is not None]
    for b in dict.fromkeys(r.backend for r in tel):
        lengths = sorted({r.length for r in tel if r.backend == b})
        fig, axes = plt.subplots(1, len(lengths), figsize=(0.4 + 3.6 * len(lengths), 4), squeeze=False)
        im = None
        for ax, n in zip(axes[0], lengths, strict=True):
            layers, grid = recall_by_layer_depth(records, b, n)
            cells = [[float("nan") if v is None else v for v in row] for row in grid]
            im = ax.imshow(cells, aspect="auto", cmap="RdYlGn", vmin=0, vmax=1, origin="upper")
            step = max(1, len(layers) // 8)
            ax.set_xticks(range(0, len(layers), step), [str(x) for x in layers[::step]])
            ax.set_yticks(range(DEPTH_BINS), [f"{i / DEPTH_BINS:.1f}" for i in range(DEPTH_BINS)])
            ax.set_xlabel("MSA layer")
            ax.set_ylabel("needle depth")
            ax.set_title(f"{n // 1024}k" if n % 1024 == 0 else str(n))
        fig.suptitle(f"block recall vs the oracle by layer x depth: {b}")
        fig.colorbar(im, ax=axes[0].tolist())
        p = out_dir / f"telemetry_recall_{b.replace(':', '_').replace('#', '_')}.png"
        _save(fig, p)
        plt.close(fig)
        paths.append(p)
    return paths
