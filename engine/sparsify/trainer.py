"""`sparsify`: calibrate MSA index projections on a frozen dense GQA model with the KL alignment
recipe (msa-spec section 3; `objective.py`), one layer at a time from cached activations.

Per MSA layer: `warmup_steps` Adam steps of dense KL over the whole causal history, then `steps`
of KL over the blocks the indexer selects; each step samples `queries` positions of one training
sequence (uniform positions, or partly the queries that read farthest: `long_range`; teacher
"mean" or "max" over the group's heads: `teacher`; training sequences optionally seeded with
copies of their own earlier spans: `recurrence`). Before and after, the attention-mass recall of
the selection is measured on a held-out sequence. A checkpoint (the projections so far + the
finished layers' figures) is written after each layer, so an interrupted run resumes at the next
layer. Output in `out`: the adapter
(`indexer.safetensors`, `msa_config.json`) and `provenance.json`.
"""
from __future__ import annotations

import json
import platform
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from engine.msa.adapter import AdapterError, base_fingerprint, save_adapter, write_json
from engine.msa.config import MSAConfig, default_dense_layers
from engine.msa.projections import IndexProjections, IndexRope
from engine.sparsify import objective as obj
from engine.sparsify.activations import collect_hidden, main_qk
from engine.sparsify.config import SparsifyConfig
from engine.sparsify.corpus import builtin_documents, token_sequences, user_documents, with_recurrences
from msa_common.atomic import atomic_path

CKPT = ".checkpoint"


def _git_commit() -> str | None:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                              text=True, timeout=5).stdout.strip() or None
    except Exception:  # noqa: BLE001 - provenance only: without git no commit is recorded
        return None


class LayerTrainer:
    """Trains one layer's index projections from its cached hidden inputs."""

    def __init__(self, model, layer: int, indexer, rope: IndexRope, msa: MSAConfig, hidden: torch.Tensor,
                 cfg: SparsifyConfig, device: torch.device):
        self.model, self.layer, self.ix, self.rope, self.msa, self.cfg = model, layer, indexer, rope, msa, cfg
        self.dev = device
        self.h = hidden  # [n_seq, S, hidden] fp16 cpu; the last sequence is held out
        S = hidden.shape[1]
        self.cos, self.sin = model.rope(torch.arange(S, device=device))
        self.qk = [main_qk(model, layer, hidden[n]) for n in range(hidden.shape[0])]

    def _logits(self, n: int, pos: torch.Tensor, grad: bool):
        h = self.h[n].to(self.dev, torch.float32)
        q, k = self.qk[n]
        t = obj.head_logits(q[pos], k, pos)
        with torch.set_grad_enabled(grad):
            ki = self.ix.index_k(h, self.rope, self.cos, self.sin, torch.arange(h.shape[0], device=self.dev))
            qi = self.ix.index_q(h[pos], self.rope, self.cos[pos], self.sin[pos], pos)
            s = obj.index_logits(qi, ki, pos)
        return t, s

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        n = self.h.shape[0] - 1
        S = self.h.shape[1]
        pos_all = torch.linspace(0, S - 1, self.cfg.eval_queries, device=self.dev).round().long().unique()
        rec, kl = [], []
        for pos in pos_all.split(128):
            t, s = self._logits(n, pos, grad=False)
            rec.append(obj.mass_recall(t, s, pos, self.msa.block_size, self.msa.topk).mean(dim=(1, 2)))
            kl.append(obj.kl_loss(t, s, obj.causal_mask(pos, S)[:, None, :].expand_as(s)) * len(pos))
        return {"recall": float(torch.cat(rec).mean()), "kl_dense": float(sum(kl) / len(pos_all))}

    @torch.no_grad()
    def _sample_queries(self, n: int, gen: torch.Generator) -> torch.Tensor:
        """Sorted query positions `[queries]` of training sequence n: uniform, except a `long_range`
        share picked as the queries with the largest far mass (`objective.far_mass`) out of a
        uniform pool four times that size (positions past the first block)."""
        cfg, S, B = self.cfg, self.h.shape[1], self.msa.block_size
        n_far = round(cfg.long_range * cfg.queries)
        pos = torch.randint(1, S, (cfg.queries - n_far,), generator=gen)
        if n_far:
            pool = torch.randint(B, S, (4 * n_far,), generator=gen).to(self.dev)
            q, k = self.qk[n]
            far = torch.cat([obj.far_mass(obj.head_logits(q[c], k, c), c, B) for c in pool.split(256)])
            pos = torch.cat([pos.to(self.dev), pool[far.topk(n_far).indices]])
        return pos.sort().values.to(self.dev)

    def train(self, gen: torch.Generator, on_step: Callable[[float], None]) -> list[float]:
        cfg, S = self.cfg, self.h.shape[1]
        params = list(self.ix.parameters())
        for p in params:
            p.requires_grad_(True)
        total = cfg.warmup_steps + cfg.steps
        opt = torch.optim.Adam(params, lr=cfg.lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.1 + 0.9 * 0.5 * (1 + torch.cos(
            torch.tensor(torch.pi * s / max(total, 1))).item()))
        losses = []
        n_train = self.h.shape[0] - 1
        for step in range(total):
            n = int(torch.randint(n_train, (1,), generator=gen))
            pos = self._sample_queries(n, gen)
            t, s = self._logits(n, pos, grad=True)
            if step < cfg.warmup_steps:
                support = obj.causal_mask(pos, S)[:, None, :].expand_as(s)
            else:
                support = obj.sparse_support(s, pos, self.msa.block_size, self.msa.topk)
            loss = obj.kl_loss(t, s, support, cfg.teacher)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            lv = float(loss.detach())
            losses.append(lv)
            on_step(lv)
        for p in params:
            p.requires_grad_(False)
        return losses


