"""Pure-ASGI middleware: body size limit (413), HTTP access log and llm_http_requests_total."""

import hmac
import json
import time

from engine.server.errors import APIError, BodyTooLarge, Unauthorized, map_exception
from engine.server.state import ServerState

KNOWN_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/ready",
                          "/metrics", "/openapi.json", "/docs"})


class ObservedASGI:
    """Wraps the app: it buffers the body up to the limit (so the route never sees more), then
    logs one http.access line and counts the response once it has been sent.

    Pure ASGI rather than BaseHTTPMiddleware, which would break streaming and disconnect detection.
    """

    def __init__(self, app, state: ServerState):
        self.app = app
        self.state = state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.monotonic()
        status: dict[str, int | None] = {"code": None}

        async def send_observed(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            if not self._authorized(scope):
                await self._reject(send_observed, Unauthorized("Incorrect API key provided.", code="invalid_api_key"))
                return
            replay = await self._read_body(scope, receive)
            if replay is None:
                await self._reject(send_observed, BodyTooLarge(
                    f"The request body is larger than the limit of {self.state.config.max_body_bytes} bytes.",
                    code="request_too_large"))
            else:
                await self.app(scope, replay, send_observed)
        except Exception:  # noqa: BLE001 - already answered 500 and logged by the app's handler
            if status["code"] is None:
                await _send_error(send_observed, map_exception(RuntimeError()))
        finally:
            self._observe(scope, status["code"] or 500, time.monotonic() - start)

    async def _read_body(self, scope, receive):
        """Read the whole body if within the limit; return a receive() that replays it, else None."""
        limit = self.state.config.max_body_bytes
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                return None
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                chunks.append(None)
                break
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                return None
            chunks.append(body)
            more = message.get("more_body", False)
        pending = [{"type": "http.request", "body": b"".join(c for c in chunks if c), "more_body": False}]
        if chunks and chunks[-1] is None:
            pending.append({"type": "http.disconnect"})

        async def replay():
            return pending.pop(0) if pending else await receive()

        return replay

    def _authorized(self, scope) -> bool:
        """--api-key guards /v1/*; /health, /ready and /metrics stay open. Constant-time compare."""
        key = self.state.config.api_key
        if key is None or not scope.get("path", "").startswith("/v1/"):
            return True
        header = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                header = value
        given = header[7:] if header[:7].lower() == b"bearer " else b""
        return hmac.compare_digest(given, key.encode())

    async def _reject(self, send, exc: APIError) -> None:
        mapped = map_exception(exc)
        if self.state.metrics is not None and mapped.reject_reason:
            self.state.metrics.reject(mapped.reject_reason)
        self.state.log.emit("request.rejected", "warning", reason=mapped.reject_reason,
                            message=mapped.body["error"]["message"])
        await _send_error(send, mapped)

    def _observe(self, scope, status: int, duration_s: float) -> None:
        path = scope.get("path", "")
        client = scope.get("client")
        self.state.log.emit("http.access", method=scope.get("method"), path=path, status=status,
                            duration_s=duration_s, client=f"{client[0]}:{client[1]}" if client else None)
        if self.state.metrics is not None:
            self.state.metrics.http_response(path if path in KNOWN_ROUTES else "other", status)


async def _send_error(send, mapped) -> None:
    body = json.dumps(mapped.body).encode()
    await send({"type": "http.response.start", "status": mapped.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
