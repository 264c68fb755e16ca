"""The FP8 KV cache in the engine (`--kv-cache-dtype fp8`, issue 22): cache layout and bytes, the fused RoPE +
cache-write kernel against its reference (interpreter), the CPU attention paths reading e4m3 codes as exactly
their dequantised values, the real default model under fp8 against its fp32 cache, and the bad-input lines."""
from __future__ import annotations

import inspect
import os

import pytest
import torch

from engine.attention.dense import DenseAttention
from engine.attention.meta import AttentionMeta
from engine.attention.msa_cpu import sparse_attention
from engine.cpu_decode import CpuDecodePlan, cache_rows, rope_and_write
from engine.gpu.ops import rope_cache, rope_cache_ref
from engine.kv_cache import CacheConfig, KVCache, bytes_per_token, index_key_dtype, rotate_qk, write_kv
from engine.kv_fp8 import check_rotation, dequant_pages, kv_dtype_name, resolve_kv_dtype
from kernels._common.fp8 import FP8, KV_DTYPES, dequantize_rows, hadamard, quantize_rows

BF16 = torch.bfloat16
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
needs_triton = pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                                  reason="the Triton kernel needs a GPU or TRITON_INTERPRET=1")


# -- the cache -------------------------------------------------------------------------------------------
def test_fp8_cache_layout_and_bytes():
    cfg = CacheConfig(page_size=16, num_pages=5, dtype=FP8, model_dtype=BF16)
    c = KVCache(4, 3, 64, cfg, torch.device("cpu"), index_dim=32, index_layers=(1, 3))
    assert c.quantized and c.k[0].dtype == FP8 and c.v[3].shape == (6, 3, 16, 64)
    assert len(c.k_scale) == len(c.v_scale) == 4
    assert c.k_scale[2].shape == (6, 3, 16) and c.k_scale[2].dtype == torch.float32
    assert c.k_idx[1].dtype == torch.int8 and cfg.index_query_dtype == BF16  # int8 index keys, bf16 queries
    assert c.index_scale(3).shape == (6, 16) and c.index_scale(0) is None and sorted(c.k_idx_scale) == [1, 3]
    ks, vs = c.scales(1)
    assert ks is c.k_scale[1] and vs is c.v_scale[1]
    slots = 6 * 16
    assert c.bytes() == 4 * 2 * slots * 3 * (64 + 4) + 2 * slots * (32 + 4)
    plain = KVCache(4, 3, 64, CacheConfig(page_size=16, num_pages=5, dtype=BF16), torch.device("cpu"))
    assert not plain.quantized and plain.scales(0) == (None, None) and plain.k_scale == []
    # per token: 1 byte per element + 2 fp32 scales per (layer, KV head); the index keys in their dtype (int8:
    # + one fp32 scale per index layer)
    assert bytes_per_token(30, 3, 64, FP8) == 30 * 3 * (2 * 64 + 8)
    assert bytes_per_token(4, 4, 128, FP8, 128, 4, BF16) == 4 * 4 * (2 * 128 + 8) + 2 * 4 * 128
    assert bytes_per_token(4, 4, 128, FP8, 128, 4, torch.int8) == 4 * 4 * (2 * 128 + 8) + 4 * (128 + 4)
    assert index_key_dtype(FP8, BF16) == torch.int8 and index_key_dtype(BF16, None) == BF16
    ratio = bytes_per_token(30, 3, 64, BF16) / bytes_per_token(30, 3, 64, FP8)
    assert 1.85 < ratio < 1.9  # ~1.9x the tokens in the same GPU memory at head_dim 64
    with pytest.raises(ValueError, match="model_dtype"):
        KVCache(2, 1, 16, CacheConfig(page_size=16, num_pages=2, dtype=FP8), torch.device("cpu"),
                index_dim=8, index_layers=(0,))