def _qk_weights(model) -> dict[str, torch.Tensor]:
    """HF-named float32 Q/K projections of a float32 `CausalLM` (its fused qkv split back)."""
    w = {}
    for i, L in enumerate(model.layers):
        q, k, _ = L.qkv.detach().float().cpu().split([L.q_size, L.kv_size, L.kv_size])
        w[f"model.layers.{i}.self_attn.q_proj.weight"] = q
        w[f"model.layers.{i}.self_attn.k_proj.weight"] = k
    return w


def _resolve_msa(cfg: SparsifyConfig, model_cfg) -> MSAConfig:
    dense = cfg.dense_layers if cfg.dense_layers is not None else default_dense_layers(model_cfg.num_layers)
    msa = MSAConfig(block_size=cfg.block_size, topk=cfg.topk, d_idx=cfg.d_idx or model_cfg.head_dim,
                    dense_layers=tuple(dense), index_norm=cfg.index_norm)
    msa.check_model(model_cfg)
    return msa


def _load_checkpoint(out: Path, cfg: SparsifyConfig, proj: IndexProjections) -> dict[str, Any]:
    state_file = out / CKPT / "state.json"
    if not state_file.is_file():
        return {}
    try:
        state = json.loads(state_file.read_text())
    except ValueError:
        raise AdapterError(f"corrupt checkpoint {state_file}: delete {out / CKPT} to start over") from None
    if state.get("config") != cfg.identity():
        raise AdapterError(f"the checkpoint in {out} was made with other settings: use another --out or delete "
                           f"{out / CKPT}")
    from safetensors.torch import load_file

    tensors = load_file(str(out / CKPT / "indexer.safetensors"))
    with torch.no_grad():
        for k, v in tensors.items():
            dict(proj.layers.named_parameters())[k].copy_(v)
    return state.get("layers", {})


def _save_checkpoint(out: Path, cfg: SparsifyConfig, proj: IndexProjections, layers: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    d = out / CKPT
    d.mkdir(parents=True, exist_ok=True)
    with atomic_path(d / "indexer.safetensors") as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in proj.layers.named_parameters()}, str(tmp))
    write_json(d / "state.json", {"config": cfg.identity(), "layers": layers})


