"""Prompts with controlled token lengths, ShareGPT datasets, and the per-profile message shapes.

The built-in generator writes common English words, about one token each in BPE vocabularies; the
real tokens-per-word ratio is learnt from the server's `usage.prompt_tokens` as answers come back,
so the prompt lengths converge on `--prompt-tokens` for whatever tokenizer the server uses.
"""

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one "
    "had by word but not what all were we when your can said there use an each which she do how their "
    "if will up other about out many then them these so some her would make like him into time has look "
    "two more write go see number no way could people my than first water been call who oil its now find "
    "long down day did get come made may part over new sound take only little work know place year live "
    "me back give most very after thing our just name good sentence man think say great where help "
    "through much before line right too mean old any same tell boy follow came want show also around "
    "form three small set put end does another well large must big even such because turn here why ask "
    "went men read need land different home us move try kind hand picture again change off play spell "
    "air away animal house point page letter mother answer found study still learn should world high"
).split()

SHARED_PREFIX_SEED = 20261129  # the same shared prefix in every process of a distributed run


class DatasetError(Exception):
    """A --dataset file that cannot be used; the message names the file and the problem."""


@dataclass(slots=True)
class Calibration:
    """Tokens per generated word, learnt from usage.prompt_tokens (chat template overhead included)."""

    tokens_per_word: float = 1.0
    num_samples: int = 0

    def words_for(self, num_tokens: int) -> int:
        return max(1, round(num_tokens / self.tokens_per_word))

    def observe(self, num_words: int, prompt_tokens: int | None) -> None:
        if not prompt_tokens or num_words <= 0:
            return
        ratio = prompt_tokens / num_words
        self.num_samples += 1
        weight = 1.0 / min(self.num_samples, 10)  # running mean, then a slow moving average
        self.tokens_per_word += weight * (ratio - self.tokens_per_word)


@dataclass(slots=True)
class Prompt:
    messages: list[dict]  # chat messages; completions join their contents
    max_tokens: int
    num_words: int  # words sent in total, for calibration (0: not generated, do not calibrate)


@dataclass(slots=True)
class Conversation:
    """Multi-turn state of one user: grows by one exchange per request."""

    messages: list[dict] = field(default_factory=list)
    num_turns: int = 0
    num_words: int = 0
    dataset_turns: list[str] = field(default_factory=list)
    output_tokens: int | None = None  # a dataset conversation's answer length


@dataclass(slots=True)
class DatasetEntry:
    turns: list[str]  # the human turns, in order
    output_tokens: int  # estimated from the first answer's length


def make_words(rng: random.Random, num_words: int) -> str:
    return " ".join(rng.choices(WORDS, k=num_words))


def shared_prefix_text(num_words: int) -> str:
    rng = random.Random(SHARED_PREFIX_SEED)
    return "You are a careful assistant. Reference notes follow. " + make_words(rng, num_words)


def messages_to_prompt(messages: list[dict]) -> str:
    """Completions endpoint: the conversation as one text."""
    return "\n\n".join(m["content"] for m in messages)


