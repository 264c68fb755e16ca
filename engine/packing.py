"""Packing one step's chunks into the model's inputs: token ids, positions and `AttentionMeta`
(`[T]` tokens of every chunk back to back, `cu_seqlens_q` marking where each chunk starts)."""
from __future__ import annotations

import torch

from engine.attention.meta import AttentionMeta
from engine.kv_cache import BlockManager
from engine.scheduler import ScheduledChunk
from engine.sequence import Sequence


def chunk_tokens(seq: Sequence, start: int, end: int) -> list[int]:
    """Tokens `start:end` of the request's prompt followed by its generated tokens."""
    n = len(seq.prompt_ids)
    if end <= n:
        return seq.prompt_ids[start:end]
    if start >= n:
        return seq.output_ids[start - n:end - n]
    return seq.prompt_ids[start:] + seq.output_ids[:end - n]


def pack_chunks(chunks: list[ScheduledChunk], blocks: BlockManager, device: torch.device,
                input_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, AttentionMeta]:
    """Pack the chunks' tokens (or the given `input_ids` `[T]`), positions and attention metadata."""
    ids, pos, slot_p, slot_o, cu = [], [], [], [], [0]
    q_lens, kv_lens, page_lists, tables = [], [], [], []
    B = blocks.page_size
    for c in chunks:
        rid, end = c.seq.request_id, c.start + c.length
        table = blocks.tables[rid]
        if input_ids is None:
            ids += chunk_tokens(c.seq, c.start, end)
        if c.length == 1:
            pos.append(c.start)
            slot_p.append(table[c.start // B])
            slot_o.append(c.start % B)
        else:
            p = torch.arange(c.start, end)
            pos.append(p)
            slot_p.append(blocks.table_tensor(rid)[p // B].long())
            slot_o.append(p % B)
        cu.append(cu[-1] + c.length)
        q_lens.append(c.length)
        kv_lens.append(end)
        n_pages = -(-end // B)
        page_lists.append(table[:n_pages])
        tables.append(blocks.table_tensor(rid)[:n_pages])
    pt = torch.nn.utils.rnn.pad_sequence(tables, batch_first=True, padding_value=-1)
    lens = torch.tensor(kv_lens, dtype=torch.int32)

    def cat(parts: list) -> torch.Tensor:
        return torch.cat([torch.as_tensor(x, dtype=torch.long).reshape(-1) for x in parts]).to(device)

    meta = AttentionMeta(
        cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=device), seq_lens_kv=lens.to(device),
        page_table=pt.to(device), slot_pages=cat(slot_p), slot_offsets=cat(slot_o), q_lens=q_lens,
        kv_lens=kv_lens, page_lists=page_lists, is_decode=all(q == 1 for q in q_lens),
        seq_lens_host=lens, page_table_host=pt)
    return (torch.tensor(ids, device=device) if input_ids is None else input_ids), cat(pos), meta
