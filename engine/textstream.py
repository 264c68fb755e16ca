"""Token ids -> text, cut before a stop string: the one text cutter (the server's stream, `msa-eval
generate` and every finished request's `RequestOutput.text`).

The engine stops a request on a stop string (`engine.stops`); this class finds where
the text ends: it decodes the whole output after every `add` (`decode(ids, skip_special_tokens=True)`),
so a stop string spanning several tokens is found and the text is cut right before it. For
streaming, text that could still be the start of a stop string, or that ends in an incomplete
UTF-8 sequence (U+FFFD), is held back until it is decided. Decoding the whole output each step
costs O(n^2) in output length; outputs here are short.
"""
from __future__ import annotations

from typing import Protocol


class _Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalText:
    """Accumulate generated token ids; hand out the text that is safe to emit."""

    def __init__(self, tokenizer: _Decoder, stop: list[str]) -> None:
        self._tokenizer = tokenizer
        self._stop = [s for s in stop if s]
        self.token_ids: list[int] = []
        self.text = ""  # decoded output, cut before a stop string once one is found
        self.emitted = 0  # characters of `text` already handed out
        self.stopped = False  # a stop string was found

    def add(self, new_ids: list[int]) -> str:
        """Add tokens; return the newly safe text (possibly "")."""
        if self.stopped or not new_ids:
            return ""
        self.token_ids.extend(new_ids)
        self.text = self._tokenizer.decode(self.token_ids, skip_special_tokens=True)
        cut = self._find_stop()
        if cut is not None:
            self.text, self.stopped = self.text[:cut], True
            return self._take(len(self.text))
        safe = len(self.text)
        if self.text.endswith("\ufffd"):
            safe = len(self.text.rstrip("\ufffd"))
        safe = min(safe, self._stop_prefix_start())
        return self._take(max(safe, self.emitted))

    def flush(self) -> str:
        """At the end of the request: everything not yet emitted."""
        return self._take(len(self.text))

    def _take(self, upto: int) -> str:
        piece = self.text[self.emitted:upto]
        self.emitted = max(self.emitted, upto)
        return piece

    def _find_stop(self) -> int | None:
        if not self._stop:
            return None
        start = max(0, self.emitted - max(len(s) for s in self._stop))
        hits = [i for i in (self.text.find(s, start) for s in self._stop) if i >= 0]
        return min(hits) if hits else None

    def _stop_prefix_start(self) -> int:
        """Index where a suffix of `text` that is a proper prefix of a stop string begins."""
        best = len(self.text)
        for s in self._stop:
            for k in range(min(len(s) - 1, len(self.text)), 0, -1):
                if self.text.endswith(s[:k]):
                    best = min(best, len(self.text) - k)
                    break
        return best
