"""Selection telemetry (engine/msa/telemetry.py) through the real engine: the default model with its shipped
indexer and a tiny random MiniMax-M3 checkpoint, on the CPU (`CpuMaskedMSA`, `OracleMSA`, the reference
path) and, marked gpu, the Triton path with eager decode (`GraphMSAAttention`) on random Llama-family and M3
stacks."""
from __future__ import annotations

import pytest
import torch

from engine.errors import EngineError
from engine.msa.telemetry import METRICS, SelectionTelemetry, TelemetryConfig, block_mass, overlap, row_metrics

PROMPT = 600  # 5 blocks of 128: top-4 must choose
SHORT = 300  # 3 blocks: top-4 keeps every block
TOKENS = 3  # the decode tokens stay in the prompt's last block


def _ids(n: int, seed: int = 1, m3: bool = False) -> list[int]:
    ids = torch.randint(100, 20000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    return [t % 256 + 8 for t in ids] if m3 else ids  # the tiny M3's byte tokens


def _llm(kind: str, model: str = "smollm2-135m", device: str = "cpu", **kw):
    from engine import LLM

    return LLM(model, attention=kind, device=device, msa_overrides={"topk": 4}, progress=False, msa_telemetry=True,
               kv_cache_tokens=4096, **kw)


def _telemetry(llm, n: int = PROMPT, m3: bool = False) -> dict:
    from engine import SamplingParams

    out = llm.generate([_ids(n, m3=m3)], SamplingParams(max_tokens=TOKENS, ignore_eos=True))[0]
    assert len(out.token_ids) == TOKENS
    return out.metrics["msa_telemetry"]


def _check_shape_and_range(tel: dict, llm) -> None:
    layers = [i for i in range(llm.config.num_layers) if i not in llm.msa.dense_layers]
    assert tel["layers"] == layers and tel["decode"] == "eager"
    assert tel["prefill_probes"] == 64 and tel["decode_tokens"] == TOKENS - 1
    for m in METRICS:
        rows = tel[m]
        assert len(rows) == len(layers), m
        for i, row in enumerate(rows):
            if m == "layer_overlap" and i == len(layers) - 1:
                assert row is None  # no next MSA layer
                continue
            if m == "far_recall" and row is None:
                continue  # the oracle kept no far block in this layer
            assert len(row) == llm.config.num_kv_heads, (m, row)
            assert all(0.0 <= v <= 1.0 for v in row if v is not None or m != "far_recall"), (m, row)
        if m != "far_recall" or tel["mean"][m] is not None:
            assert 0.0 <= tel["mean"][m] <= 1.0


@pytest.fixture(scope="module")
def msa4():
    """The default model with its shipped indexer at top-4 (CpuMaskedMSA)."""
    return _llm("msa")


def test_fields_present_and_in_range_on_the_default_model(msa4):
    tel = _telemetry(msa4)
    _check_shape_and_range(tel, msa4)
    assert tel["mean"]["recall"] < 1.0  # 4 of 5 blocks: the shipped indexer misses some of the oracle's
    # at most 3 whole blocks and the own block's keys up to the query: (3 * 128 + 601 % 128 + 1) / 602
    assert tel["mean"]["keys_read"] <= (3 * 128 + 90) / 602 + 1e-4
    assert tel["mean"]["mass"] <= tel["mean"]["mass_recall"] + 1e-4  # the oracle's blocks hold at most 1


def test_every_block_kept_is_perfect_recall(msa4):
    """Top-4 over 3 blocks: indexer and oracle keep every block; all keys are read; layers and tokens agree."""
    tel = _telemetry(msa4, SHORT)
    _check_shape_and_range(tel, msa4)
    for m in ("recall", "mass_recall", "keys_read", "layer_overlap", "decode_overlap"):
        assert tel["mean"][m] == 1.0, (m, tel["mean"][m])
    assert tel["mean"]["far_recall"] is None  # 3 blocks: the first, the neighbour, the own; nothing far
    assert tel["mean"]["mass"] == pytest.approx(1.0, abs=1e-4)


def test_the_oracle_arm_has_recall_one_against_itself():
    llm = _llm("msa-oracle")
    tel = _telemetry(llm)
    _check_shape_and_range(tel, llm)
    assert tel["mean"]["recall"] == 1.0 and tel["mean"]["mass_recall"] == 1.0


def test_minimax_m3_tiny_checkpoint(tmp_path):
    """M3's own index branch (msa), the reference path (msa-ref, the same blocks) and the oracle (recall 1)."""
    pytest.importorskip("transformers")
    from engine.m3.testing import text_config, write_checkpoint

    d = tmp_path / "tiny-m3"
    write_checkpoint(d, text_config(num_layers=4))  # layers 1 and 3 sparse, top-4 of 128-token blocks
    llm = _llm("msa", model=str(d))
    tel = _telemetry(llm, 700, m3=True)
    assert tel["layers"] == [1, 3] and len(tel["recall"][0]) == llm.config.num_kv_heads
    for m in METRICS:
        assert 0.0 <= tel["mean"][m] <= 1.0
    assert tel["layer_overlap"][1] is None and tel["decode_overlap"] is not None
    ref = _telemetry(_llm("msa-ref", model=str(d)), 700, m3=True)
    for m in METRICS:
        assert ref["mean"][m] == pytest.approx(tel["mean"][m], abs=2e-3), m
    assert _telemetry(_llm("msa-oracle", model=str(d)), 700, m3=True)["mean"]["recall"] == 1.0


def test_overlap_and_layer_overlap_of_identical_selections():
    a = torch.tensor([[[0, 3, 4, -1], [1, 2, 4, -1]]])
    assert overlap(a, a).tolist() == [[1.0, 1.0]]
    assert overlap(a, torch.tensor([[[0, 2, 4, -1], [-1, -1, -1, -1]]]))[0].tolist() == pytest.approx([2 / 3, 0.0])
    acc = SelectionTelemetry(prompt_len=300, config=TelemetryConfig(probe_queries=8))
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(300, 4, 64, generator=g), torch.randn(2, 300, 64, generator=g)
    ids = torch.tensor([0, 1, 2, -1], dtype=torch.int32).expand(300, 2, 4)
    for layer in (2, 3, 5):  # the same selection in every layer
        acc.observe(layer, q, k, 0, ids, 128, 4, 0.125)
    s = acc.summary()
    assert s["layers"] == [2, 3, 5] and s["layer_overlap"][:2] == [[1.0, 1.0], [1.0, 1.0]]
    assert s["layer_overlap"][2] is None and s["prefill_probes"] == 8 and s["decode_overlap"] is None


def test_far_recall_sees_the_needle_block_that_recall_averages_away():
    """Five blocks of 4 keys, the query in the last: the oracle keeps the sink (0), a far block (2: the
    needle) and the neighbour (3). An indexer that takes block 1 instead of the needle still has recall 3/4
    (own block included) but far_recall 0; taking the needle gives 1. A row whose oracle keeps no far block
    has no far_recall (NaN), and the accumulator leaves it out."""
    p = torch.zeros(1, 1, 20)
    p[0, 0, [0, 9, 13, 19]] = torch.tensor([0.3, 0.3, 0.2, 0.2])  # blocks 0, 2, 3, own (4)
    pos = torch.tensor([19])
    mass = block_mass(p, 1, 4)
    miss = row_metrics(mass, pos, torch.tensor([[[0, 1, 3, 4]]]), 4, 4)
    hit = row_metrics(mass, pos, torch.tensor([[[0, 2, 3, 4]]]), 4, 4)
    far = METRICS.index("far_recall")
    assert miss[0].item() == pytest.approx(0.75) and miss[far].item() == 0.0
    assert hit[0].item() == 1.0 and hit[far].item() == 1.0
    acc = SelectionTelemetry(prompt_len=20, config=TelemetryConfig(probe_queries=2))
    other = miss.clone()
    other[far] = float("nan")  # a second row whose oracle keeps no far block
    acc.record(2, 18, torch.tensor([[[0, 1, 3, 4]], [[0, 1, 3, 4]]]), torch.cat([other, miss], dim=1))
    acc.record(3, 18, torch.tensor([[[0, 2, 3, 4]], [[0, 2, 3, 4]]]), torch.cat([hit, hit], dim=1))
    s = acc.summary()
    assert s["far_recall"] == [[0.0], [1.0]] and s["recall"] == [[0.75], [1.0]] and s["mean"]["far_recall"] == 0.5


def test_bad_input_is_one_line():
    from engine import LLM

    with pytest.raises(EngineError, match="use attention msa, msa-ref or msa-oracle"):
        LLM("smollm2-135m", attention="dense", msa_telemetry=True, progress=False)
    with pytest.raises(ValueError, match="probe_queries must be >= 1"):
        TelemetryConfig(probe_queries=0)


def _random_engine(device: str, kind: str, dtype: torch.dtype = torch.float32, m3: bool = False, chunk: int = 2048):
    """A random 4-layer stack on `device` in `dtype`, telemetry on (seeded: the same weights on every device):
    Llama-family with random index projections on layers 1-3, or (`m3`) a tiny MiniMax-M3 with its own index
    branch (layers 1 and 3 sparse, top-4)."""
    from engine.attention import make_attention
    from engine.config import ModelConfig, from_hf_config
    from engine.kv_cache import CacheConfig, KVCache
    from engine.llm_engine import LLMEngine
    from engine.m3.testing import text_config
    from engine.scheduler import SchedulerConfig
    from engine.testing import _NoTokenizer, random_indexer, random_model

    if m3:
        cfg = from_hf_config({"model_type": "minimax_m3_vl_text", **text_config(num_layers=4, vocab=1000)})
    else:
        cfg = ModelConfig(arch="llama", vocab_size=1000, hidden_size=256, num_layers=4, num_heads=8,
                          num_kv_heads=2, head_dim=64, intermediate_size=512, max_position=4096)
    model = random_model(cfg, device, dtype, seed=0)
    torch.manual_seed(1)
    ix = model.indexer(topk=4) if m3 else random_indexer(cfg, device, dtype, topk=4, dense_layers=(0,))
    cache = KVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, CacheConfig(128, 32, dtype), device,
                    index_dim=ix.config.d_idx, index_layers=ix.layers)
    return LLMEngine(model, _NoTokenizer(), make_attention(kind, device, cfg, ix), cache, SchedulerConfig(4, chunk),
                     4096, torch.device(device), telemetry=TelemetryConfig())


