"""How the runner sends an assistant-prefill chat (the needle tasks' answer prefix) to each
kind of backend, checked on the wire against the scripted OpenAI server: the reference
template + prefix as a /completions prompt, or (chat-only providers) the prefix in the user
turn; the prompt format is recorded per sample. The local backend's path is checked on the
real model in test_runner_resume.py."""
from __future__ import annotations

import json

import pytest

from msa_eval.backends.factory import make_backend
from msa_eval.cli.run_setup import RunArgs, prepare
from msa_eval.runner import run_suite
from msa_eval.runner.config import ConfigError
from msa_eval.runner.requests import to_request
from tasks.base import BuildSpec, continue_chat_text
from tasks.registry import get_task
from tests.msa_eval.scripted_openai_server import ScriptedOpenAI


@pytest.fixture(scope="module")
def ref_tok():
    from msa_eval.runner.reference import load_reference_tokenizer

    return load_reference_tokenizer("smollm2-135m")[0]


def _records(run_dir):
    return [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("chat_only", [False, True])
def test_prefill_chat_over_openai_wire(tmp_path, ref_tok, chat_only):
    with ScriptedOpenAI(text="1234567") as server:
        opts = ("chat_only=true",) if chat_only else ()
        prep = prepare(RunArgs("helmet", "openai", "m", "dense", server.base_url, None, "512", 1,
                               "niah_single,json_kv", None, None, None, None, tmp_path / "r", opts))
        run_suite(prep.cfg, prep.run_dir, prep.plan, prep.reference_info,
                  reference_tokenizer=prep.tokenizer)
        sent = {r["path"]: r["body"] for r in server.requests}
    s = get_task("niah_single").build(0, BuildSpec(512, ref_tok, "chat"))
    prefix = s.metadata["answer_prefix"]
    recs = {r["task"]: r for r in _records(tmp_path / "r")}
    assert recs["json_kv"]["prompt_format"] == "chat"  # no prefill: messages as they are
    assert recs["niah_single"]["prompt_hash"] == s.prompt_hash()  # the same sample for every backend
    if chat_only:
        assert set(sent) == {"/v1/chat/completions"}  # chat-only: every request is a chat
        users = [r["body"]["messages"][-1] for r in server.requests]
        niah = [u for u in users if u["content"].endswith(prefix)]
        assert len(niah) == 1 and niah[0]["role"] == "user"
        assert niah[0]["content"] == s.messages[0]["content"] + "\n" + prefix
        assert recs["niah_single"]["prompt_format"] == "chat-prefix-in-user"
    else:
        assert set(sent) == {"/v1/chat/completions", "/v1/completions"}
        assert sent["/v1/completions"]["prompt"] == continue_chat_text(s.messages, ref_tok)
        assert sent["/v1/completions"]["prompt"].endswith("<|im_start|>assistant\n" + prefix)
        assert recs["niah_single"]["prompt_format"] == "chat-prefill-ref"


def test_to_request_formats(ref_tok):
    s = get_task("niah_single").build(0, BuildSpec(1024, ref_tok, "chat"))
    comp = get_task("niah_single").build(0, BuildSpec(1024, ref_tok, "completion"))
    remote = make_backend("openai", base_url="http://127.0.0.1:9/v1", model="m")
    req, fmt = to_request(s, remote, ref_tok)
    assert fmt == "chat-prefill-ref" and req.messages is None
    assert req.prompt == continue_chat_text(s.messages, ref_tok) and req.max_tokens == s.max_tokens
    assert to_request(comp, remote, ref_tok) == (to_request(comp)[0], "completion")
    with pytest.raises(ConfigError, match="reference tokenizer"):
        to_request(s, remote, None)
