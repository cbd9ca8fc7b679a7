"""`--chat-template`: a Jinja chat template, given as a file path or inline, that replaces the
checkpoint's own (rendered by transformers like the checkpoint's template)."""

from __future__ import annotations

import os

from ...errors import ConfigError


def load_chat_template(value: str) -> str:
    """The template text of `--chat-template`: the contents of the file `value` names, else `value`
    itself when it reads as a Jinja template (holds `{{` or `{%`); anything else is a ConfigError."""
    path = os.path.expanduser(value)
    if os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"chat_template: cannot read {value!r}: {exc}") from None
    if "{{" in value or "{%" in value:
        return value
    raise ConfigError(f"chat_template must be a file holding a Jinja template or an inline template (with '{{{{' "
                      f"or '{{%'); {value!r} is neither")


def check_chat_template(template: str) -> None:
    """ConfigError naming chat_template unless `template` compiles as transformers compiles templates."""
    from jinja2 import TemplateError
    from transformers.utils.chat_template_utils import _compile_jinja_template

    if not isinstance(template, str) or not template.strip():
        raise ConfigError(f"chat_template must be a non-empty Jinja template string, got {template!r}")
    try:
        _compile_jinja_template(template)
    except TemplateError as exc:
        line = getattr(exc, "lineno", None)
        where = f" (line {line})" if line else ""
        raise ConfigError(f"chat_template is not a valid Jinja template{where}: {exc}") from None
