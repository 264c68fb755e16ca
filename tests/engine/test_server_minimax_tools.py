"""MiniMax tool calls and <think> reasoning in the OpenAI server: the parsers on many inputs (streamed
at every cut == whole), the M3 chat template fed through the server's renderer, and the real server
process driven by the official `openai` client, its default model made to write MiniMax markup by a
few-shot conversation that it copies greedily."""
from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.server.chatoutput import ChatOutputParser, parse_chat_output
from engine.server.config import ServerConfig
from engine.server.minimax_tools import typed_value
from engine.server.reasoning import MM_THINK, THINK, prompt_opens_block, reasoning_tags, split_reasoning
from engine.server.toolcalls import offered_tools, parse_tool_calls, template_supports_tools
from tests.engine.serve_process import running_server

WEATHER_PARAMS = {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
    "lat": {"type": "number"}, "opts": {"type": "object"}, "tags": {"type": "array"},
    "when": {"anyOf": [{"type": "integer"}, {"type": "string"}]}, "note": {"type": ["null", "string"]}}}
TOOLS = {"get_weather": WEATHER_PARAMS, "search": None}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast",
                                            "parameters": WEATHER_PARAMS}}

BRIEF = ('<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
         '<parameter name="days">3</parameter>\n</invoke>\n</minimax:tool_call>')


def _calls(out):
    return [(c.name, json.loads(c.arguments)) for c in out.tool_calls]


# ---------------------------------------------------------------- the MiniMax form
@pytest.mark.parametrize("text, content, calls", [
    (BRIEF, None, [("get_weather", {"city": "Paris", "days": 3})]),
    ("Let me look.\n" + BRIEF, "Let me look.", [("get_weather", {"city": "Paris", "days": 3})]),
    # several invokes in one block, several blocks, no newlines, other quoting, text between blocks
    (('<minimax:tool_call><invoke name="search"><parameter name="q">msa</parameter></invoke>'
     "<invoke name='get_weather'><parameter name=city>Oslo</parameter></invoke></minimax:tool_call> and "
     '<minimax:tool_call>  <invoke name = "search" >\n\t<parameter name="q">x y</parameter>\n</invoke>  '
     "</minimax:tool_call>"),
     "and", [("search", {"q": "msa"}), ("get_weather", {"city": "Oslo"}), ("search", {"q": "x y"})]),
    # stopped before the closing tags (EOS or a stop string): complete parameters are a call
    ('<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="days">2</parameter>\n',
     None, [("get_weather", {"days": 2})]),
    ('<minimax:tool_call><invoke name="search"></invoke></minimax:tool_call>', None, [("search", {})]),
    # mixed with a Hermes block in one answer
    (('<tool_call>{"name": "search", "arguments": {"q": "a"}}</tool_call>\n'
     '<minimax:tool_call><invoke name="search"><parameter name="q">b</parameter></invoke></minimax:tool_call>'),
     None, [("search", {"q": "a"}), ("search", {"q": "b"})]),
])
def test_minimax_calls_are_parsed(text, content, calls):
    out = parse_tool_calls(text, TOOLS)
    assert _calls(out) == calls and out.content == content
    assert len({c.id for c in out.tool_calls}) == len(calls)
    assert all(isinstance(c.arguments, str) for c in out.tool_calls)  # OpenAI form: a JSON string


