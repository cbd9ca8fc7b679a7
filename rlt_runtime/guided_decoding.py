"""GuidedDecoding: the constraint a structured-output request's text must satisfy (validated).

Exactly one of:

* ``json``: a JSON schema (a dict, or its JSON text); the output is a JSON value it validates.
* ``json_object``: True; the output is any JSON object.
* ``regex``: a regular expression the whole output matches.
* ``choice``: a list of strings; the output is one of them.
* ``grammar``: an EBNF grammar (xgrammar's dialect, GBNF-like: ``root ::= ...``) the output derives.
* ``structural_tag`` (a dict or its JSON text): vLLM's form ``{"structures": [{"begin", "schema",
  "end"}, ...], "triggers": [...]}`` (free text in which each segment that opens with a trigger runs
  from a structure's ``begin`` through JSON its ``schema`` validates to its ``end``), or xgrammar's
  ``{"type": "structural_tag", "format": {...}}``. A ``"type": "structural_tag"`` key is allowed in
  both (the server passes `response_format` through as it came).

``after`` (optional, a non-empty string): the constraint starts after the first occurrence of this
text, and anything may come before it, as a thinking model's reasoning before ``</think>`` (the
server sets it to ``</think>`` when the answer starts inside the reasoning, as vLLM applies
structured output only once the reasoning has ended).

``origin`` names the request field the
constraint came from in error messages (the server sets "response_format", "guided_json", ...).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional, Union

from .errors import ConfigError

KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")


@dataclass(frozen=True)
class GuidedDecoding:
    json: Optional[Union[dict, str]] = None
    json_object: bool = False
    regex: Optional[str] = None
    choice: Optional[list[str]] = None
    grammar: Optional[str] = None
    structural_tag: Optional[Union[dict, str]] = None
    after: Optional[str] = None
    origin: str = field(default="guided", compare=False)

    def __post_init__(self):
        o = self.origin
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ConfigError(f"{o} must set exactly one of {', '.join(KINDS)}, got {given or 'none'}")
        if not isinstance(self.json_object, bool):
            raise ConfigError(f"{o}.json_object must be a boolean, got {self.json_object!r}")
        for name in ("json", "structural_tag"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except ValueError as exc:
                    raise ConfigError(f"{o}: the {name} text is not valid JSON ({exc})") from None
            if not isinstance(value, dict):
                raise ConfigError(f"{o}: {name} must be a JSON object (a dict or its JSON text), got {value!r}")
            if name == "structural_tag":
                _check_structural_tag(o, value)
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value):
                raise ConfigError(f"{o}: {name} must be a non-empty string, got {value!r}")
        if self.after is not None and not (isinstance(self.after, str) and self.after):
            raise ConfigError(f"{o}: after must be a non-empty string or None, got {self.after!r}")
        if self.choice is not None:
            ok = isinstance(self.choice, (list, tuple)) and self.choice and all(isinstance(c, str) and c for c in self.choice)
            if not ok:
                raise ConfigError(f"{o}: choice must be a non-empty list of non-empty strings, got {self.choice!r}")
            object.__setattr__(self, "choice", list(self.choice))

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    def cache_key(self) -> tuple:
        """A hashable key of the constraint (its kind and its JSON text): equal keys compile alike.
        Key order is kept: a schema's property order is the order the output writes them in."""
        value = getattr(self, self.kind)
        if isinstance(value, (dict, list, bool)):
            value = json.dumps(value, separators=(",", ":"))
        return self.kind, value, self.after

    @staticmethod
    def from_value(value) -> "GuidedDecoding":
        """A GuidedDecoding from itself or a dict of its fields (ConfigError naming `guided`)."""
        if isinstance(value, GuidedDecoding):
            return value
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(KINDS) - {"origin", "after"})
            if unknown:
                raise ConfigError(f"guided has unknown keys {unknown}; allowed: {', '.join(KINDS)}")
            return GuidedDecoding(**value)
        raise ConfigError(f"guided must be None, a GuidedDecoding or a dict with one of {', '.join(KINDS)}, "
                          f"got {type(value).__name__}")


def _check_structural_tag(origin: str, tag: dict) -> None:
    """A structural tag's shape (ConfigError naming `origin`): vLLM's structures and triggers, or
    xgrammar's format. xgrammar checks the rest (a begin without its trigger, a bad schema) when
    it compiles the tag."""
    if tag.get("type", "structural_tag") != "structural_tag":
        raise ConfigError(f"{origin}: a structural tag's type must be 'structural_tag', got {tag.get('type')!r}")
    if "format" in tag:
        extra = sorted(set(tag) - {"type", "format"})
        if extra or not isinstance(tag["format"], dict):
            raise ConfigError(f"{origin}: xgrammar's structural tag is {{'type': 'structural_tag', 'format': {{...}}}}"
                              f"{f', got the extra keys {extra}' if extra else ', with format an object'}")
        return
    extra = sorted(set(tag) - {"type", "structures", "triggers"})
    if "structures" not in tag or "triggers" not in tag or extra:
        raise ConfigError(f"{origin}: a structural tag needs 'structures' and 'triggers' (vLLM's form) or 'format' "
                          f"(xgrammar's), got the keys {sorted(tag)}")
    structures, triggers = tag["structures"], tag["triggers"]
    if not isinstance(structures, list) or not structures or not all(_structure_ok(s) for s in structures):
        raise ConfigError(f"{origin}: structural tag structures must be a non-empty list of {{'begin', 'schema', "
                          f"'end'}} objects (begin a non-empty string, end a string, schema a JSON schema object), "
                          f"got {structures!r}")
    if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) and t for t in triggers):
        raise ConfigError(f"{origin}: structural tag triggers must be a non-empty list of non-empty strings, "
                          f"got {triggers!r}")


def _structure_ok(s) -> bool:
    return (isinstance(s, dict) and set(s) <= {"begin", "schema", "end"} and isinstance(s.get("begin"), str)
            and bool(s["begin"]) and isinstance(s.get("end"), str) and isinstance(s.get("schema", {}), dict))

