"""Tokenizers: the built-in byte tokenizer and a wrapper over a Hugging Face tokenizer.json."""

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Protocol

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.errors import InvalidRequestError, ModelLoadError


class Tokenizer(Protocol):
    eos_token_id: int | None
    bos_token_id: int | None
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def apply_chat_template(self, messages: list[dict]) -> str: ...

    def token_bytes(self, token_id: int) -> bytes: ...


class ChatTemplate:
    """A chat template rendered as Hugging Face's apply_chat_template does (sandboxed jinja2)."""

    def __init__(self, source: str, bos_token: str | None, eos_token: str | None):
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", GenerationTag]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ModelLoadError(f"chat template has a syntax error at line {exc.lineno}: {exc.message}") from exc
        self._bos_token, self._eos_token = bos_token, eos_token

    def render(self, messages: list[dict]) -> str:
        """The prompt text with the generation prompt; InvalidRequestError if the template refuses."""
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=True, tools=None, documents=None,
                bos_token=self._bos_token or "", eos_token=self._eos_token or "",
            )
        except jinja2.TemplateError as exc:
            raise InvalidRequestError(f"chat template: {exc}", param="messages") from exc


class GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (HF marks assistant tokens with it): renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


class TemplateRaised(jinja2.TemplateError):
    """`raise_exception(message)` called inside a chat template."""


def _raise_exception(message: str):
    raise TemplateRaised(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


BYTE_SPECIAL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>")
BYTE_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ByteTokenizer:
    """UTF-8 bytes are ids 0-255; special tokens follow at 256, 257, ... and are matched in text."""

    def __init__(self, special_tokens: tuple[str, ...] = BYTE_SPECIAL_TOKENS):
        self.special_tokens = special_tokens
        self.special_to_id = {tok: 256 + i for i, tok in enumerate(special_tokens)}
        self.vocab_size = 256 + len(special_tokens)
        self.bos_token_id = self.special_to_id["<|begin_of_text|>"]
        self.eos_token_id = self.special_to_id["<|end_of_text|>"]
        self._split = re.compile("(" + "|".join(re.escape(t) for t in special_tokens) + ")")
        self._template = ChatTemplate(BYTE_CHAT_TEMPLATE, "<|begin_of_text|>", "<|end_of_text|>")

    def encode(self, text: str) -> list[int]:
        check_encodable(text)
        ids: list[int] = []
        for piece in self._split.split(text):
            special = self.special_to_id.get(piece)
            if special is not None:
                ids.append(special)
            else:
                ids.extend(piece.encode("utf-8"))
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        out = bytearray()
        for i in ids:
            if i < 256:
                out.append(i)
            elif not skip_special_tokens and i < self.vocab_size:
                out.extend(self.special_tokens[i - 256].encode("utf-8"))
        return out.decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict]) -> str:
        return self._template.render(messages)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (a special token: its text)."""
        if token_id < 256:
            return bytes([token_id])
        return self.special_tokens[token_id - 256].encode("utf-8")


class HFTokenizer:
    """tokenizer.json through the `tokenizers` package, chat template from tokenizer_config.json."""

    def __init__(self, folder: Path, config_eos_token_id: int | None = None):
        from tokenizers import Tokenizer as RustTokenizer

        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"{folder}: no tokenizer.json (only fast tokenizers are supported)")
        try:
            self._tok = RustTokenizer.from_file(str(path))
        except Exception as exc:  # the Rust side raises a bare Exception
            raise ModelLoadError(f"{path}: cannot load tokenizer: {exc}") from exc
        tk_config = read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
        self.bos_token = _token_text(tk_config.get("bos_token"))
        self.eos_token = _token_text(tk_config.get("eos_token"))
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        eos_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        self.eos_token_id = eos_id if eos_id is not None else config_eos_token_id
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        source = _chat_template_source(folder, tk_config)
        self._template = ChatTemplate(source, self.bos_token, self.eos_token) if source else None

    def encode(self, text: str) -> list[int]:
        # A rendered chat template already starts with the bos text: do not add a second bos.
        add_special = not (self.bos_token and text.startswith(self.bos_token))
        check_encodable(text)
        return self._tok.encode(text, add_special_tokens=add_special).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for, as far as decoding it alone tells (a partial character reads
        as U+FFFD's bytes: tokenizers has no byte-level view of a piece)."""
        return self._tok.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def apply_chat_template(self, messages: list[dict]) -> str:
        if self._template is None:
            raise InvalidRequestError(
                "this model has no chat template (tokenizer_config.json has no chat_template); "
                "use the completions endpoint", param="messages",
            )
        return self._template.render(messages)


_SURROGATE = re.compile("[\ud800-\udfff]")


def check_encodable(text: str) -> None:
    """InvalidRequestError for text no tokenizer can encode: a lone UTF-16 surrogate is not Unicode text."""
    if _SURROGATE.search(text):
        raise InvalidRequestError("the prompt holds a lone UTF-16 surrogate, which is not valid Unicode text",
                                  param="prompt")


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path}: not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _token_text(token) -> str | None:
    """tokenizer_config.json writes a special token as a string or an AddedToken dict."""
    if isinstance(token, dict):
        return token.get("content")
    return token if isinstance(token, str) else None


def _chat_template_source(folder: Path, tk_config: dict) -> str | None:
    """The default template: chat_template.jinja, or tokenizer_config.json's string or named list."""
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    source = tk_config.get("chat_template")
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        return named.get("default")
    return source if isinstance(source, str) else None
