"""Validators for OpenAI's published response schemas (fixtures/openai-schemas.json)."""

import copy
import json
from functools import cache
from pathlib import Path

from jsonschema import Draft202012Validator

# A vendored subset of OpenAI's published OpenAPI spec: github.com/openai/openai-openapi, openapi.json
# (OpenAPI 3.1.0, spec version 2.3.0), the components.schemas reachable from CreateChatCompletionResponse,
# CreateChatCompletionStreamResponse, CreateCompletionResponse, ErrorResponse and ListModelsResponse.
# The file's own "source" key says the same; it is copied unchanged, so a newer spec can replace it.
SCHEMA_FILE = Path(__file__).resolve().parent / "fixtures" / "openai-schemas.json"


def _denullable(node):
    """OpenAPI 3.0 `nullable: true` → a JSON-Schema union with null."""
    if isinstance(node, list):
        return [_denullable(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _denullable(value) for key, value in node.items()}
    if node.pop("nullable", False):
        if "type" in node and isinstance(node["type"], str):
            node["type"] = [node["type"], "null"]
            if "enum" in node:
                node["enum"] = [*node["enum"], None]
        else:
            node = {"anyOf": [node, {"type": "null"}]}
    return node


@cache
def _components() -> dict:
    return _denullable(json.loads(SCHEMA_FILE.read_text()))["components"]


@cache
def validator(name: str, stream_completion: bool = False) -> Draft202012Validator:
    components = copy.deepcopy(_components())
    if stream_completion:
        # OpenAI's streamed completions send finish_reason null until the last chunk, but the spec
        # (shared by both modes) omits `nullable` there; allow exactly that and nothing else.
        choice = components["schemas"]["CreateCompletionResponse"]["properties"]["choices"]["items"]
        reason = choice["properties"]["finish_reason"]
        reason["type"], reason["enum"] = ["string", "null"], [*reason["enum"], None]
    root = {"$ref": f"#/components/schemas/{name}", "components": components}
    return Draft202012Validator(root)


def check(name: str, body: dict, stream_completion: bool = False) -> None:
    """Raise jsonschema.ValidationError when `body` does not match OpenAI's schema `name`."""
    validator(name, stream_completion).validate(body)
