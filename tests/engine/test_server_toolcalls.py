"""Tool-call rendering/parsing and streamed-text stop handling of the server (no HTTP)."""
from __future__ import annotations

import json

import pytest

from engine.server.toolcalls import messages_for_template, parse_tool_calls, template_supports_tools
from engine.textstream import IncrementalText

TOOLS = {"get_weather", "search"}


@pytest.mark.parametrize("text, calls", [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>',
     [("get_weather", {"city": "Rome"})]),
    (('Let me check.<tool_call>{"name": "search", "arguments": "{\\"q\\": \\"x\\"}"}</tool_call>'
      '<tool_call>{"name": "get_weather", "parameters": {"city": "Oslo"}}</tool_call>'),
     [("search", {"q": "x"}), ("get_weather", {"city": "Oslo"})]),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}',  # unclosed at EOS
     [("get_weather", {"city": "Rome"})]),
    ('```json\n{"name": "search", "arguments": {"q": "msa"}}\n```', [("search", {"q": "msa"})]),  # plain JSON fallback
    ('[{"name": "search", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "A"}}]',
     [("search", {}), ("get_weather", {"city": "A"})]),
])
def test_well_formed_calls_are_parsed(text, calls):
    out = parse_tool_calls(text, TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == calls
    assert len({c.id for c in out.tool_calls}) == len(calls)


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>',  # bad JSON
    '<tool_call>{"name": "launch_rockets", "arguments": {}}</tool_call>',  # not an offered tool
    '<tool_call>{"name": "search", "arguments": [1, 2]}</tool_call>',  # arguments not an object
    '<tool_call>{"name": "search", "arguments": {}}</tool_call><tool_call>oops</tool_call>',  # one bad block
    '{"name": "search"',  # truncated JSON
    '{"answer": 42}',  # JSON but not a call
    'The weather is nice.',
    '',
])
def test_malformed_calls_stay_text(text):
    out = parse_tool_calls(text, TOOLS)
    assert out.tool_calls == [] and out.content == text


def test_no_tools_offered_means_no_parsing():
    text = '<tool_call>{"name": "search", "arguments": {}}</tool_call>'
    assert parse_tool_calls(text, set()).content == text


def test_text_around_calls_is_kept_as_content():
    out = parse_tool_calls('Checking now.\n<tool_call>{"name": "search", "arguments": {"q": "a"}}</tool_call>', TOOLS)
    assert out.content == "Checking now." and out.tool_calls[0].name == "search"


def test_hermes_rendering_for_a_template_without_tools(default_llm):
    tok = default_llm.tokenizer
    assert not template_supports_tools(tok.chat_template)  # SmolLM2's template is plain ChatML
    assert template_supports_tools("{% if tools %}{{ tools | tojson }}{% endif %}")
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}}]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Find MSA."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "MSA"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "result one"},
        {"role": "tool", "tool_call_id": "c2", "content": "result two"},
    ]
    rendered, native = messages_for_template(messages, tools, "required", native_tools=False)
    assert native is None
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "user"]
    assert rendered[0]["content"].startswith("Be brief.") and '"name": "search"' in rendered[0]["content"]
    assert "must call" in rendered[0]["content"]
    assert json.loads(rendered[2]["content"].split("<tool_call>")[1].split("</tool_call>")[0]) == {
        "name": "search", "arguments": {"q": "MSA"}}
    assert rendered[3]["content"].count("<tool_response>") == 2
    prompt = tok.apply_chat_template(rendered, add_generation_prompt=True)
    assert "<tools>" in prompt and prompt.endswith("<|im_start|>assistant\n")
    hidden, _ = messages_for_template(messages[:2], tools, "none", native_tools=False)
    assert "<tools>" not in json.dumps(hidden)


class _CharTokenizer:
    """Each id is one character (ids 0..255 = chr); 1000 = an incomplete UTF-8 piece."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join("\ufffd" if i == 1000 else chr(i) for i in ids)


def test_incremental_text_holds_back_stop_prefix_and_cuts():
    t = IncrementalText(_CharTokenizer(), stop=["END"])
    emitted = [t.add([ord(c)]) for c in "abcE"]
    assert "".join(emitted) == "abc"  # "E" may start "END": held back
    assert t.add([ord("N")]) == "" and t.add([ord("D")]) == "" and t.stopped
    assert t.text == "abc" and t.flush() == ""
    u = IncrementalText(_CharTokenizer(), stop=["END"])
    assert u.add([ord("E")]) == "" and u.add([ord("x")]) == "Ex"  # prefix abandoned: released
    v = IncrementalText(_CharTokenizer(), stop=[])
    assert v.add([ord("a"), 1000]) == "a" and v.flush() == "\ufffd"
