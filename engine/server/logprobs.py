"""The engine's per-token log-probabilities in OpenAI's two response shapes (chat and legacy completions)."""

from engine.core.outputs import TokenLogprob

# OpenAI's stand-in for a log-probability too small to say (JSON has no -Infinity).
VERY_UNLIKELY = -9999.0


class LogprobFormatter:
    """Token text and bytes per id (cached: a vocabulary is small), then the response fragments."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._pieces: dict[int, tuple[str, list[int]]] = {}

    def piece(self, token_id: int) -> tuple[str, list[int]]:
        """(token text, its UTF-8 bytes); a token that is part of a character reads `bytes:\\xe2\\x80`."""
        found = self._pieces.get(token_id)
        if found is None:
            raw = self.tokenizer.token_bytes(token_id)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            found = self._pieces[token_id] = (text, list(raw))
        return found

    def chat(self, logprobs: list[TokenLogprob]) -> dict:
        """`choices[i].logprobs` of a chat completion or chunk."""
        content = []
        for lp in logprobs:
            text, raw = self.piece(lp.token_id)
            top = []
            for token_id, value in lp.top:
                alt_text, alt_raw = self.piece(token_id)
                top.append({"token": alt_text, "logprob": _finite(value), "bytes": alt_raw})
            content.append({"token": text, "logprob": _finite(lp.logprob), "bytes": raw, "top_logprobs": top})
        return {"content": content, "refusal": None}

    def completion(self, logprobs: list[TokenLogprob], text_offset: int) -> tuple[dict, int]:
        """`choices[i].logprobs` of a legacy completion (or chunk) whose first token starts at `text_offset`
        characters into the choice's text; and the offset after its last token."""
        tokens, token_logprobs, tops, offsets = [], [], [], []
        for lp in logprobs:
            text, _ = self.piece(lp.token_id)
            tokens.append(text)
            token_logprobs.append(_finite(lp.logprob))
            top = {self.piece(token_id)[0]: _finite(value) for token_id, value in lp.top}
            top.setdefault(text, _finite(lp.logprob))  # as OpenAI: the sampled token is always there
            tops.append(top)
            offsets.append(text_offset)
            text_offset += len(text)
        body = {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}
        return body, text_offset


def _finite(value: float) -> float:
    return value if value > VERY_UNLIKELY else VERY_UNLIKELY
