"""The web UI's start form, checked before Locust starts a run: a bad value is refused in the answer.

Locust's /swarm handler copies the form's fields into the parsed options and answers
`"success": true` whatever they hold; a profile that is no load profile would then start a run
that sends nothing. A Flask `before_request` hook on Locust's app reads the same fields first, as
Locust will convert them, and answers `{"success": false, "message": ...}` naming the bad field.
"""

from functools import cache
from types import SimpleNamespace

from flask import jsonify, request
from locust.argument_parser import default_args_dict

from loadgen.options import ConfigError, config_from_options


@cache
def _locust_options() -> frozenset[str]:
    return frozenset(default_args_dict())


def form_options(parsed_options, form) -> SimpleNamespace:
    """The options a run started from `form` will have: the load generator's own fields converted as
    Locust will (by the current value's type); Locust checks its own fields itself."""
    values = dict(vars(parsed_options))
    for key, text in form.items():
        if key == "profile":  # Locust's free-text field: the load profile when no list choice is made
            values["profile"] = text
            continue
        if key not in values or key in _locust_options():
            continue
        dest = key
        current = values[dest]
        if isinstance(current, bool):
            values[dest] = text == "true"
        elif current is None or isinstance(current, str):
            values[dest] = text
        elif isinstance(current, int | float):
            try:
                values[dest] = type(current)(text)
            except ValueError:
                raise ConfigError(f"--{dest.replace('_', '-')} must be a number, got {text!r}") from None
    return SimpleNamespace(**values)


def install(environment) -> None:
    """Check every POST /swarm of this process's web UI (master or single process)."""
    app = environment.web_ui.app

    @app.before_request
    def _check_swarm():
        if request.method != "POST" or not request.path.rstrip("/").endswith("/swarm"):
            return None
        try:
            config_from_options(form_options(environment.parsed_options, request.form))
        except ConfigError as exc:
            return jsonify({"success": False, "message": f"loadgen: {exc}", "host": environment.host})
        return None