def test_write_index_keys_quantises_to_int8():
    """An FP8 cache's index keys: int8 codes and one fp32 scale per token by the rule of `kernels._common.int8`;
    a bf16 cache's: cast, no scales."""
    from kernels._common.int8 import quantize_int8_rows

    g = torch.Generator().manual_seed(2)
    k = torch.randn(5, 32, generator=g) * 5
    k[2] = 0  # an all-zero row: the 1e-12 floor
    pages, offs = torch.tensor([0, 3, 3, 1, 2]), torch.tensor([7, 0, 5, 2, 2])
    c = KVCache(2, 1, 16, CacheConfig(page_size=8, num_pages=4, dtype=FP8, model_dtype=BF16), torch.device("cpu"),
                index_dim=32, index_layers=(1,))
    c.write_index_keys(1, pages, offs, k)
    k8, scale = quantize_int8_rows(k)
    assert torch.equal(c.k_idx[1][pages, offs], k8) and torch.equal(c.index_scale(1)[pages, offs], scale)
    got = c.k_idx[1][pages, offs].float() * c.index_scale(1)[pages, offs, None]
    assert ((got - k).abs() <= scale[:, None] / 2 + 1e-6).all() and torch.equal(got[2], k[2])
    plain = KVCache(2, 1, 16, CacheConfig(page_size=8, num_pages=4, dtype=BF16), torch.device("cpu"),
                    index_dim=32, index_layers=(1,))
    plain.write_index_keys(1, pages, offs, k)
    assert plain.index_scale(1) is None and torch.equal(plain.k_idx[1][pages, offs], k.to(BF16))


def test_write_kv_quantises_rows():
    g = torch.Generator().manual_seed(1)
    kc = torch.zeros(4, 2, 8, 16, dtype=FP8)
    vc, ks, vs = kc.clone(), torch.zeros(4, 2, 8), torch.zeros(4, 2, 8)
    k, v = torch.randn(5, 2, 16, generator=g) * 7, torch.randn(5, 2, 16, generator=g)
    pages, offs = torch.tensor([0, 3, 3, 1, 2]), torch.tensor([7, 0, 5, 2, 2])
    write_kv(kc, vc, ks, vs, pages, offs, k, v)
    k8, k_s = quantize_rows(k)
    assert torch.equal(kc[pages, :, offs].view(torch.uint8), k8.view(torch.uint8))
    assert torch.equal(ks[pages, :, offs], k_s)
    got = dequantize_rows(vc[pages, :, offs], vs[pages, :, offs])
    assert ((got - v).abs() <= v.abs().amax(-1, keepdim=True) / 16).all()  # e4m3: 3 mantissa bits


