"""The generated text, each token coloured by how it was committed, hover giving the step."""
from __future__ import annotations

from tr_core.trace import Step

from .tokens import html_text

LEGEND = ('<span class="tok tok-draft">accepted draft</span> '
          '<span class="tok tok-own">model\'s own token</span>')


def output_html(steps: list[Step], token_text, prompt_text: str = "") -> str:
    parts = [f'<div class="legend">{LEGEND}</div><div class="gen-text">']
    for step in steps:
        n = len(step.committed)
        for j, tok in enumerate(step.committed):
            is_own = j == n - 1 and step.accepted_drafts < n  # the last one is the model's own token
            cls = "tok-own" if is_own else "tok-draft"
            parity = "odd" if step.index % 2 else "even"
            title = f"step {step.index}: {'model' if is_own else 'draft accepted'} · id {tok}"
            parts.append(f'<span class="tok {cls} {parity}" title="{title}">{html_text(token_text(tok))}</span>')
    if not steps:
        parts.append('<span class="placeholder">The generated text appears here.</span>')
    parts.append("</div>")
    return "".join(parts)
