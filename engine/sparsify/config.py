"""Settings of one `sparsify` run (typed; the CLI maps its options onto this)."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class SparsifyConfig:
    model: str
    out: str
    block_size: int = 128
    topk: int = 16
    d_idx: int | None = None  # None: the model's head dim
    dense_layers: tuple[int, ...] | None = None  # None: the first two layers
    index_norm: bool = False
    tokens: int = 16384  # calibration tokens (training sequences; one more sequence is held out)
    seq_len: int = 8192
    warmup_steps: int = 40  # per layer: dense KL over the whole causal history
    steps: int = 20  # per layer, after the warm-up: KL over the selected blocks
    queries: int = 128  # query positions sampled per step
    lr: float = 2e-3
    teacher: str = "mean"  # "mean" (msa-spec) | "max" (per-key max over the group's heads)
    long_range: float = 0.0  # share of each step's queries drawn by far mass (0: all uniform)
    recurrence: float = 0.0  # share of each training sequence's tokens overwritten by copies of earlier spans
    seed: int = 0
    data: tuple[str, ...] = ()
    eval_queries: int = 256  # evenly spaced positions of the held-out sequence for the recall
    device: str | None = None

    def __post_init__(self) -> None:
        if self.teacher not in ("mean", "max"):
            raise ValueError(f"--teacher {self.teacher!r}: use mean or max")
        if not 0.0 <= self.long_range <= 1.0:
            raise ValueError(f"--long-range {self.long_range} must lie in [0, 1]")
        if not 0.0 <= self.recurrence <= 0.5:
            raise ValueError(f"--recurrence {self.recurrence} must lie in [0, 0.5]")
        if self.seq_len < 2 * self.block_size:
            raise ValueError(f"--seq-len {self.seq_len} must be at least two blocks ({2 * self.block_size})")
        if self.tokens < self.seq_len:
            raise ValueError(f"--tokens {self.tokens} must be at least --seq-len {self.seq_len}")
        if self.warmup_steps < 0 or self.steps < 0 or self.warmup_steps + self.steps == 0:
            raise ValueError("--warmup-steps and --steps must be >= 0 and not both 0")

    @property
    def n_train(self) -> int:
        return self.tokens // self.seq_len

    def identity(self) -> dict:
        """What a checkpoint must match to be resumed (everything that changes the result)."""
        d = asdict(self)
        d.pop("out")
        d.pop("device")
        d["dense_layers"] = list(self.dense_layers) if self.dense_layers is not None else None
        d["data"] = list(self.data)
        return d