def _engine_telemetry(eng, n: int = 700) -> dict:
    from engine.requests import Request
    from engine.sampling import SamplingParams

    ids = [t % 1000 for t in _ids(n)]
    for _ in eng.stream([Request("r", ids, SamplingParams(max_tokens=TOKENS, ignore_eos=True))]):
        pass
    seq = eng.pop_finished("r")
    if seq.error is not None:
        raise seq.error
    return seq.metrics()["msa_telemetry"]


def test_requests_decoded_together_measure_what_each_measures_alone():
    """Three requests of unequal prompts through the engine at once, prefill chunks of 512 tokens beside the others'
    decode tokens (mixed steps), the decode tokens measured in one batch per layer and handed over after the last
    MSA layer: each request's telemetry equals its telemetry run alone (and msa-oracle's recall stays 1)."""
    from engine.requests import Request
    from engine.sampling import SamplingParams

    lens = (700, 300, 1200)
    for kind in ("msa", "msa-oracle"):
        eng = _random_engine("cpu", kind, chunk=512)
        reqs = [Request(f"r{i}", [t % 1000 for t in _ids(n)], SamplingParams(max_tokens=TOKENS, ignore_eos=True))
                for i, n in enumerate(lens)]
        for _ in eng.stream(reqs):
            pass
        together = [eng.pop_finished(f"r{i}").metrics()["msa_telemetry"] for i in range(len(lens))]
        for n, tel in zip(lens, together, strict=True):
            alone = _engine_telemetry(_random_engine("cpu", kind, chunk=512), n)
            assert tel["decode_tokens"] == alone["decode_tokens"] == TOKENS - 1 and tel["prefill_probes"] == 64
            assert tel["layers"] == alone["layers"] and tel["decode_overlap"] is not None
            for m in METRICS:
                assert tel["mean"][m] == pytest.approx(alone["mean"][m], abs=1e-3), (kind, n, m)
            if kind == "msa-oracle":
                assert tel["mean"]["recall"] == 1.0


