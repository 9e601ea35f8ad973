"""Typed errors of the game-day harness."""


class GamedayError(Exception):
    """Base class: a game day could not be set up or run (not a failed check)."""


class ProcessDiedError(GamedayError):
    """A supervised child exited while we waited for it."""


class ReadyTimeoutError(GamedayError):
    """A supervised child did not become ready in time."""


class DrillRuleError(GamedayError):
    """A shipped rule file could not be turned into a drill copy."""


class UnknownScenarioError(GamedayError):
    """No scenario has that name."""


class ToolMissingError(GamedayError):
    """A required program (nginx, prometheus, promtool, locust, llmserve) is not installed."""
