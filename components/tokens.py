"""How a token's text is shown: visible whitespace, short, HTML-safe when asked."""
from __future__ import annotations

import html


def visible(text: str, limit: int = 14) -> str:
    """Leading/trailing spaces as '␣', newlines as '↵', tabs as '→'; long tokens shortened."""
    shown = text.replace("\n", "↵").replace("\t", "→")
    if shown.startswith(" "):
        shown = "␣" + shown[1:]
    if shown.endswith(" ") and len(shown) > 1:
        shown = shown[:-1] + "␣"
    if shown == "":
        shown = "∅"
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def html_text(text: str) -> str:
    return html.escape(text).replace("\n", "<br>")