def test_chunked_prefill_measures_the_same_probes():
    """Probes split over two prefill chunks (636..671 in the first of 672 tokens) give the one-chunk result."""
    whole = _engine_telemetry(_random_engine("cpu", "msa"))
    split = _engine_telemetry(_random_engine("cpu", "msa", chunk=672))
    assert split["prefill_probes"] == whole["prefill_probes"] == 64 and split["layers"] == whole["layers"]
    for m in METRICS:
        assert split["mean"][m] == pytest.approx(whole["mean"][m], abs=1e-3), m


@pytest.mark.gpu
def test_gpu_triton_path_with_eager_decode():
    """On a GPU, `msa` (GraphMSAAttention, Triton) and `msa-oracle` record telemetry with decode run eagerly, for
    a Llama-family stack and a tiny M3; the Triton indexer's blocks match the torch reference's (msa-ref)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from engine.gpu.msa_graph import GraphMSAAttention

    bf16 = torch.bfloat16  # the Triton kernels' dtype
    for m3, layers in ((False, [1, 2, 3]), (True, [1, 3])):
        eng = _random_engine("cuda", "msa", bf16, m3)
        assert isinstance(eng.attention, GraphMSAAttention) and not eng.use_cuda_graphs  # eager with telemetry
        gpu, ref = _engine_telemetry(eng), _engine_telemetry(_random_engine("cuda", "msa-ref", bf16, m3))
        assert gpu["layers"] == layers and gpu["decode_tokens"] == TOKENS - 1 and gpu["decode_overlap"] is not None
        for m in METRICS:
            assert 0.0 <= gpu["mean"][m] <= 1.0 and gpu["mean"][m] == pytest.approx(ref["mean"][m], abs=0.05), m
        assert _engine_telemetry(_random_engine("cuda", "msa-oracle", bf16, m3))["mean"]["recall"] == 1.0


@pytest.mark.parametrize("budget", [None, 64], ids=["one-chunk", "tiny-chunks"])  # 64: a request / a layer a chunk
def test_decode_steps_measured_at_once_equal_one_request_at_a_time(monkeypatch, budget):
    """`observe_layer` on steps of one query per request (scattered pages, unequal lengths) adds to every
    accumulator what `observe` adds for that request alone: two steps (the second has a previous token: decode
    overlap) over two layers (layer overlap); then a step where one request is still a prompt token (its stage
    differs from the others'); then a mixed step, a new request's prompt chunk (probe rows) beside the decode
    tokens, as continuous batching runs them (the decode tokens still measured at once)."""
    from engine.attention.dense import gather_kv
    from engine.msa import recall
    from engine.msa.telemetry import observe_layer
    from engine.testing import decode_step_meta

    if budget:
        monkeypatch.setitem(recall.CHUNK_ELEMENTS, "cpu", budget)

    g = torch.Generator().manual_seed(4)
    hq, hkv, d, B, k = 8, 2, 64, 128, 4
    lens = [129, 700, 1000, 511, 300]
    kc = torch.randn(40, hkv, B, d, generator=g)
    prompts = [n - 1 for n in lens]  # the first step's token is the first decode token
    together = [SelectionTelemetry(p) for p in prompts]
    alone = [SelectionTelemetry(p) for p in prompts]

    def step(at: list[int], q_lens: list[int] | None = None) -> None:
        q_lens = q_lens or [1] * len(at)
        meta = decode_step_meta(at, 40, B, g, q_lens=q_lens, telemetry=together)
        q = torch.randn(sum(q_lens), hq, d, generator=g) * 2
        pos = torch.cat([torch.arange(n - ql, n) for n, ql in zip(at, q_lens, strict=True)])
        for layer in (2, 3):  # each layer and token its own far block: the overlaps are not all 1
            ids = torch.tensor([[0, 0, -1, -1]], dtype=torch.int32).repeat(len(pos), hkv, 1)
            own = (pos // B).to(torch.int32)[:, None].expand(-1, hkv)
            far = torch.randint(0, 1 << 20, ids.shape[:2], generator=g, dtype=torch.int32)
            ids[:, :, 1] = torch.where(own > 1, far % (own - 1).clamp(min=1) + 1, 0)
            ids[:, :, 2] = own
            observe_layer(layer, q, kc, ids, meta, k, 0.125, last=layer == 3)
            start = 0
            for r, (n, pl, ql) in enumerate(zip(at, meta.page_lists, q_lens, strict=True)):
                alone[r].observe(layer, q[start:start + ql], gather_kv(kc, pl, n), n - ql, ids[start:start + ql], B,
                                 k, 0.125)
                start += ql

    def check(decode: list[int]) -> None:
        for r in range(len(lens)):
            a, b = together[r].summary(), alone[r].summary()
            assert a["decode_tokens"] == b["decode_tokens"] == decode[r], r
            for m in METRICS:
                flat = [[v for row in x[m] or [] if row is not None for v in row] for x in (a, b)]
                assert flat[0] == pytest.approx(flat[1], abs=2e-4, nan_ok=True), (r, m)
            assert a["mean"] == pytest.approx(b["mean"], abs=2e-4)

    step(lens)
    step([n + 1 for n in lens])
    check([2] * len(lens))
    assert together[1].summary()["decode_overlap"] is not None
    late = SelectionTelemetry(lens[0] + 2)  # request 0 restarts: its next token is its prompt's last
    together[0], alone[0] = late, SelectionTelemetry(lens[0] + 2)
    step([lens[0] + 2] + [n + 2 for n in lens[1:]])
    check([0, 3, 3, 3, 3])
    fresh = 400  # request 2 restarts with a 400-token prompt: its last 90 prompt tokens beside four decode tokens
    together[2], alone[2] = SelectionTelemetry(fresh), SelectionTelemetry(fresh)
    step([lens[0] + 3, lens[1] + 3, fresh, lens[3] + 3, lens[4] + 3], [1, 1, 90, 1, 1])
    check([1, 4, 0, 4, 4])
    assert together[2].summary()["prefill_probes"] == 64 and together[3].summary()["decode_overlap"] is not None
