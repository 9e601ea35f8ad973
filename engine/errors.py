"""Typed engine errors: the server maps each to one HTTP status in one place."""


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class InvalidRequestError(EngineError):
    """A request the engine cannot take as given (HTTP 400)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class PromptTooLongError(InvalidRequestError):
    """Prompt plus max_tokens exceed max_model_len; the message names both numbers."""

    def __init__(self, num_prompt_tokens: int, max_tokens: int, max_model_len: int):
        self.num_prompt_tokens = num_prompt_tokens
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len
        super().__init__(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or completion.",
            param="messages",
        )


class QueueFullError(EngineError):
    """The waiting queue is at --max-queue-len (HTTP 429)."""


class EngineDeadError(EngineError):
    """The step loop died; nothing more will be served (HTTP 503)."""


class CapacityError(EngineError):
    """The KV budget cannot hold one sequence of max_model_len tokens: refuse to start."""


class ModelLoadError(EngineError):
    """A checkpoint folder that cannot be loaded (missing files, unsupported architecture)."""


class OutOfMemoryError(EngineError):
    """Weights alone exceed the memory budget at load time."""


class ConfigError(EngineError):
    """An engine setting that cannot work (bad dtype, max_model_len beyond the model's limit)."""


class FatalEngineError(EngineError):
    """The step loop cannot go on (an injected crash, a broken invariant): the engine is dead."""
