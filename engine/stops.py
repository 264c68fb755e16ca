"""The stop rule, applied by the engine after every token: EOS (unless `ignore_eos`), a stop token
id, a stop string, a constrained request's grammar complete (`engine.constrained`), or the length
limit. A stop string only stops the request here; where its text
ends is cut by `engine.textstream.IncrementalText`."""
from __future__ import annotations

from engine.sequence import Sequence


def check_stop(seq: Sequence, tokenizer) -> None:
    """Mark `seq` finished ("stop" or "length") when its newest token ends it. The tokenizer is only
    asked what it is needed for (EOS ids unless `ignore_eos`, text when there are stop strings)."""
    p, tok = seq.params, seq.output_ids[-1]
    if not p.ignore_eos and tok in tokenizer.eos_token_ids:
        seq.finished, seq.finish_reason = True, "stop"
    elif tok in p.stop_token_ids:
        seq.finished, seq.finish_reason = True, "stop"
    elif p.stop and stop_string_hit(seq, tokenizer):
        seq.finished, seq.finish_reason = True, "stop"
    elif seq.grammar is not None and seq.grammar.done:
        seq.finished, seq.finish_reason = True, "stop"
    elif len(seq.output_ids) >= p.max_tokens or seq.total_len >= seq.max_len:
        seq.finished, seq.finish_reason = True, "length"


def stop_string_hit(seq: Sequence, tokenizer) -> bool:
    # decode only a tail window: a stop string can only end in the newest text
    longest = max(len(s) for s in seq.params.stop)
    tail = tokenizer.decode(seq.output_ids[-(longest + 8):])
    return any(s in tail for s in seq.params.stop)
