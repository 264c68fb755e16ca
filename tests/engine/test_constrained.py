"""Constrained decoding in the engine (`engine.constrained`, `SamplingParams.constraint`) on the real default
model: the answers the unconstrained model gives are not JSON, the constrained ones are (and validate against
the schema, enum and nested objects included), greedy and sampled; a batch mixing constrained and
unconstrained requests leaves the unconstrained ones their tokens; max_tokens cuts a constrained answer with
finish_reason "length"; a schema the library refuses is an error naming the schema."""
from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from engine import SamplingParams
from engine.constrained import ConstraintError, GrammarState, JsonConstraint, allowed_tokens

ASKS = ["Reply in JSON: describe a cat with its name and age.", "Give me a JSON object for a book (title, year).",
        "Return JSON with the keys city and country for Paris."]
PROMPTS = [[{"role": "user", "content": c}] for c in ASKS]
PET = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "kind": {"enum": ["cat", "dog", "bird"]},
        "owner": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                                   "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                  "required": ["city", "age"], "additionalProperties": False},
    },
    "required": ["name", "kind", "owner"], "additionalProperties": False,
}


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@pytest.fixture(scope="module")
def free_answers(default_llm):
    return default_llm.generate(PROMPTS, SamplingParams(max_tokens=24, temperature=0))


@pytest.fixture(scope="module")
def pet_answers(default_llm):
    """Greedy and sampled answers held to PET, in one batch: the first two greedy, the last two sampled."""
    greedy = SamplingParams(max_tokens=64, temperature=0, constraint=JsonConstraint(PET))
    sampled = SamplingParams(max_tokens=64, temperature=0.9, seed=7, constraint=JsonConstraint(PET))
    return default_llm.generate(PROMPTS[:2] * 2, [greedy, greedy, sampled, sampled])


def test_the_unconstrained_model_does_not_answer_in_json(free_answers):
    assert [_is_json(o.text) for o in free_answers] == [False] * len(PROMPTS), [o.text for o in free_answers]


def test_json_object_answers_parse_as_json_objects(default_llm):
    outs = default_llm.generate(PROMPTS, SamplingParams(max_tokens=48, temperature=0, constraint=JsonConstraint()))
    for o in outs:
        assert o.finish_reason == "stop", o.text
        assert isinstance(json.loads(o.text), dict)
    assert any(json.loads(o.text) for o in outs)  # not only "{}"


def test_schema_answers_validate_enum_and_nested_objects(pet_answers):
    for o in pet_answers:
        assert o.finish_reason == "stop", o.text
        jsonschema.validate(json.loads(o.text), PET)
    assert pet_answers[0].text != pet_answers[2].text  # sampling draws, within the grammar


def test_unconstrained_requests_draw_the_same_tokens_beside_constrained_ones(default_llm, free_answers):
    sampled = SamplingParams(max_tokens=16, temperature=0.8, seed=3)
    alone = default_llm.generate(PROMPTS[:1], sampled)[0]
    json_params = SamplingParams(max_tokens=24, temperature=0.9, seed=5, constraint=JsonConstraint(PET))
    mixed = default_llm.generate([PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[2]],
                                 [SamplingParams(max_tokens=24, temperature=0), json_params, sampled, json_params])
    assert mixed[0].token_ids == free_answers[0].token_ids  # greedy
    assert mixed[2].token_ids == alone.token_ids  # seeded sampling
    assert all(_is_json(mixed[i].text) or mixed[i].finish_reason == "length" for i in (1, 3))


def test_max_tokens_cuts_a_constrained_answer_with_length(default_llm, pet_answers):
    cut = default_llm.generate(PROMPTS[0], SamplingParams(max_tokens=5, temperature=0, constraint=JsonConstraint(PET)))
    assert (cut[0].finish_reason, len(cut[0].token_ids)) == ("length", 5)
    assert cut[0].token_ids == pet_answers[0].token_ids[:5] and not _is_json(cut[0].text)


def test_the_mask_allows_only_what_the_grammar_allows(default_llm):
    tok, vocab = default_llm.tokenizer, default_llm.config.vocab_size
    grammar = GrammarState(JsonConstraint({"enum": ["yes", "no"]}), tok, vocab)
    mask = allowed_tokens([grammar, None], vocab, torch.device("cpu"))
    assert mask is not None and mask.shape == (2, vocab) and bool(mask[1].all())
    first = {tok.decode([i]) for i in mask[0].nonzero().flatten().tolist()}
    assert first and all(t.startswith('"') for t in first) and '"' in first
    for t in tok.encode('"no"'):
        grammar.advance(t)
    assert grammar.done
    assert allowed_tokens([None, None], vocab, torch.device("cpu")) is None
    wide = GrammarState(JsonConstraint(), tok, vocab + 32)  # built for other logits: its mask allows nothing
    wrong = allowed_tokens([wide, None], vocab, torch.device("cpu"))
    assert wrong is not None and not bool(wrong[0].any()) and bool(wrong[1].all())


@pytest.mark.parametrize("schema", [{"type": "nope"}, {"type": "string", "pattern": "(["},
                                    {"type": "array", "uniqueItems": True}, {"$ref": "#/$defs/missing"}])
def test_a_schema_the_library_refuses_is_an_error_naming_it(default_llm, schema):
    with pytest.raises(ConstraintError, match="invalid JSON schema"):
        default_llm.generate(PROMPTS[0], SamplingParams(max_tokens=4, constraint=JsonConstraint(schema)))
    assert not default_llm.engine.seqs  # nothing left behind in the engine


@pytest.mark.gpu
def test_the_mask_on_the_gpu_equals_the_cpu_one(default_llm):
    tok, vocab = default_llm.tokenizer, default_llm.config.vocab_size
    grammars = [GrammarState(JsonConstraint(PET), tok, vocab), None, GrammarState(JsonConstraint(), tok, vocab)]
    cpu = allowed_tokens(grammars, vocab, torch.device("cpu"))
    gpu = allowed_tokens(grammars, vocab, torch.device("cuda"))
    assert cpu is not None and gpu is not None and gpu.device.type == "cuda"
    assert torch.equal(gpu.cpu(), cpu)
