"""The fp32 indexer references against brute force and against the contract (msa-spec 2.2, 2.3)."""
import math

import torch

from kernels.indexer import naive


def _brute_force(q, k, topk, block):
    """Per query, per head: full score vector, python-sorted selection. q [Tr, H, d], k [Sr, d]."""
    tr, h, d = q.shape
    sr = k.shape[0]
    ids = torch.full((tr, h, topk), -1, dtype=torch.int32)
    lse = torch.empty(tr, h)
    for i in range(tr):
        pos = sr - tr + i
        local = pos // block
        for hh in range(h):
            s = (k[: pos + 1].double() @ q[i, hh].double()) / math.sqrt(d)
            blocks = [(s[b * block:(b + 1) * block].max().item(), b) for b in range(local)]
            chosen = [b for _, b in sorted(blocks, key=lambda x: (-x[0], x[1]))[: topk - 1]] + [local]
            ids[i, hh, : len(chosen)] = torch.tensor(chosen, dtype=torch.int32)
            tokens = torch.cat([torch.arange(b * block, min((b + 1) * block, pos + 1)) for b in chosen])
            lse[i, hh] = torch.logsumexp(s[tokens], 0).float()
    return ids, lse


def test_reference_matches_brute_force_and_contract():
    g = torch.Generator().manual_seed(1)
    block, topk = 16, 4
    q = torch.randn(37, 3, 8, generator=g)
    k = torch.randn(150, 8, generator=g)
    ids, lse = naive.indexer_request_reference(q, k, topk, block, return_lse=True)
    ref_ids, ref_lse = _brute_force(q, k, topk, block)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)
    local = (150 - 37 + torch.arange(37)) // block
    n_valid = (ids >= 0).sum(-1)
    assert torch.equal(n_valid, torch.clamp(local + 1, max=topk)[:, None].expand(-1, 3))
    last = ids.gather(-1, (n_valid - 1).long()[..., None])[..., 0]
    assert torch.equal(last, local[:, None].expand(-1, 3).to(torch.int32))


def test_ties_go_to_smaller_block_id():
    q = torch.zeros(2, 1, 8)
    k = torch.zeros(18 * 16, 8)
    ids = naive.indexer_request_reference(q, k, 16, 16)
    assert ids[-1, 0].tolist() == list(range(15)) + [17]


def test_chunking_does_not_change_the_result(monkeypatch):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(40, 2, 8, generator=g)
    k = torch.randn(100, 8, generator=g)
    whole = naive.indexer_request_reference(q, k, 8, 16, return_lse=True)
    monkeypatch.setattr(naive, "_MAX_CHUNK_ELEMENTS", 2 * 100 * 3)  # 3 queries per chunk
    chunked = naive.indexer_request_reference(q, k, 8, 16, return_lse=True)
    assert torch.equal(whole[0], chunked[0])
    torch.testing.assert_close(whole[1], chunked[1])


def test_paged_form_equals_contiguous_form(paged_case):
    case = paged_case([20, 64, 5], [150, 64, 70], hkv=3, d_idx=16, block=64, dtype=torch.float32)
    ids_p, lse_p = naive.indexer_paged_reference(case["q_idx"], case["k_idx_cache"], case["page_table"],
                                                 case["cu_seqlens_q"], case["seq_lens_kv"], 8, return_lse=True)
    keys = [naive.gather_request_keys(case["k_idx_cache"], case["page_table"][r], n)
            for r, n in enumerate(case["seq_lens_kv"].tolist())]
    cu_kv = torch.tensor([0, 150, 214, 284], dtype=torch.int32)
    ids_c, lse_c = naive.indexer_varlen_reference(case["q_idx"], torch.cat(keys), case["cu_seqlens_q"], cu_kv,
                                                  8, block_size=64, return_lse=True)
    assert torch.equal(ids_p, ids_c)
    torch.testing.assert_close(lse_p, lse_c)
    scores = naive.paged_block_scores(case["q_idx"], case["k_idx_cache"], case["page_table"],
                                      case["cu_seqlens_q"], case["seq_lens_kv"])
    assert scores.shape == (89, 3, 3)
    assert torch.isinf(scores[20:84, :, 1:]).all()  # request 1 (64 keys) has one block