def load_sharegpt(path: str | Path) -> list[DatasetEntry]:
    """ShareGPT JSON: a list of {"conversations": [{"from": "human"|"gpt", "value": str}, ...]}."""
    path = Path(path)
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DatasetError(f"dataset {path}: cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise DatasetError(f"dataset {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"dataset {path}: not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    if not isinstance(data, list):
        raise DatasetError(f"dataset {path}: expected a JSON list of ShareGPT conversations, got {type(data).__name__}")
    entries = [entry for item in data if (entry := _entry(item)) is not None]
    if not entries:
        raise DatasetError(f"dataset {path}: no usable ShareGPT conversation (each needs "
                           '"conversations": [{"from": "human", "value": "..."}, ...])')
    return entries


def _entry(item: object) -> DatasetEntry | None:
    if not isinstance(item, dict) or not isinstance(item.get("conversations"), list):
        return None
    turns: list[str] = []
    answer_words: int | None = None
    for turn in item["conversations"]:
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            continue
        if turn.get("from") in ("human", "user") and turn["value"].strip():
            turns.append(turn["value"])
        elif turn.get("from") in ("gpt", "assistant", "chatgpt") and answer_words is None and turns:
            answer_words = len(turn["value"].split())
    if not turns:
        return None
    output_tokens = min(2048, max(4, round((answer_words or 96) * 1.3)))
    return DatasetEntry(turns=turns, output_tokens=output_tokens)


@dataclass(slots=True)
class PromptSettings:
    profile: str
    prompt_tokens: int
    output_tokens: int | None  # None: the built-in default, or each dataset entry's own length
    prefix_tokens: int
    num_turns: int
    dataset: list[DatasetEntry] | None = None
    default_output_tokens: int = 128
    prefix_text: str = ""  # shared-prefix / dynamic-prefix: fixed once per process, the same in every process


class PromptFactory:
    """Builds the next prompt of one user for the selected profile."""

    def __init__(self, settings: PromptSettings, calibration: Calibration, rng: random.Random):
        self.settings = settings
        self.calibration = calibration
        self.rng = rng
        self.user_tag = f"{rng.getrandbits(128):032x}"[:8]  # a uuid's hex, without making the UUID
        self.conversation = Conversation()

    def next_prompt(self) -> Prompt:
        profile = self.settings.profile
        if profile == "multi-turn":
            return self._next_turn()
        if self.settings.dataset:
            entry = self.rng.choice(self.settings.dataset)
            return Prompt([{"role": "user", "content": entry.turns[0]}], self._max_tokens(entry), 0)
        num_words = self.calibration.words_for(self.settings.prompt_tokens)
        # A random word first: no two prompts share a cacheable prefix unless the profile wants one.
        user = make_words(self.rng, num_words)
        if profile in ("shared-prefix", "dynamic-prefix"):
            prefix = self.settings.prefix_text or shared_prefix_text(self.calibration.words_for(self.settings.prefix_tokens))
            if profile == "dynamic-prefix":  # the anti-pattern: something unique before the shared text
                stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
                prefix = f"[{stamp}.{time.time_ns() % 10**9:09d}] user-{self.user_tag}. {prefix}"
            messages = [{"role": "system", "content": prefix}, {"role": "user", "content": user}]
            return Prompt(messages, self._max_tokens(None), 0)
        return Prompt([{"role": "user", "content": user}], self._max_tokens(None), num_words)

    def _max_tokens(self, entry: DatasetEntry | None) -> int:
        if self.settings.output_tokens is not None:
            return self.settings.output_tokens
        return entry.output_tokens if entry is not None else self.settings.default_output_tokens

    def _next_turn(self) -> Prompt:
        conv = self.conversation
        if conv.num_turns >= self.settings.num_turns:
            conv = self.conversation = Conversation()
        if self.settings.dataset:
            if conv.num_turns == 0:
                entry = self.rng.choice(self.settings.dataset)
                conv.dataset_turns = list(entry.turns)
                conv.output_tokens = entry.output_tokens
            text = conv.dataset_turns.pop(0) if conv.dataset_turns else make_words(self.rng, 16)
        else:
            words = self.calibration.words_for(self.settings.prompt_tokens)
            text = make_words(self.rng, words)
            conv.num_words += words
        conv.messages.append({"role": "user", "content": text})
        conv.num_turns += 1
        if self.settings.output_tokens is not None or conv.output_tokens is None:
            return Prompt(list(conv.messages), self._max_tokens(None), 0)
        return Prompt(list(conv.messages), conv.output_tokens, 0)

    def on_answer(self, text: str, ok: bool) -> None:
        """Multi-turn: the answer joins the history; a failed turn ends the conversation."""
        if self.settings.profile != "multi-turn":
            return
        if ok:
            self.conversation.messages.append({"role": "assistant", "content": text})
        else:
            self.conversation = Conversation()
