"""The errors a user sees: each message is one line, which the command line prints and exits 2 on, and the
server answers with a 4xx. Everything else is a bug."""
from __future__ import annotations

from collections.abc import Callable


class ConfigError(ValueError):
    """A user-facing configuration error: the CLI prints it as one line and exits 2."""


class OptionError(ConfigError):
    """A wrong or useless option. The message names options as `{name}` fields holding the library's keyword
    and config field names; `spelled` renders them for a caller that names them otherwise (the command line
    spells them as flags, cli/args.flag), so the library never speaks of flags."""

    def __init__(self, template: str, *options: str):
        self.template, self.options = template, options
        super().__init__(self.spelled(lambda name: name))

    def spelled(self, spell: Callable[[str], str]) -> str:
        return self.template.format_map({name: spell(name) for name in self.options})


class StructureError(ConfigError):
    """A structure (JSON schema, regex, choice, grammar) this model cannot follow: it breaks a limit of the grammar
    engine, or needs text the model's tokenizer cannot produce. Found when it is checked (a 400 naming the field),
    or while generating (that request's 4xx error event; the others go on)."""


class ModelError(ValueError):
    """The model could not be found or loaded; the message is one line for the user."""


def first_line(error: object, empty: str | None = None) -> str:
    """An error's message as one line for the user: its first line, or all its lines joined when the first ends in
    a colon, which introduces the rest (transformers' "Couldn't instantiate the backend tokenizer from one of:" then
    a list, which the first line alone cut off); with no message, `empty` (default: the error's type)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if not lines:
        return empty or type(error).__name__
    return " ".join(lines) if lines[0].endswith(":") else lines[0]