@pytest.mark.parametrize("name, raw, value", [
    ("city", "Paris", "Paris"), ("city", "42", "42"), ("city", ' "quoted" ', ' "quoted" '),  # string: as written
    ("city", "\nTwo\nlines\n", "Two\nlines"),  # one layout newline each side dropped
    ("days", "3", 3), ("days", " -7\n", -7), ("days", "3.5", 3.5), ("days", "three", "three"),
    ("lat", "48.85", 48.85), ("lat", "2", 2), ("lat", "NaN", "NaN"), ("lat", "1e3", 1000.0),
    ("metric", "true", True), ("metric", "False", False), ("metric", "yes", "yes"),
    ("opts", '{"a": [1, 2]}', {"a": [1, 2]}), ("opts", "{not json", "{not json"), ("opts", "[1]", [1]),
    ("tags", '["x", 1]', ["x", 1]), ("tags", "x, y", "x, y"),
    ("when", "5", 5), ("when", "tomorrow", "tomorrow"),  # anyOf: the first type that parses
    ("note", "null", None), ("note", "None", None), ("note", "hi", "hi"),
    ("unlisted", '{"k": true}', {"k": True}), ("unlisted", "12", 12), ("unlisted", "plain text", "plain text"),
])
def test_values_are_typed_from_the_schema(name, raw, value):
    text = (f'<minimax:tool_call><invoke name="get_weather"><parameter name="{name}">{raw}</parameter></invoke>'
            "</minimax:tool_call>")
    [(_, args)] = _calls(parse_tool_calls(text, TOOLS))
    assert args == {name: value} and type(args[name]) is type(value)


def test_typing_without_a_schema_and_type_lists():
    assert typed_value("3", None) == 3 and typed_value("x", {}) == "x"
    assert typed_value("3", {"type": ["string", "integer"]}) == "3"
    assert typed_value("3", {"oneOf": [{"type": "boolean"}, {"type": "number"}]}) == 3
    # names only (a set, as the Hermes tests pass): JSON when it parses, else text
    text = ('<minimax:tool_call><invoke name="search"><parameter name="n">4</parameter>'
            '<parameter name="s">hi</parameter></invoke></minimax:tool_call>')
    [(_, args)] = _calls(parse_tool_calls(text, {"search"}))
    assert args == {"n": 4, "s": "hi"}


@pytest.mark.parametrize("text", [
    '<minimax:tool_call><invoke name="launch_rockets"><parameter name="n">1</parameter></invoke></minimax:tool_call>',
    '<minimax:tool_call><invoke name="search"><parameter name="q">unclosed</invoke></minimax:tool_call>',
    ('<minimax:tool_call><invoke name="search">stray text<parameter name="q">a</parameter></invoke>'
    "</minimax:tool_call>"),
    '<minimax:tool_call>oops<invoke name="search"></invoke></minimax:tool_call>',
    ('<minimax:tool_call><invoke name="search"><parameter name="q">a</parameter><parameter name="q">b</parameter>'
    "</invoke></minimax:tool_call>"),  # a parameter twice
    "<minimax:tool_call>\n</minimax:tool_call>",  # no invoke
    '<minimax:tool_call><invoke>no name</invoke></minimax:tool_call>',
    ('<minimax:tool_call><invoke name="search"><parameter name="q">a</parameter></invoke></minimax:tool_call>'
    '<minimax:tool_call><invoke name="nope"></invoke></minimax:tool_call>'),  # one bad block spoils all
    '<minimax:tool_call><invoke name="search"><parameter name="q">trunc',  # length stop mid-value
])
def test_malformed_minimax_markup_stays_text(text):
    out = parse_tool_calls(text, TOOLS)
    assert out.tool_calls == [] and out.content == text


def test_no_tools_offered_leaves_minimax_markup_as_text():
    assert parse_tool_calls(BRIEF, {}).content == BRIEF
    assert parse_chat_output(BRIEF, {}).content == BRIEF


# ---------------------------------------------------------------- MiniMax-M3's namespaced form
NS = "]<]minimax[>["
M3_PARAMS = {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "integer"}},
    "opts": {"type": "object", "properties": {"n": {"type": "number"}, "on": {"type": "boolean"}}},
    "empty": {"type": "array"}, "none": {"type": "object"}}}
M3_TOOLS = {"get_weather": M3_PARAMS, "search": None}


def _m3(*invokes: str) -> str:
    return f"{NS}<tool_call>\n" + "".join(f"{NS}<invoke {i}{NS}</invoke>\n" for i in invokes) + f"{NS}</tool_call>"


