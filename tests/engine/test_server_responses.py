"""POST /v1/responses against the real `msa-eval serve` (default model, dense, CPU) on 127.0.0.1, driven by the
official `openai` client: answers equal greedy chat completions of the same messages (non-streamed, streamed
through `client.responses.stream`), usage counts, max_output_tokens -> incomplete, a function-call loop,
logprobs, OpenAI's sampling defaults, /metrics' route label and the 400s of what the server cannot do.
"""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from engine.server.chatoutput import ChatOutputParser
from engine.server.reasoning import THINK
from engine.server.responses import Output, chat_request
from engine.server.responses_schemas import ResponsesRequest
from tests.engine.openai_shape import assert_openai_error
from tests.engine.serve_process import running_server

MODEL = "smollm2-135m"
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather forecast",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CHAT_WEATHER = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}


@pytest.fixture(scope="module")
def base_url():
    with running_server("--max-model-len", "2048", "--default-max-tokens", "8", "--max-batch", "4") as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)


def _chat(client, messages, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0, **kw)


def test_a_response_equals_the_greedy_chat_completion(client):
    input_items = [{"role": "user", "content": "Write one sentence about the moon."},
                   {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sure."}]},
                   {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go on."}]}]
    r = client.responses.create(model=MODEL, instructions="You are terse.", input=input_items, temperature=0,
                                max_output_tokens=8)
    chat = _chat(client, [{"role": "system", "content": "You are terse."},
                          {"role": "user", "content": "Write one sentence about the moon."},
                          {"role": "assistant", "content": "Sure."}, {"role": "user", "content": "Go on."}],
                 max_tokens=8)
    [message] = r.output
    assert (message.type, message.role, [c.type for c in message.content]) == ("message", "assistant", ["output_text"])
    assert r.output_text == chat.choices[0].message.content and r.output_text
    u = r.usage
    assert (u.input_tokens, u.output_tokens, u.total_tokens) == (
        chat.usage.prompt_tokens, chat.usage.completion_tokens, chat.usage.total_tokens)
    assert (r.status == "completed") == (chat.choices[0].finish_reason == "stop")
    assert (r.object, r.model, r.temperature, r.top_p, r.instructions) == ("response", MODEL, 0, 1, "You are terse.")
    # a string input is one user message
    s = client.responses.create(model=MODEL, input="Write one sentence about the moon.", temperature=0,
                                max_output_tokens=8)
    c = _chat(client, [{"role": "user", "content": "Write one sentence about the moon."}], max_tokens=8)
    assert s.output_text == c.choices[0].message.content


def test_the_stream_helper_gives_the_non_streamed_response(client):
    kw = dict(model=MODEL, input="What is the capital of France?", temperature=0, max_output_tokens=14)
    whole = client.responses.create(**kw)
    assert whole.status == "completed"  # the answer (8 tokens) ends before the limit
    with client.responses.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == whole.output_text == final.output_text
    chat = _chat(client, [{"role": "user", "content": "What is the capital of France?"}], max_tokens=14)
    assert final.output_text == chat.choices[0].message.content
    assert [o.type for o in final.output] == ["message"] and final.status == "completed"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (whole.usage.input_tokens,
                                                                     whole.usage.output_tokens)


def test_max_output_tokens_makes_the_response_incomplete(client):
    kw = dict(model=MODEL, input="Tell me a long story about a dragon.", temperature=0, max_output_tokens=5)
    r = client.responses.create(**kw)
    chat = _chat(client, [{"role": "user", "content": "Tell me a long story about a dragon."}], max_tokens=5)
    assert chat.choices[0].finish_reason == "length"
    assert (r.status, r.incomplete_details.reason, r.usage.output_tokens) == ("incomplete", "max_output_tokens", 5)
    assert r.output[0].status == "incomplete" and r.output_text == chat.choices[0].message.content
    events = list(client.responses.create(**kw, stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.incomplete_details.reason == (
        "max_output_tokens")
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    # no limit named: the server's --default-max-tokens (8), as on chat
    d = client.responses.create(model=MODEL, input="Tell me a long story about a dragon.", temperature=0)
    assert (d.status, d.usage.output_tokens) == ("incomplete", 8)


def _call(city: str, i: int) -> dict:
    return {"type": "function_call", "call_id": f"call_{i}", "name": "get_weather",
            "arguments": json.dumps({"city": city})}


def test_a_function_call_loop(client):
    # two earlier calls shown, then a third city: the default model copies the call greedily
    items = [{"role": "user", "content": "Weather in Paris?"}, _call("Paris", 1),
             {"role": "user", "content": "Weather in Berlin?"}, _call("Berlin", 2),
             {"role": "user", "content": "Weather in Rome?"}]
    r = client.responses.create(model=MODEL, input=items, tools=[WEATHER], temperature=0, max_output_tokens=32)
    [call] = r.output
    assert (call.type, call.name, json.loads(call.arguments), call.status) == (
        "function_call", "get_weather", {"city": "Rome"}, "completed")
    assert call.call_id.startswith("call_") and call.id.startswith("fc_") and r.output_text == ""
    # the same call streamed: the helper accumulates the argument deltas into the final output
    with client.responses.stream(model=MODEL, input=items, tools=[WEATHER], temperature=0,
                                 max_output_tokens=32) as stream:
        kinds = [e.type for e in stream]
        [streamed] = stream.get_final_response().output
    assert "response.function_call_arguments.delta" in kinds and "response.output_text.delta" not in kinds
    assert (streamed.name, json.loads(streamed.arguments)) == ("get_weather", {"city": "Rome"})
    # the call and its output sent back: a text answer that read the output, equal to chat's
    items += [call.model_dump(exclude_none=True),
              {"type": "function_call_output", "call_id": call.call_id, "output": "25 C, sunny"}]
    answer = client.responses.create(model=MODEL, input=items, tools=[WEATHER], temperature=0, max_output_tokens=6)
    assert [o.type for o in answer.output] == ["message"] and "25 C" in answer.output_text
    chat_messages = [{"role": "user", "content": "Weather in Paris?"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                                           "arguments": '{"city": "Paris"}'}}]},
                     {"role": "user", "content": "Weather in Berlin?"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "call_2", "type": "function", "function": {"name": "get_weather",
                                                                           "arguments": '{"city": "Berlin"}'}}]},
                     {"role": "user", "content": "Weather in Rome?"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": call.call_id, "type": "function",
                          "function": {"name": "get_weather", "arguments": call.arguments}}]},
                     {"role": "tool", "tool_call_id": call.call_id, "content": "25 C, sunny"}]
    chat = _chat(client, chat_messages, tools=[CHAT_WEATHER], max_tokens=6)
    assert answer.output_text == chat.choices[0].message.content
    # tool_choice none hides the tools: the same conversation gives text, no call
    plain = client.responses.create(model=MODEL, input=items[:5], tools=[WEATHER], tool_choice="none",
                                    temperature=0, max_output_tokens=3)
    assert all(o.type == "message" for o in plain.output)


