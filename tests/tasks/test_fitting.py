import pytest

from tasks.base import BuildSpec, PromptParts, TaskError, continue_chat_text
from tasks.fitting import count_tokens, cut_to_tokens, fit_parts, render, truncate_context


def test_render_modes():
    parts = PromptParts("B:", "ctx", ":A", "Answer:", system="sys")
    prompt, messages = render(parts, "completion")
    assert messages is None and prompt == "sys\n\nB:ctx:A\nAnswer:"
    prompt, messages = render(parts, "chat")  # HELMET chat policy: no answer prefix
    assert prompt is None
    assert messages == [{"role": "system", "content": "sys"}, {"role": "user", "content": "B:ctx:A"}]
    _, messages = render(PromptParts("B:", "ctx", ":A", "Answer:", chat_prefix="user"), "chat")
    assert messages == [{"role": "user", "content": "B:ctx:A\nAnswer:"}]
    _, messages = render(PromptParts("B:", "ctx", ":A", "Answer:", chat_prefix="assistant"), "chat")
    assert messages == [{"role": "user", "content": "B:ctx:A"}, {"role": "assistant", "content": "Answer:"}]


def test_assistant_prefill_is_continued_and_counted(ref_tok):
    """The prefill follows the generation prompt verbatim (no end-of-turn after it), and the
    fitted token count is that of the continued text."""
    parts = PromptParts("B:", "ctx", ":A", "The answer is", chat_prefix="assistant")
    _, messages = render(parts, "chat")
    text = continue_chat_text(messages, ref_tok)
    head = ref_tok.apply_chat_template(messages[:1], add_generation_prompt=True)
    assert text == head + "The answer is"
    assert not text.endswith("<|im_end|>\n")
    assert count_tokens(parts, "chat", ref_tok) == len(ref_tok.encode(text))
    assert continue_chat_text(messages[:1], ref_tok) == head  # no prefill: the usual rendering


def test_count_includes_chat_template(ref_tok):
    parts = PromptParts("hello ", "world", "", "")
    chat = count_tokens(parts, "chat", ref_tok)
    plain = count_tokens(parts, "completion", ref_tok)
    assert chat > plain + 5  # template tokens are counted


def test_fit_parts_respects_budget_and_refuses_tiny(ref_tok):
    def make(n, tail):
        return PromptParts("Q: ", " ".join(["word"] * n), " end", "A:")

    spec = BuildSpec(512, ref_tok, "completion")
    fit = fit_parts(make, spec, budget=32, task="t")
    assert fit.prompt_tokens + 32 <= 512
    assert fit.prompt_tokens + 32 >= 512 - 2  # one 'word' is one token
    with pytest.raises(TaskError, match="too small"):
        fit_parts(make, BuildSpec(40, ref_tok, "chat"), budget=32, task="t")


def test_truncate_context_cuts_only_the_context_end(ref_tok):
    ctx = " ".join(f"item{i}" for i in range(400))
    parts = PromptParts("KEEP-BEFORE ", ctx, " KEEP-AFTER", "Answer:")
    full = count_tokens(parts, "completion", ref_tok)
    new, dropped = truncate_context(parts, "completion", ref_tok, full - 100)
    assert dropped >= 100
    assert count_tokens(new, "completion", ref_tok) <= full - 100
    assert new.before == parts.before and new.after == parts.after
    assert new.context.startswith("item0 item1") and "item399" not in new.context
    same, zero = truncate_context(parts, "completion", ref_tok, full)
    assert zero == 0 and same is parts
    assert len(ref_tok.encode(cut_to_tokens(ctx, 17, ref_tok))) <= 17