def _el(name: str, body: str) -> str:
    return f"{NS}<{name}>{body}{NS}</{name}>"


@pytest.mark.parametrize("text, content, calls", [
    ("Sure.\n" + _m3('name="get_weather">\n' + _el("city", "Paris &amp; Nice") + "\n" + _el("days", "3") + "\n"),
     "Sure.", [("get_weather", {"city": "Paris & Nice", "days": 3})]),
    (_m3('name="get_weather">' + _el("opts", _el("n", "2.5") + "\n" + _el("on", "true") + _el("x", "7"))
         + _el("tags", _el("item", "1") + _el("item", "2")) + _el("empty", "") + _el("none", "")),
     None, [("get_weather", {"opts": {"n": 2.5, "on": True, "x": 7}, "tags": [1, 2], "empty": [], "none": {}})]),
    (_m3('name="search">' + _el("q", "a") + _el("q", "b"), "name='search'>" + _el("q", '{"k": 1}')),  # repeats -> list
     None, [("search", {"q": ["a", "b"]}), ("search", {"q": {"k": 1}})]),
    (f'{NS}<tool_call>{NS}<invoke name="search">' + _el("q", "cut after"), None, [("search", {"q": "cut after"})]),
])
def test_m3_calls_are_parsed(text, content, calls):
    out = parse_tool_calls(text, M3_TOOLS)
    assert _calls(out) == calls and out.content == content


@pytest.mark.parametrize("text", [
    _m3('name="nope">' + _el("q", "a")),  # not an offered tool
    _m3('name="search">' + _el("q", "a") + "stray"),
    _m3('name="search">' + _el("q", "text" + _el("inner", "x"))),  # text beside elements
    _m3('name="search">' + f"{NS}<q>never closed"),
    _m3('name="search">' + f"{NS}<q>a{NS}</other>"),
    f"{NS}<tool_call>{NS}</tool_call>",
])
def test_malformed_m3_markup_stays_text(text):
    out = parse_tool_calls(text, M3_TOOLS)
    assert out.tool_calls == [] and out.content == text


# ---------------------------------------------------------------- reasoning
@pytest.mark.parametrize("text, inside, reasoning, content", [
    ("<think>\nThe user asks.\n</think>\n\nHello.", False, "The user asks.", "Hello."),
    ("The user asks.\n</think>\n\nHello.", True, "The user asks.", "Hello."),  # the template opened the block
    ("<think>\nrepeated open\n</think>ok", True, "repeated open", "ok"),
    ("<think>\ncut by the length limit", False, "cut by the length limit", ""),
    ("still thinking", True, "still thinking", ""),
    ("plain answer", False, None, "plain answer"),
    ("<think></think>\n\nanswer", False, None, "answer"),
    ("</think>\n</think>stray closers", False, None, "stray closers"),
    ("a <think>one</think> b <think> two </think>c", False, "one\n\ntwo", "a  b c"),
    ("x </think> y", False, None, "x </think> y"),  # a close tag inside content is content
])
def test_reasoning_split(text, inside, reasoning, content):
    assert split_reasoning(text, THINK, inside) == (reasoning, content)