# -- the fused RoPE + cache write --------------------------------------------------------------------------
def _rope_inputs(t, hq, hkv, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(t, (hq + 2 * hkv) * d, generator=g) * 3).to(dtype)
    ang = torch.rand(t, d // 2, generator=g) * 6
    cos, sin = torch.cat([ang.cos()] * 2, -1).contiguous(), torch.cat([ang.sin()] * 2, -1).contiguous()
    qkv[1, (hq + hkv) * d:(hq + hkv + 1) * d] = 0  # an all-zero V row: the 1e-12 floor of the scale
    return qkv, cos, sin


def _fp8_caches(pages, hkv, page, d):
    kc = torch.zeros(pages + 1, hkv, page, d, dtype=FP8)
    return kc, kc.clone(), torch.zeros(pages + 1, hkv, page), torch.zeros(pages + 1, hkv, page)


@needs_triton
@pytest.mark.parametrize("rotated", [False, True], ids=["fp8", "fp8-hadamard"])
@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("shape", [(7, 6, 3, 64, 16), (5, 4, 1, 32, 8)])  # (T, Hq, Hkv, d, B)
def test_rope_cache_kernel_fp8_matches_reference(dtype, shape, rotated):
    """The Triton kernel (on the GPU when there is one, else under TRITON_INTERPRET=1) against the reference,
    with fp8-hadamard's rotation of q and K in the same launch too."""
    t, hq, hkv, d, page = shape
    qkv, cos, sin = (x.to(DEV) for x in _rope_inputs(t, hq, hkv, d, dtype, seed=t + d))
    rotation = hadamard(d, DEV) if rotated else None
    n_pages = 4
    slots = torch.randperm(n_pages * page, generator=torch.Generator().manual_seed(3))[:t]
    pages, offs = (slots // page).to(DEV), (slots % page).to(DEV)
    out = []
    for impl in ("torch", "triton"):
        kc, vc, ks, vs = (x.to(DEV) for x in _fp8_caches(n_pages, hkv, page, d))
        q = rope_cache(qkv, cos, sin, kc, vc, pages, offs, hq, hkv, impl=impl, k_scale=ks, v_scale=vs,
                       rotation=rotation)
        out.append(tuple(x.cpu() for x in (q, kc, vc, ks, vs)))
    pages, offs = pages.cpu(), offs.cpu()
    (q0, *ref), (q1, *got) = out
    # the reference rotates an unrotated bf16 q in bf16, the kernel in fp32 (both round the rotated q to bf16)
    tol = 1e-5 if dtype != BF16 else 1e-2 if rotated else 4e-2
    torch.testing.assert_close(q1.float(), q0.float(), rtol=tol, atol=tol)
    for a, b in zip(ref[:2], got[:2], strict=True):  # codes: at most rare one-code rounding differences
        diff = (a.view(torch.uint8).int() - b.view(torch.uint8).int()).abs()
        assert diff.max() <= 1 and (diff > 0).float().mean() < 0.01
    for a, b in zip(ref[2:], got[2:], strict=True):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=0)
    assert ref[3][pages[1], :, offs[1]].min() == pytest.approx(1e-12 / 448)  # the zero V row's floor
    assert (ref[2][pages, :, offs] > 0).all()  # every written slot got its scale


@needs_triton
def test_rope_cache_fp8_values_and_bad_inputs():
    t, hq, hkv, d, page = 3, 2, 1, 16, 8
    qkv, cos, sin = (x.to(DEV) for x in _rope_inputs(t, hq, hkv, d, torch.float32, seed=5))
    pages, offs = torch.tensor([0, 0, 1], device=DEV), torch.tensor([0, 5, 7], device=DEV)
    kc, vc, ks, vs = (x.to(DEV) for x in _fp8_caches(2, hkv, page, d))
    rope_cache(qkv, cos, sin, kc, vc, pages, offs, hq, hkv, impl="triton", k_scale=ks, v_scale=vs)
    fc, fv = torch.zeros(3, hkv, page, d, device=DEV), torch.zeros(3, hkv, page, d, device=DEV)
    rope_cache_ref(qkv, cos, sin, fc, fv, pages, offs, hq, hkv)  # the unquantised values
    for c8, s, want in ((kc, ks, fc), (vc, vs, fv)):
        got = dequantize_rows(c8, s)[pages, :, offs]
        w = want[pages, :, offs]
        assert ((got - w).abs() <= w.abs().amax(-1, keepdim=True) / 16 + 1e-6).all()
    with pytest.raises(ValueError, match="need k_scale and v_scale"):
        rope_cache(qkv, cos, sin, kc, vc, pages, offs, hq, hkv, impl="triton")
    with pytest.raises(ValueError, match="go with float8_e4m3fn K/V caches only"):
        rope_cache(qkv, cos, sin, fc, fv, pages, offs, hq, hkv, impl="torch", k_scale=ks, v_scale=vs)
    with pytest.raises(ValueError, match=r"must be fp32 \[num_pages, Hkv, B\]"):
        rope_cache(qkv, cos, sin, kc, vc, pages, offs, hq, hkv, k_scale=ks[:1], v_scale=vs)
    with pytest.raises(ValueError, match=r"must be fp32 \[num_pages, Hkv, B\]"):
        rope_cache(qkv, cos, sin, kc, vc, pages, offs, hq, hkv, k_scale=ks.to(BF16), v_scale=vs)


@pytest.mark.parametrize("fp8", [True, False], ids=["fp8", "fp32"])
def test_rotated_rope_cache_paths_agree(fp8):
    """fp8-hadamard's three write paths hold the same values: the fused reference (`rope_cache_ref` with the
    rotation), the CPU decode rows (`rope_and_write`) and the unfused layer path (RoPE, `rotate_qk`, `write_kv`);
    and the rotation leaves q . k as it was."""
    from engine.rope import apply_rope

    t, hq, hkv, d, page = 6, 6, 3, 64, 16
    qkv, cos, sin = _rope_inputs(t, hq, hkv, d, torch.float32, seed=11)
    rot = hadamard(d)
    pages, offs = torch.tensor([2, 0, 0, 1, 2, 3]), torch.tensor([0, 1, 15, 4, 9, 3])

    def caches():
        return _fp8_caches(4, hkv, page, d) if fp8 else (torch.zeros(5, hkv, page, d), torch.zeros(5, hkv, page, d),
                                                         None, None)

    ref, rows, unfused = caches(), caches(), caches()
    q_ref = rope_cache_ref(qkv, cos, sin, *ref[:2], pages, offs, hq, hkv, *ref[2:], rotation=rot)
    q_rows = rope_and_write(qkv, cos, sin, *rows[:2], cache_rows(pages, offs, hkv, page), hq, hkv, *rows[2:], rot)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], -1)
    q, k = apply_rope(q.reshape(t, hq, d), cos, sin), apply_rope(k.reshape(t, hkv, d), cos, sin)
    q_unf, k_rot = rotate_qk(q, k, rot)
    write_kv(*unfused[:2], *unfused[2:], pages, offs, k_rot, v.reshape(t, hkv, d))
    for got_q, got in ((q_rows, rows), (q_unf, unfused)):
        torch.testing.assert_close(got_q.float(), q_ref, rtol=1e-5, atol=1e-5)
        for a, b in zip(ref[:2], got[:2], strict=True):
            if fp8:  # e4m3 codes of fp32 values equal up to summation order: a rare one-code difference
                diff = (a.view(torch.uint8).int() - b.view(torch.uint8).int()).abs()
                assert diff.max() <= 1 and (diff > 0).float().mean() < 0.01
            else:
                torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    k_plain = apply_rope(qkv[:, hq * d:(hq + hkv) * d].reshape(t, hkv, d), cos, sin)
    scores = torch.einsum("thd,tkd->thk", q, k_plain)
    torch.testing.assert_close(torch.einsum("thd,tkd->thk", q_ref, k_rot), scores, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(k_rot, k_plain, atol=1e-2)  # the stored K really is rotated
    with pytest.raises(ValueError, match=r"rotation must be a contiguous float32 \[64, 64\]"):
        rope_cache(qkv, cos, sin, *ref[:2], pages, offs, hq, hkv, k_scale=ref[2], v_scale=ref[3],
                   rotation=rot[:32])


def test_cpu_rope_and_write_equals_the_reference():
    t, hq, hkv, d, page = 6, 6, 3, 64, 16
    qkv, cos, sin = _rope_inputs(t, hq, hkv, d, torch.float32, seed=9)
    pages, offs = torch.tensor([2, 0, 0, 1, 2, 3]), torch.tensor([0, 1, 15, 4, 9, 3])
    kc, vc, ks, vs = _fp8_caches(4, hkv, page, d)
    q = rope_and_write(qkv, cos, sin, kc, vc, cache_rows(pages, offs, hkv, page), hq, hkv, ks, vs)
    rc, rv, rks, rvs = _fp8_caches(4, hkv, page, d)
    q_ref = rope_cache_ref(qkv, cos, sin, rc, rv, pages, offs, hq, hkv, k_scale=rks, v_scale=rvs)
    assert q.dtype == torch.float32
    torch.testing.assert_close(q, q_ref, rtol=1e-6, atol=1e-6)
    assert torch.equal(kc.view(torch.uint8), rc.view(torch.uint8))
    assert torch.equal(vc.view(torch.uint8), rv.view(torch.uint8))
    torch.testing.assert_close(ks, rks, rtol=1e-6, atol=0)
    torch.testing.assert_close(vs, rvs, rtol=0, atol=0)


# -- the CPU attention paths read codes as their dequantised values -----------------------------------------
N_PAGES, HQ, HKV, D, B = 24, 9, 3, 32, 16


def _meta(q_lens, kv_lens, seed):
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(N_PAGES, generator=g).tolist()
    lists = [[perm.pop() for _ in range(-(-kl // B))] for kl in kv_lens]
    cu = [0]
    for ql in q_lens:
        cu.append(cu[-1] + ql)
    pt = torch.full((len(kv_lens), max(map(len, lists))), -1, dtype=torch.int32)
    for r, p in enumerate(lists):
        pt[r, :len(p)] = torch.tensor(p, dtype=torch.int32)
    z = torch.zeros(0, dtype=torch.long)
    meta = AttentionMeta(torch.tensor(cu, dtype=torch.int32), torch.tensor(kv_lens, dtype=torch.int32), pt, z, z,
                         list(q_lens), list(kv_lens), lists, is_decode=all(ql == 1 for ql in q_lens),
                         page_table_host=pt)
    return meta, g


def _fp8_cache_and_values(g):
    """A random FP8 cache (with NaN bytes on pages no request uses) and its dequantised fp32 twin."""
    k8, ks = quantize_rows(torch.randn(N_PAGES, HKV, B, D, generator=g) * 2)
    v8, vs = quantize_rows(torch.randn(N_PAGES, HKV, B, D, generator=g))
    return (k8, v8, ks, vs), (dequantize_rows(k8, ks), dequantize_rows(v8, vs))


@pytest.mark.parametrize("batch", [([37, 1, 20], [37, 70, 50]), ([1, 1, 1, 1], [1, 17, 100, 64])])
def test_dense_cpu_reads_fp8_as_its_values(batch):
    meta, g = _meta(*batch, seed=2)
    (k8, v8, ks, vs), (kf, vf) = _fp8_cache_and_values(g)
    q = torch.randn(sum(meta.q_lens), HQ, D, generator=g)
    attn = DenseAttention(D ** -0.5)
    want = attn(0, q, kf, vf, meta)
    got = attn(0, q, k8, v8, meta, k_scale=ks, v_scale=vs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    if meta.is_decode:  # the batched decode plan too
        plan = CpuDecodePlan.build(meta, HKV, B, D ** -0.5)
        torch.testing.assert_close(plan.run(q, k8, v8, ks, vs), plan.run(q, kf, vf), rtol=1e-5, atol=1e-6)
        assert plan.run(q, k8, v8, ks, vs).dtype == torch.float32


@pytest.mark.parametrize("batch", [([37, 1, 50], [37, 70, 50]), ([1, 1, 1], [1, 100, 64])])
def test_msa_cpu_reads_fp8_as_its_values(batch):
    meta, g = _meta(*batch, seed=4)
    (k8, v8, ks, vs), (kf, vf) = _fp8_cache_and_values(g)
    q = torch.randn(sum(meta.q_lens), HQ, D, generator=g)
    t, topk = q.shape[0], 3
    pos = torch.cat([torch.arange(kl - ql, kl) for ql, kl in zip(meta.q_lens, meta.kv_lens, strict=True)])
    ids = torch.randint(0, 8, (t, HKV, topk), generator=g, dtype=torch.int32)
    ids = torch.minimum(ids, (pos // B)[:, None, None].int())
    ids[:, :, -1] = (pos // B)[:, None].int()  # the own block last
    want = sparse_attention(q, kf, vf, meta, ids, D ** -0.5)
    got = sparse_attention(q, k8, v8, meta, ids, D ** -0.5, k_scale=ks, v_scale=vs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_dequant_pages_fills_the_pages_in_use():
    meta, g = _meta([5, 1], [40, 16], seed=6)
    (k8, _, ks, _), (kf, _) = _fp8_cache_and_values(g)
    got = dequant_pages(k8, ks, meta, torch.float32)
    used = sorted({p for pl in meta.page_lists for p in pl})
    assert torch.equal(got[used], kf[used])
    rest = [p for p in range(N_PAGES) if p not in used]
    assert not got[rest].any()
    assert dequant_pages(kf, None, meta, torch.float32) is kf


# -- the real default model -------------------------------------------------------------------------------
PROMPT = "The lighthouse keeper climbed the stairs every evening to light the lamp, and the ships passed safely. "


def _kernel_refs_take_scales() -> bool:
    from kernels.decode import msa_decode_attention
    from kernels.sparse_prefill import msa_prefill_attention

    return all("k_scale" in inspect.signature(f).parameters for f in (msa_prefill_attention, msa_decode_attention))


_BASELINE: dict[str, object] = {}


def _fp32_baseline(default_llm, ids):
    """The exact fp32-cache dense run of the prompt, once (the MSA arms at top-k 4 over 2 blocks read every key:
    their fp32 runs give these same tokens and log-probs)."""
    from engine import SamplingParams

    if "out" not in _BASELINE:
        _BASELINE["out"] = default_llm.generate([ids], SamplingParams(max_tokens=4, ignore_eos=True, logprobs=20))[0]
    return _BASELINE["out"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["dense", "msa", pytest.param("msa-ref", marks=pytest.mark.skipif(
    not _kernel_refs_take_scales(), reason="the kernels' torch references do not take k_scale/v_scale yet"))])
def test_default_model_fp8_cache_against_fp32(default_llm, kind):
    """The fp8 cache against the exact fp32 cache of the same model and prompt (200 tokens, 2 blocks of 128, all
    selected at top-k 4): the first generated token's log-probs and the greedy tokens. Measured on this prompt:
    the top token (p ~ 1) moves by 4e-5, the rest of the top 20 (log-probs -7 to -12) by up to 0.54 (dense) and
    0.48 (msa); greedy 4 of 4 equal for both (at 300 tokens: 0.54 / 0.80, 6 of 6)."""
    from engine import LLM, SamplingParams

    ids = default_llm._to_ids(PROMPT * 20)[:200]
    a = _fp32_baseline(default_llm, ids)
    llm = LLM("smollm2-135m", attention=kind, device="cpu", kv_cache_tokens=1024, progress=False,
              kv_cache_dtype="fp8", msa_overrides={"topk": 4} if kind != "dense" else None)
    assert llm.kv_dtype_name == "fp8" and llm.cache.quantized and default_llm.kv_dtype_name == "fp32"
    b = llm.generate([ids], SamplingParams(max_tokens=4, ignore_eos=True, logprobs=20))[0]
    la, lb = a.logprobs[0][1], b.logprobs[0][1]
    common = set(la) & set(lb)
    assert len(common) >= 15  # the same candidates, nearly all of them
    top = max(la, key=la.__getitem__)
    assert top == a.token_ids[0] == b.token_ids[0] and abs(la[top] - lb[top]) < 0.01
    assert max(abs(la[i] - lb[i]) for i in common) < 1.2
    assert sum(x == y for x, y in zip(a.token_ids, b.token_ids, strict=True)) >= 3


@pytest.mark.timeout(600)
def test_default_model_fp8_msa_selects_on_int8_index_keys(default_llm):
    """1000 tokens (8 blocks of 128, top-k 4: the selection matters): the fp8 cache holds the index keys as int8
    with a scale per written token, and MSA on it generates what MSA on the fp32 cache generates (the
    projections' keys from the two runs differ by the fp8 K/V of the layers before)."""
    from engine import LLM, SamplingParams

    ids = default_llm._to_ids(PROMPT * 60)[:1000]
    out = {}
    for kv in ("auto", "fp8"):
        llm = LLM("smollm2-135m", attention="msa", device="cpu", kv_cache_tokens=2048, progress=False,
                  kv_cache_dtype=kv, msa_overrides={"topk": 4})
        out[kv] = llm.generate([ids], SamplingParams(max_tokens=8, ignore_eos=True))[0].token_ids
        if kv == "fp8":
            layer = min(llm.cache.k_idx)
            assert llm.cache.k_idx[layer].dtype == torch.int8
            assert int((llm.cache.index_scale(layer) > 0).sum()) >= len(ids)  # every written token has its scale
    assert out["fp8"][0] == out["auto"][0]
    assert sum(x == y for x, y in zip(out["auto"], out["fp8"], strict=True)) >= 6


@pytest.mark.timeout(600)
def test_m3_fp8_cache_keeps_int8_index_keys(tmp_path):
    """MiniMax-M3 (a tiny random checkpoint, `engine.m3.testing`; 876 tokens = 14 blocks of 64, its index branch
    at top-4) on an fp8 and an fp8-hadamard cache: its sparse layers' index keys are int8 with scales, and the first
    token's top-5 log-probs are the fp32 cache's to 0.05 (measured: 0.007 for fp8)."""
    pytest.importorskip("transformers")
    from engine import LLM, SamplingParams
    from engine.m3.testing import text_config, write_checkpoint

    write_checkpoint(tmp_path / "m3", text_config(num_layers=4, block=64, topk_blocks=4))
    ids = list(range(8, 300)) * 3
    out = {}
    for kv in ("auto", "fp8", "fp8-hadamard"):
        llm = LLM(str(tmp_path / "m3"), attention="msa", device="cpu", kv_cache_tokens=4096, kv_cache_dtype=kv,
                  progress=False)
        if kv != "auto":
            assert sorted(llm.cache.k_idx) == sorted(llm.cache.k_idx_scale) == [1, 3]  # the sparse layers
            assert all(t.dtype == torch.int8 for t in llm.cache.k_idx.values())
            assert (llm.cache.k_rotation is not None) == (kv == "fp8-hadamard")
        out[kv] = llm.generate([ids], SamplingParams(max_tokens=2, ignore_eos=True, logprobs=5))[0]
    la = out["auto"].logprobs[0][1]
    for kv in ("fp8", "fp8-hadamard"):
        lb = out[kv].logprobs[0][1]
        common = set(la) & set(lb)
        assert out["auto"].token_ids[0] == out[kv].token_ids[0] and len(common) >= 4, kv
        assert max(abs(la[t] - lb[t]) for t in common) < 0.05, kv


@pytest.mark.timeout(900)
def test_fp8_hadamard_cache_tracks_fp32_closer_than_fp8():
    """`--kv-cache-dtype fp8-hadamard` (q and K rotated after RoPE, `KVCache.k_rotation`): the default model on
    4000 tokens of the essays (offset 5000, seed 42), teacher-forced: its prompt log-probs differ from the fp32
    cache's by less than plain fp8's (measured mean |d log p| 0.0604 against 0.0797; the K rows' attention error
    in `benchmarks/quality/fp8_error.py`: -29-36%), at fp8's bytes."""
    from engine import LLM, SamplingParams
    from tasks.loaders.essays import essay_text

    lp, caches = {}, {}
    for kv in ("auto", "fp8", "fp8-hadamard"):
        llm = LLM("smollm2-135m", attention="dense", device="cpu", kv_cache_tokens=4096, progress=False,
                  kv_cache_dtype=kv)
        ids = llm.tokenizer.encode(essay_text(42), add_special_tokens=False)[5000:9000]
        out = llm.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
        lp[kv] = torch.tensor([row[0] for row in out.prompt_logprobs[1:]])
        caches[kv] = llm
    had = caches["fp8-hadamard"]
    assert had.kv_dtype_name == "fp8-hadamard" and had.cache.quantized and had.cache.k_rotation is not None
    assert caches["fp8"].cache.k_rotation is None and had.cache.bytes() == caches["fp8"].cache.bytes()
    err = {kv: float((lp[kv] - lp["auto"]).abs().mean()) for kv in ("fp8", "fp8-hadamard")}
    assert err["fp8-hadamard"] < 0.9 * err["fp8"], err


def test_decode_benchmark_fills_an_fp8_cache():
    """`benchmarks.engine_gpu` times decode steps on a cache it fills at random (`--preset m3-decode-fp8`): on an
    fp8 cache the codes are finite e4m3 values and the index keys int8, and MSA decode steps of a tiny random
    MiniMax-M3 run on them (the CPU's kernel references)."""
    pytest.importorskip("transformers")
    from benchmarks.engine_gpu.stacks import fake_prefill, timed_steps
    from engine.attention import make_attention
    from engine.config import from_hf_config
    from engine.m3.testing import text_config
    from engine.testing import random_engine, random_model

    cfg = from_hf_config({"model_type": "minimax_m3_vl_text", **text_config(num_layers=4, vocab=1000)})
    model = random_model(cfg, "cpu", torch.float32, seed=0)
    ix = model.indexer(topk=4)
    eng = random_engine(model, make_attention("msa", "cpu", cfg, ix), "cpu", 4096, max_num_seqs=2,
                        index_dim=ix.config.d_idx, index_layers=ix.layers, kv_dtype=FP8)
    assert eng.cache.quantized and all(t.dtype == torch.int8 for t in eng.cache.k_idx.values())
    fake_prefill(eng, 2, 700, max_tokens=6)
    assert torch.isfinite(eng.cache.k[0].float()).all() and (eng.cache.k_scale[0] > 0).all()
    assert all((s > 0).all() for s in eng.cache.k_idx_scale.values())
    steps = timed_steps(eng, 2)
    assert len(steps) == 2 and all(t > 0 for t in steps)
    assert all(len(seq.output_ids) == 4 for seq in eng.scheduler.running)


# -- bad input --------------------------------------------------------------------------------------------
def test_kv_dtype_choices_and_refusals(monkeypatch):
    from engine.server.config import KV_CACHE_DTYPES as SERVER_DTYPES
    from msa_eval.cli.options import KV_CACHE_DTYPES

    assert KV_CACHE_DTYPES == SERVER_DTYPES == KV_DTYPES
    cpu = torch.device("cpu")
    assert resolve_kv_dtype("auto", cpu, torch.float32) == torch.float32
    assert resolve_kv_dtype("bf16", cpu, torch.float32) == BF16
    assert resolve_kv_dtype("fp8", cpu, torch.float32) == FP8
    assert resolve_kv_dtype("fp8-hadamard", cpu, torch.float32) == FP8
    assert [kv_dtype_name(x) for x in (FP8, BF16, torch.float32)] == ["fp8", "bf16", "fp32"]
    assert kv_dtype_name(FP8, rotated=True) == "fp8-hadamard"
    with pytest.raises(ValueError, match="unknown kv_cache_dtype"):
        resolve_kv_dtype("int8", cpu, torch.float32)
    with pytest.raises(ValueError, match="rotate_k goes with an fp8 cache"):
        CacheConfig(dtype=BF16, rotate_k=True)
    with pytest.raises(ValueError, match=r"must be a power of two \(this model's is 96\); use --kv-cache-dtype fp8"):
        check_rotation("fp8-hadamard", 96)
    check_rotation("fp8", 96)  # only the rotation needs it
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ValueError, match=r"compute capability >= 8.9.*this GPU is 8\.0; use --kv-cache-dtype bf16"):
        resolve_kv_dtype("fp8", torch.device("cuda"), BF16)
    assert resolve_kv_dtype("bf16", torch.device("cuda"), BF16) == BF16  # bf16 on that GPU is fine

    from engine import LLM
    from engine.errors import EngineError

    with pytest.raises(EngineError, match="this GPU is 8.0"):  # before anything loads
        LLM("smollm2-135m", device="cuda", kv_cache_dtype="fp8", progress=False)
    with pytest.raises(EngineError, match="unknown kv_cache_dtype 'fp4'"):
        LLM("smollm2-135m", device="cpu", kv_cache_dtype="fp4", progress=False)


def test_server_and_cli_flags():
    from click.testing import CliRunner

    from engine.server.__main__ import parse_args
    from engine.server.config import ServerConfig
    from msa_eval.cli.options import engine_kwargs
    from msa_eval.cli.serve import serve

    config, _ = parse_args(["--kv-cache-dtype", "fp8"])
    assert config.kv_cache_dtype == "fp8" and config.llm_kwargs()["kv_cache_dtype"] == "fp8"
    assert parse_args([])[0].kv_cache_dtype == "auto"
    with pytest.raises(SystemExit):  # argparse's choice error
        parse_args(["--kv-cache-dtype", "int8"])
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        ServerConfig(kv_cache_dtype="int8")
    res = CliRunner().invoke(serve, ["--kv-cache-dtype", "int8"])
    assert res.exit_code == 2 and "int8" in res.output and "fp8" in res.output
    assert engine_kwargs(None, None, False, 1, "fp8") == {"kv_cache_dtype": "fp8"}
    assert engine_kwargs(None, None, False) == {}  # unset: a default run's config hash is unchanged


@pytest.mark.timeout(300)
def test_real_server_reports_its_fp8_cache():
    """`msa-eval serve --kv-cache-dtype fp8` on 127.0.0.1: /v1/models says what the cache holds, and it serves."""
    import httpx

    from tests.engine.serve_process import running_server

    with running_server("--kv-cache-dtype", "fp8", "--kv-cache-tokens", "1024", "--max-model-len", "512") as url:
        cards = httpx.get(f"{url}/models", timeout=30).json()["data"]
        assert [c["kv_cache_dtype"] for c in cards] == ["fp8"]
        r = httpx.post(f"{url}/completions", json={"model": cards[0]["id"], "prompt": "The capital of France is",
                                                   "max_tokens": 2, "temperature": 0}, timeout=120)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


# -- GPU (the lead's H200 run) ------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", ["dense", "msa"])
def test_gpu_engine_fp8_cache_against_bf16(kind):
    """The GPU engine (CUDA graphs on) with an fp8 cache against the bf16 cache: the same first token, greedy
    tokens mostly equal, ~1.9x the tokens in the same cache bytes (dense). Needs compute capability >= 8.9."""
    from engine import LLM, SamplingParams
    from kernels._common.fp8 import fp8_supported

    if not fp8_supported(torch.device("cuda")):
        pytest.skip("FP8 needs compute capability >= 8.9")
    out, cache_bytes = {}, {}
    ids: list[int] = []
    for kv in ("bf16", "fp8"):
        llm = LLM("smollm2-135m", attention=kind, device="cuda", kv_cache_tokens=8192, progress=False,
                  kv_cache_dtype=kv, msa_overrides={"topk": 4} if kind != "dense" else None)
        assert llm.engine.use_cuda_graphs
        ids = ids or llm._to_ids(PROMPT * 60)[:1000]  # 8 blocks: top-k 4 selects
        out[kv] = llm.generate([ids, ids[:300]], SamplingParams(max_tokens=16, ignore_eos=True))
        cache_bytes[kv] = llm.cache.bytes() / (llm.cache.cfg.num_pages + 1)
        del llm
        torch.cuda.empty_cache()
    if kind == "dense":
        assert 1.8 < cache_bytes["bf16"] / cache_bytes["fp8"] < 2.0
    else:  # the index keys too: int8 + a scale beside the fp8 cache
        assert 1.7 < cache_bytes["bf16"] / cache_bytes["fp8"] < 2.0
    for a, b in zip(out["bf16"], out["fp8"], strict=True):
        assert a.token_ids[0] == b.token_ids[0]
        assert sum(x == y for x, y in zip(a.token_ids, b.token_ids, strict=True)) >= 12
