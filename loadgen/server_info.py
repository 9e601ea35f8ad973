"""What the load generator learns from the server before loading it: model, max_model_len, tokens per word."""

import re

import requests

from loadgen.client import describe_exception
from loadgen.prompts import WORDS
from loadgen.records import FailureKind

# llmserve's info metric, then vLLM's (whose cache_config_info carries no length; model_config may).
MAX_LEN_PATTERNS = (re.compile(r'llm_engine_info\{[^}]*max_model_len="(\d+)"'),
                    re.compile(r'vllm:\w+_info\{[^}]*max_model_len="(\d+)"'))
# vLLM's (and llmserve's) refusal names the prompt's token count: "(524 in the messages, 16 in the completion)"
PROMPT_TOKENS_IN_ERROR = re.compile(r"\((\d+) in the (?:messages|prompt)")
PROBE_WORDS = 32  # small enough for a tiny max_model_len even with a byte-level tokenizer


class ServerInfoError(Exception):
    """The server could not be asked; `kind` says how the failed request is counted."""

    def __init__(self, kind: FailureKind, message: str):
        super().__init__(message)
        self.kind = kind


def _get(url: str, headers: dict, timeout_s: float) -> requests.Response:
    try:
        resp = requests.get(url, headers=headers, timeout=timeout_s)
    except requests.exceptions.Timeout as exc:
        raise ServerInfoError(FailureKind.TIMEOUT, describe_exception(exc)) from exc
    except requests.exceptions.RequestException as exc:
        raise ServerInfoError(FailureKind.CONNECT_ERROR, describe_exception(exc)) from exc
    if resp.status_code != 200:
        raise ServerInfoError(FailureKind.HTTP_STATUS, f"GET {url} answered {resp.status_code}: {resp.text[:200]}")
    return resp


def list_models(host: str, headers: dict, timeout_s: float = 10.0) -> list[dict]:
    resp = _get(host.rstrip("/") + "/v1/models", headers, timeout_s)
    try:
        data = resp.json().get("data")
    except (ValueError, AttributeError) as exc:
        raise ServerInfoError(FailureKind.HTTP_STATUS, f"{host}/v1/models is not an OpenAI model list") from exc
    if not isinstance(data, list) or not data or not isinstance(data[0], dict) or "id" not in data[0]:
        raise ServerInfoError(FailureKind.HTTP_STATUS, f"{host}/v1/models lists no model; pass --model")
    return data


def discover_max_model_len(host: str, headers: dict, model: str, timeout_s: float = 10.0) -> int | None:
    """max_model_len from the model card (vLLM, llmserve), else from /metrics; None when neither says."""
    for card in list_models(host, headers, timeout_s):
        if card.get("id") == model and isinstance(card.get("max_model_len"), int):
            return card["max_model_len"]
    try:
        text = _get(host.rstrip("/") + "/metrics", headers, timeout_s).text
    except ServerInfoError:
        return None
    for pattern in MAX_LEN_PATTERNS:
        if match := pattern.search(text):
            return int(match.group(1))
    return None


def prompt_tokens_from_error(text: str | None) -> int | None:
    match = PROMPT_TOKENS_IN_ERROR.search(text or "")
    return int(match.group(1)) if match else None


def probe_tokens_per_word(host: str, path: str, headers: dict, model: str, chat: bool,
                          timeout_s: float = 60.0) -> float | None:
    """One short non-streamed request of known words: the server's usage gives tokens per word."""
    step = len(WORDS) // PROBE_WORDS  # spread over the vocabulary: word lengths as the generator uses them
    text = " ".join(WORDS[i * step] for i in range(PROBE_WORDS))
    body = {"model": model, "max_tokens": 1, "stream": False}
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    try:
        resp = requests.post(host.rstrip("/") + path, json=body, headers=headers, timeout=timeout_s)
        prompt_tokens = resp.json().get("usage", {}).get("prompt_tokens") if resp.status_code == 200 else None
    except (requests.exceptions.RequestException, ValueError, AttributeError):
        return None
    return prompt_tokens / PROBE_WORDS if isinstance(prompt_tokens, int) and prompt_tokens > 0 else None
