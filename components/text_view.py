"""The generated text, each token coloured by how it was committed; click a token to open its step."""
from __future__ import annotations

import html

from tr_core.trace import Step

from .tokens import html_text, token_html

LEGEND = ('<span class="tok tok-draft">accepted draft</span> '
          '<span class="tok tok-own">model\'s own token</span> '
          '<span class="tok tok-end">end</span> end of turn · '
          '<span class="tok tok-now">this step</span> <span class="tok tok-later">later steps</span> · '
          'click a token: its step')


def output_html(steps: list[Step], token_text, special: set[int] = frozenset(), current: int | None = None,
                mark: int | None = None, prompt_ids: list[int] | None = None) -> str:
    """``current``: the step shown (its tokens outlined, later ones dimmed); ``mark``: one output position to flag
    (e.g. where two precisions first part); ``prompt_ids``: the prompt as the model reads it (template
    included), shown folded: prompt lookup may copy from parts the visitor never typed."""
    parts = [f'<div class="legend">{LEGEND}</div>']
    if prompt_ids:
        read = html.escape("".join(token_text(t) for t in prompt_ids))
        parts.append('<details class="model-reads"><summary>What the model reads: your prompt in its chat '
                     'template</summary><p>Drafts copied from the context can come from its words.</p>'
                     f'<pre>{read}</pre></details>')
    parts.append('<div class="gen-text"><div role="list">')  # the inner box: scrolled to its end (style.css)
    pos = 0
    for step in steps:
        n = len(step.committed)
        for j, tok in enumerate(step.committed):
            is_own = j == n - 1 and step.accepted_drafts < n  # the last one is the model's own token
            cls = ["tok", "tok-own" if is_own else "tok-draft", "odd" if step.index % 2 else "even"]
            if step.index == current:
                cls.append("tok-now")
            elif current is not None and step.index > current:
                cls.append("tok-later")  # after the step shown: dimmed, still clickable
            if pos == mark:
                cls.append("tok-mark")
            title = f"step {step.index}: {'model' if is_own else 'draft accepted'} · id {tok}"
            if tok in special:
                cls.append("tok-end")
                body = f"end {html_text(token_text(tok))}"
            else:
                body = token_html(token_text(tok))
            parts.append(f'<span class="{" ".join(cls)}" data-step="{step.index}" data-pos="{pos}" '
                         f'title="{title}" role="listitem">{body}</span>')
            pos += 1
    if not steps:
        parts.append('<span class="placeholder">The generated text appears here.</span>')
    parts.append("</div></div>")
    return "".join(parts)
