"""SSE framing and token timing of one OpenAI-style stream, fed raw bytes with their arrival times.

Definitions (see docs/loadgen.md): TTFT is the first chunk carrying non-empty content (a
role-only or empty first chunk does not count); ITL is every gap between consecutive content chunks;
E2E ends at the last content chunk; the trailing usage chunk only supplies token counts.
"""

import json
from dataclasses import dataclass, field

import orjson


@dataclass(slots=True)
class StreamState:
    first_ts: float | None = None
    last_ts: float | None = None
    itl_s: list[float] = field(default_factory=list)
    num_chunks: int = 0  # content chunks
    done: bool = False  # saw `data: [DONE]`
    error: str | None = None  # message of an error event, or why an event could not be read
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    response_id: str | None = None  # the server's id for the completion (its request id in llmserve/vLLM)
    text_parts: list[str] = field(default_factory=list)  # the answer, for multi-turn histories

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


class SSEParser:
    """Incremental parser: `feed(bytes, now)` as data arrives, then read `.state`.

    Works on bytes, one event (the lines up to a blank line) at a time: an event that is a single
    `data: ...` line, which is what servers send, costs one split and one orjson.loads. Lines end with
    LF or CRLF; comments (`:` keep-alives) and fields other than `data` are skipped; several `data`
    lines join with newlines. An event counts at the `now` of the feed that completed it.
    """

    __slots__ = ("state", "_buffer")

    def __init__(self) -> None:
        self.state = StreamState()
        self._buffer = b""

    def feed(self, data: bytes, now: float, stop_at: int | None = None) -> int:
        """Parse what arrived at `now`; returns the number of new content chunks. With `stop_at`,
        events after the one that brings the content chunks to that many are left unread (the
        caller is about to close the stream: the abort profile)."""
        state = self.state
        before = state.num_chunks
        buf = self._buffer + data if self._buffer else data
        if b"\r" in buf:  # CRLF line ends (a CR that ends this read may pair with the next LF)
            buf = buf.replace(b"\r\n", b"\n")
        if b"\n\n" not in buf:
            self._buffer = buf
            return 0
        events = buf.split(b"\n\n")
        self._buffer = events.pop()
        for event in events:
            if event.startswith(b"data: ") and b"\n" not in event and b"\r" not in event:
                self._on_data(event[6:], now)
            elif event:
                self._on_lines(event, now)
            if stop_at is not None and state.num_chunks >= stop_at:
                self._buffer = b""
                break
        return state.num_chunks - before

    def close(self, now: float) -> None:
        """End of body: dispatch a last event left without its blank line."""
        if self._buffer:  # (holds no blank line: feed dispatched everything up to the last one)
            buf, self._buffer = self._buffer, b""
            self._on_lines(buf, now)

    def _on_lines(self, event: bytes, now: float) -> None:
        """The general case: any number of lines, comments, fields other than data."""
        data_lines = []
        for line in event.split(b"\n"):
            line = line.rstrip(b"\r")
            if not line or line.startswith(b":"):  # (a blank line inside: the end of the event before)
                continue
            name, _, value = line.partition(b":")
            if name == b"data":
                data_lines.append(value[1:] if value.startswith(b" ") else value)
        if data_lines:
            self._on_data(b"\n".join(data_lines), now)

    def _on_data(self, payload: bytes, now: float) -> None:
        if payload[:1] != b"{":  # (the common case, a JSON object, is parsed from the bytes as they are)
            if payload.strip() == b"[DONE]":
                self.state.done = True
                return
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:  # json reads what orjson refuses (bad UTF-8 replaced, NaN, ...)
            try:
                event = json.loads(_text(payload))
            except json.JSONDecodeError:
                self.state.error = self.state.error or f"unreadable SSE event: {_text(payload)[:200]!r}"
                return
        if not isinstance(event, dict):
            self.state.error = self.state.error or f"SSE event is not an object: {_text(payload)[:200]!r}"
            return
        self._on_event(event, now)

    def _on_event(self, event: dict, now: float) -> None:
        state = self.state
        if state.response_id is None and isinstance(event.get("id"), str):
            state.response_id = event["id"]
        if event.get("error") is not None:
            state.error = state.error or _error_message(event["error"])
            return
        choices = event.get("choices")
        if choices and isinstance(choices, list) and isinstance(choices[0], dict):
            choice = choices[0]
            content = _content_of(choice)
            if content:
                state.text_parts.append(content)
                if state.first_ts is None:
                    state.first_ts = now
                else:
                    state.itl_s.append(now - state.last_ts)
                state.last_ts = now
                state.num_chunks += 1
            if choice.get("finish_reason"):
                state.finish_reason = choice["finish_reason"]
        usage = event.get("usage")
        if usage is not None and isinstance(usage, dict):
            state.prompt_tokens = usage.get("prompt_tokens", state.prompt_tokens)
            state.completion_tokens = usage.get("completion_tokens", state.completion_tokens)
            details = usage.get("prompt_tokens_details") or {}
            if isinstance(details, dict) and details.get("cached_tokens") is not None:
                state.cached_tokens = details["cached_tokens"]


def _text(payload: bytes) -> str:
    return payload.decode("utf-8", errors="replace")


def _content_of(choice: dict) -> str:
    """Text a chunk carries: chat delta content or reasoning, or the completions `text`."""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        for key in ("content", "reasoning_content", "reasoning"):
            if delta.get(key):
                return delta[key]
        return ""
    return choice.get("text") or ""


def _error_message(error: object) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)
