"""How a token's text is shown: visible whitespace, short, HTML-safe when asked.

A token with nothing to see on its own ("_", " ", "\\n", "  "; ``blank_like``) is drawn with signs wherever
tokens are drawn: ␣ a space, ↵ a new line, → a tab, ⍽ a no-break space, and an underscore-only token in
‹ › (the plots) or in a box (the text)."""
from __future__ import annotations

import html

SIGNS = {"\n": "↵", "\t": "→", "\xa0": "⍽", " ": "␣"}


def blank_like(text: str) -> bool:
    """Only whitespace, control characters and underscores: a token that is (nearly) invisible as it is."""
    return bool(text) and all(c.isspace() or c == "_" or ord(c) < 32 for c in text)


def _sign(c: str) -> str:
    """A whitespace or control character as a visible sign (control pictures for the rest of ASCII's)."""
    if c in SIGNS:
        return SIGNS[c]
    return chr(0x2400 + ord(c)) if ord(c) < 32 else ("␣" if c.isspace() else c)


def _signed(text: str) -> str:
    """``text`` with new lines, tabs and control characters as signs ("\\r\\n" is one new line)."""
    text = text.replace("\r\n", "\n")
    return "".join(_sign(c) if c != " " else c for c in text)


def visible(text: str, limit: int = 14) -> str:
    """Plain text for the plots: leading/trailing spaces as '␣' (every space of a blank-like token), new lines
    as '↵', tabs as '→'; an underscore-only token in ‹ ›; long tokens shortened."""
    shown = _signed(text)
    if blank_like(text):
        shown = shown.replace(" ", "␣")
        if set(shown) == {"_"}:
            shown = f"‹{shown}›"
    if shown.startswith(" "):
        shown = "␣" + shown[1:]
    if shown.endswith(" ") and len(shown) > 1:
        shown = shown[:-1] + "␣"
    if shown == "":
        shown = "∅"
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def html_text(text: str) -> str:
    return html.escape(text).replace("\n", "<br>")


def token_html(text: str) -> str:
    """A token of the generated text as HTML: as it reads, except a blank-like token, whose signs are shown
    (each ↵ still breaks the line) in a span of class ``signs``."""
    if not blank_like(text):
        return html_text(text)
    return f'<span class="signs">{html.escape(_signed(text).replace(" ", "␣")).replace("↵", "↵<br>")}</span>'
