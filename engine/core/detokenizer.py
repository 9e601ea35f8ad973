"""Incremental detokenization and stop checks: stop strings, stop token ids, eos, max_tokens."""

from typing import Protocol

from engine.core.outputs import FinishReason
from engine.core.sequence import Request

REPLACEMENT_CHAR = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: list[int]) -> str: ...


def detokenize_incrementally(tokenizer: Decoder, request: Request, end: int, flush: bool = False) -> str:
    """Text of tokens up to `end` not yet emitted, held back while it ends in a partial UTF-8 char.

    Decodes a short window `[prefix_offset, end)` and subtracts the text of the window's already
    emitted part `[prefix_offset, read_offset)`, so the cost per token stays constant and a
    multi-byte character split over several tokens appears once, whole.
    """
    ids = request.all_token_ids
    if end <= request.read_offset:
        return ""
    prefix_text = tokenizer.decode(ids[request.prefix_offset : request.read_offset])
    new_text = tokenizer.decode(ids[request.prefix_offset : end])
    if len(new_text) <= len(prefix_text) or (new_text.endswith(REPLACEMENT_CHAR) and not flush):
        return ""
    request.prefix_offset = request.read_offset
    request.read_offset = end
    return new_text[len(prefix_text) :]


def check_stop(tokenizer: Decoder, request: Request, eos_token_id: int | None, max_model_len: int) -> None:
    """Update text and finish_reason after one token was appended (vLLM's check order)."""
    params = request.params
    token_id = request.output_token_ids[-1]
    if request.num_output_tokens < params.min_tokens:
        # Below min_tokens nothing stops the request but its length (the sampler held eos and stop
        # token ids back); stop strings wholly inside the first min_tokens stay, as in vLLM.
        request.output_text += detokenize_incrementally(tokenizer, request, request.num_tokens)
        if request.num_tokens >= max_model_len:
            request.output_text += detokenize_incrementally(tokenizer, request, request.num_tokens, flush=True)
            request.finish_reason = FinishReason.LENGTH
        return
    is_eos = eos_token_id is not None and token_id == eos_token_id and not params.ignore_eos
    if is_eos or token_id in params.stop_token_ids:
        # The stop token itself adds no text; flush what was held back before it.
        request.output_text += detokenize_incrementally(tokenizer, request, request.num_tokens - 1, flush=True)
        request.finish_reason = FinishReason.STOP
        return
    old_len = len(request.output_text)
    request.output_text += detokenize_incrementally(tokenizer, request, request.num_tokens)
    if params.stop and _cut_at_stop_string(request, old_len):
        request.finish_reason = FinishReason.STOP
        return
    if request.num_output_tokens >= params.max_tokens or request.num_tokens >= max_model_len:
        request.output_text += detokenize_incrementally(tokenizer, request, request.num_tokens, flush=True)
        if params.stop and _cut_at_stop_string(request, old_len):
            request.finish_reason = FinishReason.STOP
            return
        request.finish_reason = FinishReason.LENGTH


def _cut_at_stop_string(request: Request, old_len: int) -> bool:
    text = request.output_text
    best = None
    for stop in request.params.stop:
        pos = text.find(stop, max(0, old_len - len(stop) + 1))
        if pos != -1 and (best is None or pos < best):
            best = pos
    if best is None:
        return False
    request.output_text = text[:best]  # the stop string is not part of the output
    return True


def take_new_text(request: Request, finished: bool) -> str:
    """Text not handed out yet; while running, hold back what could still begin a stop string."""
    end = len(request.output_text)
    if not finished and request.params.stop:
        end -= max(len(s) for s in request.params.stop) - 1
    if end <= request.num_text_sent:
        return ""
    text = request.output_text[request.num_text_sent : end]
    request.num_text_sent = end
    return text
