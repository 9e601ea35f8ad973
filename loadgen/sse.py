"""SSE framing and token timing of one OpenAI-style stream, fed raw bytes with their arrival times.

Definitions (see docs/loadgen.md): TTFT is the first chunk carrying non-empty content (a
role-only or empty first chunk does not count); ITL is every gap between consecutive content chunks;
E2E ends at the last content chunk; the trailing usage chunk only supplies token counts.
"""

import json
from dataclasses import dataclass, field


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
    """Incremental parser: `feed(bytes, now)` as data arrives, then read `.state`."""

    def __init__(self) -> None:
        self.state = StreamState()
        self._buffer = b""
        self._data_lines: list[str] = []

    def feed(self, data: bytes, now: float) -> int:
        """Parse what arrived at `now`; returns the number of new content chunks."""
        before = self.state.num_chunks
        self._buffer += data
        while True:
            newline = self._buffer.find(b"\n")
            if newline < 0:
                break
            line = self._buffer[:newline].rstrip(b"\r").decode("utf-8", errors="replace")
            self._buffer = self._buffer[newline + 1 :]
            self._on_line(line, now)
        return self.state.num_chunks - before

    def close(self, now: float) -> None:
        """End of body: dispatch a last event left without its blank line."""
        if self._buffer:
            self._on_line(self._buffer.rstrip(b"\r").decode("utf-8", errors="replace"), now)
            self._buffer = b""
        if self._data_lines:
            self._dispatch(now)

    def _on_line(self, line: str, now: float) -> None:
        if not line:
            if self._data_lines:
                self._dispatch(now)
            return
        if line.startswith(":"):  # comment / keep-alive ping
            return
        name, _, value = line.partition(":")
        if name == "data":
            self._data_lines.append(value[1:] if value.startswith(" ") else value)

    def _dispatch(self, now: float) -> None:
        data = "\n".join(self._data_lines)
        self._data_lines = []
        if data.strip() == "[DONE]":
            self.state.done = True
            return
        try:
            event = json.loads(data)
        except json.JSONDecodeError:
            self.state.error = self.state.error or f"unreadable SSE event: {data[:200]!r}"
            return
        if not isinstance(event, dict):
            self.state.error = self.state.error or f"SSE event is not an object: {data[:200]!r}"
            return
        self._on_event(event, now)

    def _on_event(self, event: dict, now: float) -> None:
        state = self.state
        if state.response_id is None and isinstance(event.get("id"), str):
            state.response_id = event["id"]
        if event.get("error") is not None:
            state.error = state.error or _error_message(event["error"])
            return
        choices = event.get("choices") or []
        if choices and isinstance(choices[0], dict):
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
        if isinstance(usage, dict):
            state.prompt_tokens = usage.get("prompt_tokens", state.prompt_tokens)
            state.completion_tokens = usage.get("completion_tokens", state.completion_tokens)
            details = usage.get("prompt_tokens_details") or {}
            if isinstance(details, dict) and details.get("cached_tokens") is not None:
                state.cached_tokens = details["cached_tokens"]


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