def test_reasoning_parser_choice():
    chatml = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    assert reasoning_tags("auto", chatml) is None and reasoning_tags("auto", None) is None
    assert reasoning_tags("auto", "{{ '<think>\\n' }}") == THINK
    assert reasoning_tags("auto", "<mm:think></mm:think>") == MM_THINK
    assert reasoning_tags("think", chatml) == THINK and reasoning_tags("none", "<think>") is None
    with pytest.raises(ValueError, match="reasoning parser must be one of auto, think, none"):
        reasoning_tags("deepseek", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reasoning_parser must be one of"):
        ServerConfig(reasoning_parser="yes")  # type: ignore[arg-type]
    assert prompt_opens_block("]~b]ai\n<think>\n", THINK) and not prompt_opens_block("<think>x</think>\n", THINK)
    split = split_reasoning("<mm:think>m</mm:think>\n<think>t</think>", MM_THINK)
    assert split == ("m", "<think>t</think>")


def test_server_option_and_env(monkeypatch):
    from engine.server.__main__ import parse_args

    assert ServerConfig().reasoning_parser == "auto"
    assert parse_args(["--reasoning-parser", "think"])[0].reasoning_parser == "think"
    monkeypatch.setenv("MSA_EVAL_REASONING_PARSER", "none")
    assert parse_args([])[0].reasoning_parser == "none"


def test_tool_calls_inside_reasoning_are_not_calls():
    text = "<think>maybe " + BRIEF + "</think>No call needed."
    out = parse_chat_output(text, TOOLS, THINK)
    assert out.tool_calls == [] and out.content == "No call needed." and out.reasoning_content.startswith("maybe <")
    both = parse_chat_output("<think>plan</think>" + BRIEF, TOOLS, THINK)
    assert both.reasoning_content == "plan" and both.content is None and _calls(both) == [
        ("get_weather", {"city": "Paris", "days": 3})]


# ---------------------------------------------------------------- streaming == whole
def _streamed(pieces: list[str], tools, tags, inside):
    p = ChatOutputParser(tools, tags, inside)
    got = {"content": "", "reasoning_content": ""}
    for piece in pieces:
        for field, text in p.feed(piece):
            assert text, "empty delta"
            got[field] += text
    rest, out = p.finish()
    for field, text in rest:
        got[field] += text
    return got, out


def _check_stream(pieces: list[str], tools, tags, inside) -> None:
    whole = parse_chat_output("".join(pieces), tools, tags, inside)
    got, out = _streamed(pieces, tools, tags, inside)
    assert (out.content, out.reasoning_content, _calls(out)) == (whole.content, whole.reasoning_content, _calls(whole))
    assert got == {"content": whole.content or "", "reasoning_content": whole.reasoning_content or ""}


EXAMPLES = [
    "<think>\nWeather, Paris.\n</think>\n\nLet me check.\n" + BRIEF,
    "Let me check. " + BRIEF + " Done.",
    BRIEF.replace("get_weather", "unknown_tool"),  # malformed: all text
    'Sure.\n<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>',
    '{"name": "search", "arguments": {}}',  # whole-answer JSON call
    "  leading space, no call  ",
    "<think>only thinking, no end",
    "<think>a</think>b<think>c</think>d <minimax:tool_call><invoke name='search'></invoke></minimax:tool_call>",
    "<mm:think>m3</mm:think>\n\nOn it. " + _m3('name="search">' + _el("q", "x")),
    "] [ ]<]mini " + _m3('name="nope">'),
]


@pytest.mark.parametrize("text", EXAMPLES)
@pytest.mark.parametrize("tags", [THINK, MM_THINK, None])
def test_streaming_cut_at_every_boundary_equals_whole(text, tags):
    for tools in ({**TOOLS, **M3_TOOLS}, {}):
        _check_stream(list(text), tools, tags, False)  # one character at a time
        for i in range(len(text) + 1):  # and cut once at every boundary
            _check_stream([text[:i], text[i:]], tools, tags, False)


def test_streaming_sends_content_before_the_block_and_never_markup():
    text = "<think>plan</think>\n\nLet me check. " + BRIEF
    p = ChatOutputParser(TOOLS, THINK)
    sent = []
    for ch in text:
        sent += p.feed(ch)
    assert ("".join(t for f, t in sent if f == "content")) == "Let me check."  # streamed before the end
    assert ("".join(t for f, t in sent if f == "reasoning_content")) == "plan"
    rest, out = p.finish()
    assert rest == [] and _calls(out) == [("get_weather", {"city": "Paris", "days": 3})]


_FRAGMENTS = ["<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>", '<invoke name="search">',
              '<invoke name="get_weather">', "</invoke>", '<parameter name="days">', '<parameter name="q">',
              "</parameter>", "<tool_call>", "</tool_call>", '{"name": "search", "arguments": {}}', "<", "</",
              "<thi", "nk>", "3", "x", "é", " ", "\n", "{", "[", "```", "ab cd", "<mm:think>", "</mm:think>",
              f"{NS}<tool_call>", f"{NS}</tool_call>", f"{NS}<invoke name=\"search\">", f"{NS}</invoke>", f"{NS}<q>",
              f"{NS}</q>", "]<]", "minimax[>["]


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.sampled_from(_FRAGMENTS), max_size=14), cuts=st.lists(st.integers(0, 400), max_size=8),
       tools=st.sampled_from([TOOLS, M3_TOOLS, {}]), tags=st.sampled_from([THINK, MM_THINK, None]),
       inside=st.booleans())
