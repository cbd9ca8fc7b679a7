"""Grammars of guided (structured-output) requests, through xgrammar, on the host.

`GrammarBackend` (one per engine) holds xgrammar's view of the tokenizer and compiles a
`GuidedDecoding` into a grammar, cached by the constraint's canonical text. Each sequence gets its
own `GrammarMatcher` (`Request.matcher`); its state is a function of the committed output tokens
only, so preemption (recompute or swap) leaves it valid. Before a step the host fills the next-token
bitmask of every guided row (int32 [rows, ceil(vocab / 32)], bit t of word t // 32 set when token t
is allowed; EOS is allowed exactly when the grammar can end), and after the step the matcher
accepts each committed token. Under speculation the matcher also checks a round's drafts between
drafting and verification (`LLMEngine._check_drafts`: accept them, fill one mask per verify
position, roll back), so it again holds the committed tokens only. JSON (``json``, ``json_object``) is generated compact: xgrammar's
separators, no free whitespace between tokens (a model cannot pad its answer with blanks). A
constraint with ``after`` compiles as an xgrammar structural tag: any text through the first
``after``, then the constraint as a grammar element.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict

from ..errors import ConfigError, RequestError
from ..guided_decoding import GuidedDecoding

CACHE_GRAMMARS = 256  # compiled grammars kept (least recently used dropped first)
# xgrammar (0.2.9 and before) writes a JSON-schema string with minLength/maxLength as a repetition
# of this class, which admits raw control characters U+0000-U+001F; JSON forbids them (RFC 8259)
# and strict parsers (Python's json.loads) refuse them. Its other strings use the second class.
BOUNDED_STRING_CHAR, JSON_STRING_CHAR = r'[^\"\\\r\n]', r'[^\0-\x1f\"\\]'
_LOCATION = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")  # "[time] /path/file.cc:123: " before xgrammar's messages


def _xgrammar():
    try:
        import xgrammar
    except ImportError as exc:
        raise ConfigError("guided decoding needs the xgrammar package: pip install 'rlt[structured]'") from exc
    return xgrammar


def _message(exc: Exception) -> str:
    text = str(exc).strip()
    text = _LOCATION.sub("", text)
    return text.splitlines()[0] if text else type(exc).__name__


class GrammarBackend:
    """xgrammar's tokenizer info and compiler for one engine's vocabulary."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids):
        xgr = _xgrammar()
        self.xgr = xgr
        self.vocab_size = vocab_size
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer.hf_tokenizer, vocab_size=vocab_size,
                                                       stop_token_ids=list(eos_token_ids))
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1)
        self._cache: OrderedDict = OrderedDict()

    def compile(self, guided: GuidedDecoding):
        """The compiled grammar of `guided` (RequestError naming its origin for a bad schema,
        regex, grammar or structural tag)."""
        key = guided.cache_key()
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        kind, text, after = key
        c = self.compiler
        try:
            if after is not None:
                compiled = c.compile_structural_tag(json.dumps({"type": "structural_tag", "format": {
                    "type": "sequence", "elements": [
                        {"type": "tag", "begin": "", "content": {"type": "any_text"}, "end": after},
                        self._element(kind, text, guided)]}}))
            elif kind == "structural_tag":
                compiled = self._structural_tag(json.loads(text))
            else:
                compiled = c.compile_grammar(self._grammar(kind, text, guided))
        except Exception as exc:  # xgrammar raises RuntimeError / its own errors for bad input
            raise RequestError(f"{guided.origin}: invalid {kind.replace('_', ' ')}: {_message(exc)}") from None
        self._cache[key] = compiled
        if len(self._cache) > CACHE_GRAMMARS:
            self._cache.popitem(last=False)
        return compiled

    def _grammar(self, kind: str, text: str, guided: GuidedDecoding):
        """The xgrammar Grammar of a constraint other than a structural tag (JSON compact: no
        whitespace between tokens but the fixed separators)."""
        Grammar = self.xgr.Grammar
        if kind in ("json", "json_object"):
            grammar = Grammar.from_json_schema(text if kind == "json" else '{"type": "object"}', any_whitespace=False)
            ebnf = str(grammar)  # its length-bounded strings take JSON's characters only (see BOUNDED_STRING_CHAR)
            return Grammar.from_ebnf(ebnf.replace(BOUNDED_STRING_CHAR, JSON_STRING_CHAR)) \
                if BOUNDED_STRING_CHAR in ebnf else grammar
        if kind == "regex":
            return Grammar.from_regex(text)
        if kind == "choice":
            return Grammar.from_ebnf("root ::= " + " | ".join(json.dumps(x, ensure_ascii=False) for x in guided.choice))
        return Grammar.from_ebnf(text)

    def _element(self, kind: str, text: str, guided: GuidedDecoding) -> dict:
        """The constraint as an element of an xgrammar structural-tag format."""
        if kind == "structural_tag":
            tag = json.loads(text)
            if "format" in tag:
                return tag["format"]
            items = [self.xgr.StructuralTagItem(begin=t["begin"], schema=json.dumps(t.get("schema", {})), end=t["end"])
                     for t in tag["structures"]]
            return {"type": "grammar", "grammar": str(self.xgr.Grammar.from_structural_tag(items, list(tag["triggers"])))}
        return {"type": "grammar", "grammar": str(self._grammar(kind, text, guided))}

    def _structural_tag(self, tag: dict):
        """xgrammar's structural tag ({"type": "structural_tag", "format": ...}; the type may be left
        out), or vLLM's form ({"structures": [{"begin", "schema", "end"}], "triggers": [...]}), as
        `GuidedDecoding` checked it."""
        if "format" in tag:
            return self.compiler.compile_structural_tag(json.dumps({"type": "structural_tag", "format": tag["format"]}))
        items = [self.xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s.get("schema", {})), end=s["end"])
                 for s in tag["structures"]]
        return self.compiler.compile_structural_tag(items, list(tag["triggers"]))

    def matcher(self, compiled, stop_token_ids):
        """A fresh matcher at the start of the grammar; it ends on any of `stop_token_ids`. Its
        `fill_next_token_bitmask(bitmask, row)` writes the tokens it accepts next into row `row`
        of an int32 [rows, ceil(vocab / 32)] bitmask (`token_mask.new_bitmask`)."""
        return self.xgr.GrammarMatcher(compiled, override_stop_tokens=list(stop_token_ids))