def test_logprobs_equal_chat_logprobs(client):
    kw = dict(model=MODEL, input="Say hello.", temperature=0, max_output_tokens=6,
              include=["message.output_text.logprobs"], top_logprobs=2)
    r = client.responses.create(**kw)
    chat = _chat(client, [{"role": "user", "content": "Say hello."}], max_tokens=6, logprobs=True, top_logprobs=2)
    rows = r.output[0].content[0].logprobs
    expected = chat.choices[0].logprobs.content
    assert len(rows) == r.usage.output_tokens == len(expected)
    assert [x.token for x in rows] == [x.token for x in expected]
    assert [x.logprob for x in rows] == pytest.approx([x.logprob for x in expected], abs=1e-5)
    assert all(len(x.top_logprobs) == 2 for x in rows)
    streamed = [row for e in client.responses.create(**kw, stream=True) if e.type == "response.output_text.delta"
                for row in e.logprobs]
    assert [x.token for x in streamed] == [x.token for x in rows]


def test_sampling_defaults_are_openai_s(client):
    # left out: temperature 1 and top_p 1 (sampling), on every endpoint; null means the same
    assert (chat_request(ResponsesRequest(model=MODEL, input="hi")).temperature,
            chat_request(ResponsesRequest(model=MODEL, input="hi")).top_p) == (1.0, 1.0)
    msg = [{"role": "user", "content": "Invent a name for a cat."}]
    left_out = client.chat.completions.create(model=MODEL, messages=msg, max_tokens=6, seed=7)
    explicit = client.chat.completions.create(model=MODEL, messages=msg, max_tokens=6, seed=7, temperature=1,
                                              top_p=1)
    nulls = client.chat.completions.create(model=MODEL, messages=msg, max_tokens=6, seed=7,
                                           extra_body={"temperature": None, "top_p": None})
    greedy = client.chat.completions.create(model=MODEL, messages=msg, max_tokens=6, temperature=0)
    texts = [x.choices[0].message.content for x in (left_out, explicit, nulls)]
    assert texts == [texts[0]] * 3 and texts[0] != greedy.choices[0].message.content
    prompt = "My cat's name is"
    done = [client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, seed=7, **kw).choices[0].text
            for kw in ({}, {"temperature": 1, "top_p": 1}, {"temperature": 0})]
    assert done[0] == done[1] != done[2]
    r = client.responses.create(model=MODEL, input="hi", max_output_tokens=2)
    assert (r.temperature, r.top_p) == (1.0, 1.0)