def test_streaming_any_cut_equals_whole(parts, cuts, tools, tags, inside):
    text = "".join(parts)
    marks = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *marks], [*marks, len(text)], strict=True)]
    _check_stream(pieces, tools, tags, inside)


# ---------------------------------------------------------------- the M3 chat template
@pytest.fixture(scope="module")
def m3_tokenizer(tmp_path_factory):
    from engine.loader.hf_loader import load_hf_tokenizer
    from engine.m3.testing import write_tokenizer

    d = tmp_path_factory.mktemp("m3tok")
    write_tokenizer(d)

    class _Cfg:
        eos_token_ids: tuple[int, ...] = ()

    return load_hf_tokenizer(d, _Cfg())  # type: ignore[arg-type]


def _state(tok):
    """A ServingState around a tokenizer: enough for `render_chat`, the server's own prompt renderer."""
    from types import SimpleNamespace

    from engine.server.state import ServingState

    return ServingState(llm=SimpleNamespace(tokenizer=tok), engine=None, metrics=None, model_names=("m",), created=0)


def test_m3_template_gets_tools_and_tool_messages(m3_tokenizer):
    from engine.server.schemas import ChatCompletionRequest

    tok = m3_tokenizer
    assert template_supports_tools(tok.chat_template)
    args = {"city": "Paris", "days": 3, "opts": {"u": "C"}}
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps(args)}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "22 C, clear sky"},
    ]
    req = ChatCompletionRequest(model="m", messages=messages, tools=[WEATHER])
    prompt = _state(tok).render_chat(req)
    assert prompt.startswith("<s>]~b]system\n") and prompt.endswith("]~b]assistant\n")
    assert json.dumps(req.tools[0].model_dump(exclude_none=True)) in prompt  # the tools, natively
    assert "]~b]tool\n22 C, clear sky[e~[" in prompt  # the tool result
    # the template wrote the call in MiniMax's form from argument objects; it parses back to the same call
    turn = prompt.split("]~b]assistant\n")[1].split("[e~[")[0]
    assert '<parameter name="days">3</parameter>' in turn
    assert _calls(parse_tool_calls(turn, offered_tools([WEATHER]))) == [("get_weather", args)]
    hidden = _state(tok).render_chat(ChatCompletionRequest(model="m", messages=messages[:1], tools=[WEATHER],
                                                           tool_choice="none"))
    assert "<tools>" not in hidden and hidden.endswith("]~b]assistant\n")


def test_assistant_reasoning_reaches_the_template(m3_tokenizer):
    from engine.server.schemas import ChatCompletionRequest
    from engine.tokenizer import Tokenizer

    template = ("{% for m in messages %}{{ m.role }}:{% if m.reasoning_content %}<think>{{ m.reasoning_content }}"
                "</think>{% endif %}{{ m.content }}\n{% endfor %}")
    tok = Tokenizer(m3_tokenizer._tok, template, None, None, set(), add_bos=False)
    req = ChatCompletionRequest(model="m", messages=[
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": "r"},
        {"role": "user", "content": "q2", "reasoning_content": "ignored on a user turn"}])
    assert _state(tok).render_chat(req) == "user:q\nassistant:<think>r</think>a\nuser:q2\n"


