"""Bucketing the rare pairs into items that share K / V (``rare_items.py``): the Triton passes against the
plain-Python reference (under the interpreter on the CPU, on the GPU as they are)."""
import pytest
import torch

from kernels.sparse_prefill.rare_items import build_rare_items, max_rare_items, rare_items_reference
from kernels.testing import make_page_table

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _rare_ids(t, hkv, topk, max_blocks, fill, gen):
    """Random rows of distinct block ids, a random valid prefix each (``fill``: the mean share kept)."""
    ids = torch.stack([torch.randperm(max_blocks, generator=gen)[:topk] for _ in range(t * hkv)]).view(t, hkv, topk)
    n_valid = (torch.rand(t, hkv, generator=gen) * fill * 2 * topk).long().clamp(max=topk)
    return torch.where(torch.arange(topk) < n_valid[..., None], ids, -1).to(torch.int32)


@pytest.mark.parametrize("q_lens,hkv,topk,max_pages,tile_q,fill", [
    ([300], 4, 16, 20, 8, 0.15),       # M3-like: few rare pairs per token, many tokens per bucket
    ([37, 200, 5], 2, 4, 9, 4, 0.5),   # three requests: the same logical block of two requests stays apart
    ([70], 1, 8, 10, 16, 0.9),         # almost every slot a pair, 16-token items
])
def test_rare_items_match_reference(q_lens, hkv, topk, max_pages, tile_q, fill):
    gen = torch.Generator().manual_seed(len(q_lens) * 7 + topk)
    t = sum(q_lens)
    rare = _rare_ids(t, hkv, topk, max_pages, fill, gen)
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    n_req = len(q_lens)
    page_table = make_page_table(n_req, max_pages, n_req * max_pages * 2, gen)
    items = build_rare_items(rare.to(DEV), page_table.to(DEV), cu.to(DEV), tile_q)
    ref = rare_items_reference(rare, cu, tile_q)
    starts = items.round_start.cpu().tolist()
    tok, g, req, blk, page = (x.cpu() for x in (items.tok, items.g, items.req, items.blk, items.page))
    assert starts[0] == 0 and starts[-1] == sum(r[5] for r in ref) <= tok.shape[0]
    assert tok.shape[0] == max_rare_items(t, hkv, topk, n_req * max_pages, tile_q)
    i = 0
    for j, gg, r, b, toks, n_items in ref:  # the buckets' items come in bucket order, rounds first
        assert starts[j] <= i and i + n_items <= starts[j + 1]
        got = []
        for k in range(i, i + n_items):
            assert (g[k], req[k], blk[k], page[k]) == (gg, r, b, page_table[r, b]), (j, gg, r, b)
            row = tok[k].tolist()
            valid = [x for x in row if x >= 0]
            assert row[:len(valid)] == valid  # tokens first, then -1
            assert len(valid) == tile_q or k == i + n_items - 1  # only a bucket's last item is partial
            got += valid
        assert sorted(got) == toks
        i += n_items
    assert (tok[starts[-1]:] == -1).all()


def test_rare_items_without_pairs_are_empty():
    rare = torch.full((10, 2, 4), -1, dtype=torch.int32)
    items = build_rare_items(rare.to(DEV), torch.zeros(1, 3, dtype=torch.int32, device=DEV),
                             torch.tensor([0, 10], dtype=torch.int32, device=DEV), 8)
    assert items.round_start.cpu().tolist() == [0] * 5


def test_rare_items_too_many_buckets_is_a_value_error():
    rare = torch.full((4, 8, 32), -1, dtype=torch.int32)  # 32 x 8 x 4096 x 2048 buckets > 2^31
    with pytest.raises(ValueError, match="rare_pass='items' buckets .* over int32; use rare_pass='token'"):
        build_rare_items(rare, torch.zeros(4096, 2048, dtype=torch.int32), torch.zeros(4097, dtype=torch.int32), 8)
