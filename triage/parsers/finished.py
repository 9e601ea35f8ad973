"""This engine's request.finished lines as the bulk reading decodes them (triage.parsers.bulk.finished_totals):
typed rows of the fields the rules read."""

from typing import Annotated, Literal

import msgspec

_Int64 = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]  # (orjson reads one past 64 bits as a float)


class FinishedRow(msgspec.Struct, gc=False):
    """A request.finished line of this engine's JSON log, decoded with only the fields the rules read and
    typed as the engine writes them (a token count an integer, a fingerprint a list of strings): msgspec
    skips the rest, and refuses a line where one of these has another type (its run is decoded by orjson).
    Read as the dict the per-line reading decodes, by get() (a field absent or null: None)."""

    ts: str
    event: Literal["request.finished"]
    prompt_tokens: _Int64
    cached_tokens: _Int64
    prefix_fingerprint: list[str] | None = None
    ttft_s: float | None = None  # (an integer in the line: its float, as the rules take it)
    logger: str | None = None
    finish_reason: str | None = None

    def get(self, key: str):
        return getattr(self, key, None)


decode = msgspec.json.Decoder(FinishedRow).decode
NOT_TYPED = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)