def sparsify(cfg: SparsifyConfig, command: str = "", progress: bool = True,
             log: Callable[[str], None] = print, llm=None) -> dict[str, Any]:
    """Run the calibration; returns the provenance dict (also written to `out/provenance.json`).

    `llm`: an already loaded float32 dense `LLM` of `cfg.model` to reuse (tests); its weights are
    only read."""
    from tqdm import tqdm

    from engine.llm import LLM

    t0 = time.time()
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out).expanduser()
    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if llm is None:
        llm = LLM(cfg.model, attention="dense", device=device, dtype=torch.float32, max_model_len=cfg.seq_len + 1,
                  kv_cache_tokens=cfg.seq_len + 256, max_num_seqs=1, progress=progress)
    if llm.dtype != torch.float32 or llm.attention_kind != "dense":
        raise ValueError("sparsify needs the base model loaded dense in float32")
    device = str(llm.device)
    msa = _resolve_msa(cfg, llm.config)
    qk_weights = _qk_weights(llm.model)
    fingerprint = base_fingerprint(llm.config, qk_weights)
    proj = IndexProjections(llm.config, msa)
    proj.init_from_attention(qk_weights, llm.config)
    proj.to(device)
    docs = user_documents(list(cfg.data), cfg.seed) if cfg.data else builtin_documents(cfg.seed)
    seqs, sources = token_sequences(docs, llm.tokenizer, cfg.n_train + 1, cfg.seq_len)
    if cfg.recurrence:  # training sequences only; the held-out one stays natural text
        seqs[:cfg.n_train] = [with_recurrences(x, cfg.recurrence, cfg.seed * 7919 + n, min_gap=2 * msa.block_size)
                              for n, x in enumerate(seqs[:cfg.n_train])]
    out.mkdir(parents=True, exist_ok=True)
    done = _load_checkpoint(out, cfg, proj)
    todo = [i for i in proj.layer_ids if str(i) not in done]
    if done:
        log(f"resuming: {len(done)} layers done, {len(todo)} to go")
    t_collect = time.time()
    bar = tqdm(total=len(seqs), desc="activations", unit="seq", disable=not progress)
    hidden = collect_hidden(llm, seqs, tuple(todo), on_seq=lambda _: bar.update(1)) if todo else {}
    bar.close()
    collect_s = time.time() - t_collect
    rope = IndexRope(llm.config, msa.d_idx, torch.device(device))
    bar = tqdm(total=len(todo) * (cfg.warmup_steps + cfg.steps), desc="sparsify", unit="step", disable=not progress)
    for i in todo:
        ts = time.time()
        tr = LayerTrainer(llm.model, i, proj[i], rope, msa, hidden.pop(i), cfg, torch.device(device))
        before = tr.evaluate()
        gen = torch.Generator().manual_seed(cfg.seed * 100003 + i)
        losses = tr.train(gen, lambda loss, i=i: (bar.update(1), bar.set_postfix(layer=i, kl=f"{loss:.3f}")))
        after = tr.evaluate()
        del tr
        k = max(1, len(losses) // 10)
        done[str(i)] = {"recall_before": before["recall"], "recall_after": after["recall"],
                        "kl_dense_before": before["kl_dense"], "kl_dense_after": after["kl_dense"],
                        "loss_first": sum(losses[:k]) / k, "loss_last": sum(losses[-k:]) / k,
                        "seconds": round(time.time() - ts, 1)}
        _save_checkpoint(out, cfg, proj, done)
    bar.close()
    layers = {k: done[k] for k in sorted(done, key=int)}
    mean = lambda key: sum(v[key] for v in layers.values()) / max(len(layers), 1)  # noqa: E731 - a one-line local helper
    base = {"model_id": llm.model_id, "fingerprint": fingerprint, "sha256": llm.model_sha256,
            "num_layers": llm.config.num_layers}
    prov = {
        "base": base, "msa": msa.to_dict(), "settings": cfg.identity(), "command": command,
        "data": {"kind": "user" if cfg.data else "builtin (python stdlib sources + installed package descriptions)",
                 "recurrence": cfg.recurrence,
                 "documents_used": len(sources), "first_sources": sources[:20],
                 "train_sequences": cfg.n_train, "heldout_sequences": 1, "seq_len": cfg.seq_len},
        "recall_eval": {"heldout_queries": cfg.eval_queries, "seq_len": cfg.seq_len},
        "layers": layers, "mean_recall_before": mean("recall_before"), "mean_recall_after": mean("recall_after"),
        "wall_seconds": round(time.time() - t0, 1), "collect_seconds": round(collect_s, 1),
        "resumed": len(todo) < len(proj.layer_ids), "device": device, "torch_threads": torch.get_num_threads(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "git_commit": _git_commit(), "argv": sys.argv,
    }
    save_adapter(out, proj, base, prov)
    shutil.rmtree(out / CKPT, ignore_errors=True)
    return prov
