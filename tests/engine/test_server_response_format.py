"""`response_format` on /v1/chat/completions through the official `openai` client against the real
`msa-eval serve` (default model, CPU, 127.0.0.1): json_object and json_schema answers parse and validate
where the same requests without it do not give JSON; the client's own structured-outputs helper
(`chat.completions.parse` with a pydantic model) reads the answer; streamed answers equal non-streamed ones;
an unconstrained request answered beside constrained ones keeps its tokens; max_tokens cuts a constrained
answer with finish_reason "length"; a malformed response_format or a schema the grammar refuses is a 400
naming `response_format`, and the server goes on serving."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import jsonschema
import openai
import pydantic
import pytest

from tests.engine.openai_shape import assert_openai_error
from tests.engine.serve_process import running_server

MODEL = "smollm2-135m"
ASKS = ["Reply in JSON: describe a cat with its name and age.", "Give me a JSON object for a book (title, year).",
        "Return JSON with the keys city and country for Paris."]
BOOK = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "genre": {"enum": ["novel", "poetry", "essay"]},
        "author": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                                    "born": {"type": "integer", "minimum": 1000, "maximum": 2030}},
                   "required": ["name", "born"], "additionalProperties": False},
    },
    "required": ["title", "genre", "author"], "additionalProperties": False,
}
BOOK_FORMAT = {"type": "json_schema", "json_schema": {"name": "book", "schema": BOOK, "strict": True}}


class City(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=30)
    country: str = pydantic.Field(max_length=30)
    size: Literal["small", "large"]


@pytest.fixture(scope="module")
def client():
    with running_server("--max-model-len", "2048", "--max-batch", "4") as url:
        yield openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)


def _ask(client, text: str, max_tokens: int = 64, **kw):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}], temperature=0,
                                          max_tokens=max_tokens, **kw)


def _is_json(text: str | None) -> bool:
    try:
        json.loads(text or "")
    except ValueError:
        return False
    return True


def test_json_object_answers_parse_where_free_answers_do_not(client):
    free = [_ask(client, a, max_tokens=8).choices[0].message.content for a in ASKS]
    assert not any(_is_json(t) for t in free), free
    for a in ASKS:
        choice = _ask(client, a, max_tokens=48, response_format={"type": "json_object"}).choices[0]
        assert choice.finish_reason == "stop" and isinstance(json.loads(choice.message.content), dict)


def test_json_schema_answers_validate_and_stream_the_same(client):
    r = _ask(client, ASKS[1], response_format=BOOK_FORMAT)
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), BOOK)
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ASKS[1]}],
                                            temperature=0, max_tokens=64, response_format=BOOK_FORMAT, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


def test_a_sampled_answer_holds_to_the_schema(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ASKS[0]}],
                                       temperature=1.0, seed=1, max_tokens=64, response_format=BOOK_FORMAT)
    jsonschema.validate(json.loads(r.choices[0].message.content), BOOK)


def test_the_clients_structured_output_helper_reads_the_answer(client):
    r = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": ASKS[2]}], temperature=0,
                                      max_tokens=64, response_format=City)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, City) and parsed.size in ("small", "large")


def test_an_unconstrained_answer_is_the_same_beside_constrained_ones(client):
    alone = _ask(client, ASKS[0], max_tokens=8).choices[0].message.content
    with ThreadPoolExecutor(2) as pool:
        side = pool.submit(_ask, client, ASKS[1], 64, response_format=BOOK_FORMAT)
        beside = pool.submit(_ask, client, ASKS[0], 8)
        assert beside.result().choices[0].message.content == alone
        assert side.result().choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(side.result().choices[0].message.content), BOOK)


def test_max_tokens_cuts_a_constrained_answer_with_length(client):
    r = _ask(client, ASKS[1], max_tokens=4, response_format=BOOK_FORMAT)
    assert (r.choices[0].finish_reason, r.usage.completion_tokens) == ("length", 4)
    assert not _is_json(r.choices[0].message.content)


@pytest.mark.parametrize(("fmt", "needle"), [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}, "Invalid type"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(["}}}, "regex"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}}},
     "uniqueItems"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema"),
    ({"type": "yaml"}, "'yaml'"),
])
def test_a_bad_response_format_is_a_400_naming_it(client, fmt, needle):
    with pytest.raises(openai.BadRequestError) as e:
        _ask(client, "hi", max_tokens=4, response_format=fmt)
    assert_openai_error(e.value.response, 400)
    assert e.value.param == "response_format" and needle in e.value.message and "\n" not in e.value.message
    assert _ask(client, "hi", max_tokens=2).usage.completion_tokens >= 1  # still serving


def test_the_responses_api_text_format_holds_to_the_schema(client):
    fmt = {"type": "json_schema", "name": "book", "schema": BOOK, "strict": True}
    r = client.responses.create(model=MODEL, input=ASKS[1], temperature=0, max_output_tokens=64, text={"format": fmt})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), BOOK)
    parsed = client.responses.parse(model=MODEL, input=ASKS[2], temperature=0, max_output_tokens=64, text_format=City)
    assert isinstance(parsed.output_parsed, City)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input="hi", max_output_tokens=4,
                                text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}})
    assert_openai_error(e.value.response, 400)
    assert e.value.param == "text.format" and "Invalid type" in e.value.message