def test_m3_tokenizer_keeps_markup_when_skipping_special_tokens(m3_tokenizer):
    tok = m3_tokenizer
    text = "<think>hm</think>ok" + BRIEF
    ids = tok.encode("<s>" + text + "[e~[")
    assert tok.token_to_id("<think>") in ids and tok.token_to_id("<minimax:tool_call>") in ids  # special tokens
    assert tok.decode(ids) == text  # BOS / EOS skipped, the markup kept
    assert tok.decode(ids, skip_special_tokens=False) == "<s>" + text + "[e~["


# ---------------------------------------------------------------- the real server
# SmolLM2 copies an answer from the conversation greedily, so its answer is this text
ANSWER = ('<think>Paris, 3 days.</think>\n\nChecking.\n<minimax:tool_call>\n<invoke name="get_weather">\n'
          '<parameter name="city">Paris</parameter>\n<parameter name="days">3</parameter>\n</invoke>\n'
          "</minimax:tool_call>")
QUESTION = "Weather in Paris for 3 days?"
CONVERSATION = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": ANSWER}] * 2 + [
    {"role": "user", "content": QUESTION}]


@pytest.fixture(scope="module")
def base_url():
    with running_server("--reasoning-parser", "think", "--max-batch", "2", "--max-queue", "0") as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)


def test_default_model_template_has_no_think(base_url):
    # the default behaviour is unchanged for SmolLM2: `auto` does not split its answers
    template = httpx.get(base_url.removesuffix("/v1") + "/tokenizer_info").json()["chat_template"]
    assert "im_start" in template and reasoning_tags("auto", template) is None


def test_server_minimax_call_with_reasoning_stream_equals_nonstream(client):
    kw = dict(model="smollm2-135m", messages=CONVERSATION, tools=[WEATHER], temperature=0, max_tokens=80)
    results: dict[str, list] = {}

    def streamed() -> None:  # decoded in the same batch as the non-streamed request
        results["chunks"] = list(client.chat.completions.create(**kw, stream=True))

    t = threading.Thread(target=streamed)
    t.start()
    r = client.chat.completions.create(**kw)
    t.join()
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    msg = choice.message
    assert msg.model_extra["reasoning_content"] == "Paris, 3 days." and msg.content == "Checking."
    [call] = msg.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris", "days": 3}

    deltas = [c.choices[0].delta for c in results["chunks"] if c.choices]
    content = [d.content for d in deltas if d.content]
    reasoning = [d.model_extra.get("reasoning_content") for d in deltas if d.model_extra.get("reasoning_content")]
    assert "".join(content) == "Checking." and "".join(reasoning) == "Paris, 3 days."
    assert not any("<" in c for c in content + reasoning)  # no markup leaked
    [tc] = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert (tc.index, tc.function.name, json.loads(tc.function.arguments)) == (0, "get_weather",
                                                                               {"city": "Paris", "days": 3})
    assert [c.choices[0].finish_reason for c in results["chunks"] if c.choices][-1] == "tool_calls"


def test_local_backend_parses_like_the_server():
    """The runner's in-process backend (`msa-eval run/agent --backend local`) reads the same answer the same
    way: the MiniMax call typed by the tool's schema (SmolLM2's template has no <think>, so `auto` keeps the
    reasoning text in the content, as the server's `auto` does)."""
    from msa_eval.backends.local import LocalBackend

    backend = LocalBackend("smollm2-135m", attention="dense", device="cpu")
    try:
        r = backend.chat(CONVERSATION, tools=[WEATHER], max_tokens=80)
    finally:
        backend.close()
    assert r.finish_reason == "tool_calls"
    assert [(c.name, json.loads(c.arguments)) for c in r.tool_calls] == [("get_weather", {"city": "Paris", "days": 3})]
    assert r.content.endswith("Checking.") and "reasoning_content" not in r.extra
