"""`response_format` of /v1/chat/completions (and /v1/responses' `text.format`, which that route maps onto it)
-> the engine's `JsonConstraint` (`engine.constrained`: constrained decoding, enforced token by token).

`{"type": "text"}` (or none): free text. `{"type": "json_object"}`: any JSON object. `{"type": "json_schema",
"json_schema": {"name", "description"?, "schema", "strict"?}}`: JSON valid against `schema`. OpenAI also
requires the word JSON in the messages for `json_object`; this server does not (the grammar holds the output
to JSON whatever the prompt says). `strict` is accepted and changes nothing: every schema is enforced.
A malformed `response_format`, or a schema the grammar library refuses, is a 400 naming `response_format`.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from engine.constrained import ConstraintError, JsonConstraint, check_constraint
from engine.server.errors import ApiError

_SHAPES = ("{'type': 'text'}, {'type': 'json_object'} or {'type': 'json_schema', 'json_schema': "
           "{'name': ..., 'schema': {...}}}")


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # as the request models (engine.server.schemas)


class _Text(_Lenient):
    type: Literal["text"]


class _JsonObject(_Lenient):
    type: Literal["json_object"]


class _JsonSchemaSpec(_Lenient):
    name: str = Field(pattern=r"^[A-Za-z0-9_\-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class _JsonSchema(_Lenient):
    type: Literal["json_schema"]
    json_schema: _JsonSchemaSpec


_FORMAT: TypeAdapter[_Text | _JsonObject | _JsonSchema] = TypeAdapter(
    Annotated[_Text | _JsonObject | _JsonSchema, Field(discriminator="type")])


def _parse(fmt: dict[str, Any]) -> _Text | _JsonObject | _JsonSchema:
    try:
        return _FORMAT.validate_python(fmt)
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(["response_format", *(str(x) for x in e.get("loc", ())[1:])])  # loc[0]: the union's tag
        raise ApiError(400, f"invalid {where}: {e.get('msg')}; send {_SHAPES}", param="response_format") from None


def response_constraint(fmt: dict[str, Any] | None, tokenizer: Any, vocab_size: int) -> JsonConstraint | None:
    """The constraint a request's `response_format` asks for (None: free text), checked against the grammar
    library so that a bad schema is refused here, before the request is queued. Blocking (the first call per
    model builds the library's tokenizer, about 1 s): the route calls it through `asyncio.to_thread`."""
    if fmt is None:
        return None
    parsed = _parse(fmt)
    if isinstance(parsed, _Text):
        return None
    constraint = JsonConstraint(parsed.json_schema.schema_ if isinstance(parsed, _JsonSchema) else None)
    try:
        check_constraint(constraint, tokenizer, vocab_size)
    except ConstraintError as e:
        why = " ".join(str(e).split())  # one line (the library's regex errors span several)
        raise ApiError(400, f"response_format.json_schema.schema cannot be enforced: {why}; fix the schema",
                       param="response_format") from None
    return constraint