def test_metrics_label_the_route(client, base_url):
    client.responses.create(model=MODEL, input="hi", temperature=0, max_output_tokens=1)
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics").text
    assert 'msa_requests_total{endpoint="/v1/responses",status="200"}' in text


M = {"model": MODEL, "input": "hi", "max_output_tokens": 2}


@pytest.mark.parametrize("body, param, words", [
    ({**M, "frobnicate": 1}, "frobnicate", "unknown parameter"),
    ({**M, "previous_response_id": "resp_1"}, "previous_response_id", "stores none"),
    ({**M, "conversation": "conv_1"}, "conversation", "stores none"),
    ({**M, "background": True}, "background", "background"),
    ({**M, "truncation": "auto"}, "truncation", "truncation"),
    ({**M, "top_logprobs": 2}, "top_logprobs", "include"),
    ({**M, "include": ["no.such.thing"]}, "include", "not known"),
    ({**M, "temperature": 3}, "temperature", "temperature"),
    ({**M, "max_output_tokens": 0}, "max_output_tokens", "max_output_tokens"),
    ({**M, "max_output_tokens": 5000}, "max_output_tokens", "lower max_output_tokens"),
    ({**M, "input": "word " * 3000}, "input", "context length"),
    ({**M, "input": [{"type": "web_search_call", "id": "ws_1"}]}, "input", "web_search_call"),
    ({**M, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input", "input_image"),
    ({**M, "input": [{"type": "function_call_output", "call_id": "call_9", "output": "x"}]}, "input", "call_9"),
    ({**M, "input": [_call("Rome", 3), {"role": "user", "content": "and?"},
                     {"type": "function_call_output", "call_id": "call_3", "output": "x"}]}, "input", "just before it"),
    ({**M, "tools": [{"type": "web_search"}]}, "tools", "function tools only"),
    ({**M, "tools": [WEATHER], "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}},
     "tool_choice", "allowed_tools"),
    ({**M, "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "nope"),
    ({**M, "tool_choice": "required"}, "tool_choice", "needs tools"),
])
def test_what_the_server_cannot_do_is_a_400_naming_the_parameter(base_url, body, param, words):
    r = httpx.post(base_url + "/responses", json=body, timeout=60)
    err = assert_openai_error(r, 400)
    assert err["param"] == param and words in err["message"], err


def test_unknown_model_and_stored_responses_are_404s(client, base_url):
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="no-such-model", input="hi")
    assert e.value.param == "model"
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve("resp_123")
    assert "keeps no responses" in e.value.message
    assert_openai_error(httpx.get(base_url + "/responses/resp_123"), 404)


def test_reasoning_becomes_a_reasoning_item_before_the_message():
    # the deltas the chat parser gives for "<think>Paris is in France.</think>Paris." with --reasoning-parser think
    parser = ChatOutputParser({}, THINK)
    out = Output()
    events = []
    for piece in ("<thi", "nk>Paris is in", " France.</th", "ink>Par", "is."):
        events += out.feed(parser.feed(piece))
    rest, parsed = parser.finish()
    events += out.feed(rest) + out.finish(parsed.tool_calls, incomplete=False)
    reasoning, message = out.items
    assert (reasoning.type, reasoning.content[0].text, reasoning.status) == ("reasoning", "Paris is in France.",
                                                                             "completed")
    assert (message.type, message.content[0].text) == ("message", parsed.content) == ("message", "Paris.")
    kinds = [e["type"] for e in events]
    assert kinds.index("response.reasoning_text.delta") < kinds.index("response.output_text.delta")
    assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta") == (
        "Paris is in France.")
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.done"] == [0, 1]
    # handed back as input, the reasoning item goes to the assistant turn it belongs to
    req = ResponsesRequest(model=MODEL, input=[
        {"role": "user", "content": "Capital of France?"}, reasoning.model_dump(), message.model_dump(),
        {"role": "user", "content": "And of Italy?"}])
    assert chat_request(req).messages[1].reasoning_content == "Paris is in France."


@pytest.mark.slow
def test_inspect_ai_s_openai_provider_runs_a_tool_loop_through_the_responses_api(base_url, tmp_path, monkeypatch):
    inspect_ai = pytest.importorskip("inspect_ai")
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ChatMessageAssistant, ChatMessageUser, GenerateConfig
    from inspect_ai.scorer import includes
    from inspect_ai.solver import generate, use_tools
    from inspect_ai.tool import ToolCall, tool

    @tool
    def get_weather():
        async def execute(city: str) -> str:
            """Weather forecast.

            Args:
                city: The city.
            """
            return f"25 C, sunny in {city}"
        return execute

    def shown(city: str, i: int) -> ChatMessageAssistant:
        return ChatMessageAssistant(content="", tool_calls=[ToolCall(id=f"call_{i}", function="get_weather",
                                                                     arguments={"city": city})])

    few_shot = [ChatMessageUser(content="Weather in Paris?"), shown("Paris", 1),
                ChatMessageUser(content="Weather in Berlin?"), shown("Berlin", 2),
                ChatMessageUser(content="Weather in Rome?")]
    task = inspect_ai.Task(dataset=[Sample(input=few_shot, target="25 C")],
                           solver=[use_tools(get_weather()), generate()], scorer=includes(),
                           config=GenerateConfig(temperature=0, max_tokens=32))
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    # openai/ with responses_api: inspect's default OpenAI provider, on the Responses API for any model name
    [log] = inspect_ai.eval(task, model=f"openai/{MODEL}", model_base_url=base_url, model_args={"responses_api": True},
                            log_dir=str(tmp_path), display="none", message_limit=10)
    assert log.status == "success", log.error
    messages = log.samples[0].messages
    call = messages[5].tool_calls[0]
    assert (call.function, call.arguments) == ("get_weather", {"city": "Rome"})
    assert (messages[6].role, messages[6].text) == ("tool", "25 C, sunny in Rome")
    assert messages[7].role == "assistant" and "25 C" in messages[7].text
    model_calls = [e.call.request for e in log.samples[0].events if e.event == "model"]
    assert all("input" in r and "messages" not in r for r in model_calls)  # Responses bodies, not chat ones
    assert any(item.get("type") == "function_call_output" for item in model_calls[-1]["input"])


def test_the_calls_of_one_turn_join_one_assistant_message():
    req = ResponsesRequest(model=MODEL, instructions="Be brief.", input=[
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        _call("Paris", 1), _call("Rome", 2),
        {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "25 C"}]},
        {"role": "user", "content": "Thanks."}, _call("Oslo", 3)])
    chat = chat_request(req)
    assert [(m.role, m.text()) for m in chat.messages] == [
        ("system", "Be brief."), ("user", "Weather in Paris and Rome?"), ("assistant", "Checking."),
        ("tool", "18 C"), ("tool", "25 C"), ("user", "Thanks."), ("assistant", "")]
    assert [c.id for c in chat.messages[2].tool_calls] == ["call_1", "call_2"]
    assert [m.tool_call_id for m in chat.messages[3:5]] == ["call_1", "call_2"]
    assert chat.messages[6].tool_calls[0].function.arguments == '{"city": "Oslo"}'
