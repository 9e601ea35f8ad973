"""The FastAPI app: routes, the exception handlers that call the one mapping, auth, lifespan."""

import traceback
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.errors import EngineError
from engine.server import protocol as p
from engine.server.builder import package_version
from engine.server.errors import APIError, BadRequest, NotFound, map_exception
from engine.server.middleware import ObservedASGI
from engine.server.serving import CHAT, COMPLETION, admit, complete
from engine.server.state import ServerState
from engine.server.streaming import stream

ERROR_RESPONSES = {
    status: {"description": desc, "content": {"application/json": {"schema": {
        "$ref": "#/components/schemas/ErrorResponse"}}}}
    for status, desc in ((400, "Invalid request"), (401, "Missing or wrong API key"), (404, "Unknown model"),
                         (413, "Body too large"), (429, "Waiting queue full"), (503, "Not ready"),
                         (500, "Internal error"))
}


def _error_response(request: Request, exc: BaseException) -> JSONResponse:
    state: ServerState = request.app.state.llm
    mapped = map_exception(exc)
    if mapped.reject_reason is not None:
        if state.metrics is not None:
            state.metrics.reject(mapped.reject_reason)
        state.log.emit("request.rejected", "warning", getattr(request.state, "request_id", None),
                       reason=mapped.reject_reason, message=mapped.body["error"]["message"])
    elif mapped.status >= 500 and not isinstance(exc, APIError):
        state.log.emit("engine.error", "error", getattr(request.state, "request_id", None), phase="request",
                       exc_type=type(exc).__name__, message=str(exc), traceback=_tb(exc),
                       request_ids=[], fatal=False)
    return JSONResponse(mapped.body, status_code=mapped.status, headers=mapped.headers)


def _tb(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    if not errors or errors[0].get("type") == "json_invalid":
        return _error_response(request, BadRequest("The request body is not valid JSON.", None))
    # A value failing every member of a union (`stop`: str or list) gives one error per member:
    # the deepest says most (the list member's bad item rather than "not a string").
    first = max(errors, key=lambda e: len(_field_path(e.get("loc", ()))))
    param = ".".join(_field_path(first.get("loc", ()))) or None
    message = f"{param or 'body'}: {_problem(first)}"
    return _error_response(request, BadRequest(message, param))


def _field_path(loc) -> list[str]:
    """The error's location as field names and list indices; union member tags (`str`, `list[str]`) dropped."""
    return [str(part) for part in loc if isinstance(part, int) or part in p.FIELD_NAMES]


def _problem(error: dict) -> str:
    """pydantic's message, except for NaN and infinity, which it calls "not finite" or out of range."""
    value = error.get("input")
    if isinstance(value, float) and value != value:
        return "NaN is not a number"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return f"{value} is not a finite number"
    return error.get("msg", "invalid value")


def create_app(state: ServerState):
    """The ASGI app: FastAPI routes wrapped in the access-log / body-limit middleware."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield

    app = FastAPI(title="llmserve", version=package_version(), lifespan=lifespan,
                  docs_url=None, redoc_url=None)
    app.state.llm = state
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_exception)
    app.add_exception_handler(APIError, _error_response)
    app.add_exception_handler(EngineError, _error_response)
    # Anything else: a generic 500 (starlette then re-raises; ObservedASGI swallows it, logged here).
    app.add_exception_handler(Exception, _error_response)

    @app.post("/v1/chat/completions", responses=ERROR_RESPONSES)
    async def chat_completions(body: p.ChatCompletionRequest, request: Request):
        return await _serve(state, request, body, CHAT)

    @app.post("/v1/completions", responses=ERROR_RESPONSES)
    async def completions(body: p.CompletionRequest, request: Request):
        return await _serve(state, request, body, COMPLETION)

    @app.get("/v1/models")
    async def models():
        return p.model_list(state.model_name, state.created)

    @app.get("/health")
    async def health():
        return PlainTextResponse("ok\n")

    @app.get("/ready")
    async def ready():
        if state.is_ready():
            return PlainTextResponse("ready\n")
        return PlainTextResponse("not ready\n", status_code=503)

    @app.get("/metrics")
    async def metrics():
        if state.metrics is None:
            return PlainTextResponse("", media_type=CONTENT_TYPE_LATEST)
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    _add_error_schema(app)
    return ObservedASGI(app, state)


async def _serve(state: ServerState, request: Request, body, operation: str):
    job = admit(state, request, body, operation)
    return await stream(state, job) if job.stream else await complete(state, request, job)


def _http_exception(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 404:
        return _error_response(request, NotFound(f"No route for {request.method} {request.url.path}."))
    error = APIError(str(exc.detail))
    error.status, error.type = exc.status_code, "invalid_request_error"
    mapped = map_exception(error)
    return JSONResponse(mapped.body, status_code=exc.status_code)


def _add_error_schema(app: FastAPI) -> None:
    """Put OpenAI's ErrorResponse into /openapi.json so clients and schemathesis can check errors."""
    original = app.openapi

    def openapi():
        if app.openapi_schema is None:
            schema = original()
            schemas = schema.setdefault("components", {}).setdefault("schemas", {})
            nullable_str = {"anyOf": [{"type": "string"}, {"type": "null"}]}
            schemas["Error"] = {"type": "object", "required": ["type", "message", "param", "code"],
                                "properties": {"code": nullable_str, "message": {"type": "string"},
                                               "param": nullable_str, "type": {"type": "string"}}}
            schemas["ErrorResponse"] = {"type": "object", "required": ["error"],
                                        "properties": {"error": {"$ref": "#/components/schemas/Error"}}}
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    operation.get("responses", {}).pop("422", None)  # validation errors are 400 here
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
