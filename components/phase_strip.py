"""One line per phase (retrieve → verify → accept → recycle) with this step's numbers."""
from __future__ import annotations

import html

from tr_core.trace import Step

from .tokens import visible


LATER = ("Steps whose drafts miss can cost more than greedy's: every draft token costs forward time (more on a "
         "CPU). Where drafts keep missing, the planner shrinks the tree.")
MISSED = "Steps that miss, most often early ones, cost more than greedy's: draft tokens cost forward time."
EARLY = ("The matrix is still mostly empty here: a third or more of this tree would come from rows never "
         "written (∅), so few drafts can hit yet, and every draft token costs forward time (big trees cost more "
         "on a CPU): such steps can be slower than greedy.")


def _positions(n: int) -> str:
    return f"all {n} positions" if n != 1 else "its one position"


def hit_words(step: Step) -> str:
    """A step whose drafts hit, in words: what it committed for its one forward pass."""
    n = len(step.committed)
    return (f"<b>This step's drafts hit:</b> {n} tokens from one forward pass, where greedy needs {n} passes. "
            if step.accepted_drafts and n > 1 else "")


def phase_html(step: Step | None, token_text, frame: int = 0, method: str = "tr") -> str:
    """``frame``: 0 the whole step, 1-4 the phase Teach mode is showing (highlighted); ``method``: the
    method described before any step."""
    body = BEFORE_ANY_STEP.get(method, BEFORE_ANY_STEP["tr"]) if step is None else _phase_body(step, token_text, frame)
    return _with_frame(body, frame, step)


BEFORE_ANY_STEP = {
    "tr": ('<div class="phases"><b>Token Recycling</b> keeps, for every token, the k tokens (8 by default) the '
           'model last ranked highest after it. Each step it drafts a tree from that table, checks the whole tree in one '
           'forward pass, keeps the longest correct branch, and writes every new candidate back into the '
           'table.</div>'),
    "ptd": ('<div class="phases"><b>Progressive Tree Drafting</b> keeps a draft tree that rides along in each '
            'forward pass and grows by the model\'s own next tokens; its paths go into tries of n-grams. Each step '
            'takes the candidates the tries hold for the last token, checks them in that same forward pass, and '
            'keeps the longest correct one. It keeps no matrix.</div>'),
}


def _with_frame(body: str, frame: int, step: Step | None) -> str:
    if frame:
        body = body.replace(f'<div class="ph-cell"><span class="ph">{frame}.',
                            f'<div class="ph-cell ph-now"><span class="ph">{frame}.')
    if step is not None and step.method == "tr":
        hit = hit_words(step) if frame in (0, 3, 4) else ""  # Teach mode: not before the accept frame
        why = MISSED if step.accepted_drafts else EARLY if _early(step) else LATER  # a hit: no "early" words
        last = "<b>Last phase of this step:</b> Phase ▶ goes on to the next step. " if frame == 4 else ""
        pairs = PAIR_WORDS if "pair" in (step.tree.sources or []) else ""  # where a phase names them
        body += f'<div class="ph-note">{last}{hit}{why}{pairs}</div>'
    return f'<div class="phases-wrap" role="region" aria-label="What this step did">{body}</div>'


def planned_nothing(step: Step) -> bool:
    """Whether TR's planner drafted nothing this step: no node at all, none of them left out as blank
    (a fixed tree drafts its whole shape, or leaves places out where rows were never written)."""
    return step.method == "tr" and step.tree.size == 0 and not _blank_count(step)


NOTHING_PLANNED = ("nothing was drafted this step: the auto tree's planner weighs how often drafts have hit "
                   "against what each extra token costs in the forward pass, and judged no draft worth it (it "
                   "plans again at every step; Settings → Draft tree: a preset such as paper-80 drafts its whole "
                   "shape every step)")


def _blank_count(step: Step) -> int:
    """Drafts that came, or would have come, from rows never written: left out of the forward
    (``Step.blank_drafts``), or, in run files from before that, drafted as ∅."""
    return step.blank_drafts + sum(1 for s in step.tree.sources if s == "empty")


def _early(step: Step) -> bool:
    """Whether the matrix is still mostly empty for this step (a third or more of its drafts blank):
    a hot start's first steps are not."""
    return _blank_count(step) * 3 >= max(step.tree.size + step.blank_drafts, 1)


def _phase_body(step: Step | None, token_text, frame: int = 0) -> str:
    t = step.tree
    ms = {k: v * 1000 for k, v in step.timings.items()}
    root = html.escape(visible(token_text(t.tokens[0]), 20))
    acc = step.accepted_drafts
    own = html.escape(visible(token_text(step.model_choices[step.accepted_path[-1]]), 20))
    if step.method == "greedy":
        return (f'<div class="phases"><span class="ph">forward</span> greedy decoding ran one token '
                f'({root}) through the model in {ms.get("forward", 0):.0f} ms and took its top choice, {own}.</div>')
    if step.method == "ptd":
        return _ptd_cells(step, root, own, ms, acc, frame)
    looked = sum(1 for src in t.sources if src == "lookup")
    from_matrix = t.size - looked
    paired = sum(1 for src in t.sources if src == "pair")
    extra = (f" A further {looked} came from repeating what followed the same words earlier in the text "
             f"(prompt lookup)." if looked else "")
    retrieve = (f"From the last token <b class='tokname'>{root}</b>, {NOTHING_PLANNED} "
                f"({ms.get('retrieve', 0):.1f} ms)."
                if planned_nothing(step) else
                f"From the last token <b class='tokname'>{root}</b>, {from_matrix} draft token{'s' * (from_matrix != 1)} "
                f"{'were' if from_matrix != 1 else 'was'} read out of the matrix"
                f"{f' ({paired} via pair rows)' if paired else ''}, "
                f"branch by branch{_blank(step)} ({ms.get('retrieve', 0):.1f} ms).{extra}")
    cells = [
        ("retrieve", retrieve),
        ("verify", (f"One forward pass of {step.forward_tokens} tokens checked every branch at once, each token "
                    f"seeing only its ancestors ({ms.get('forward', 0):.0f} ms)." if step.forward_tokens > 1 else
                    f"One forward pass of the last token alone: nothing was drafted to check "
                    f"({ms.get('forward', 0):.0f} ms).")),
        ("accept", f"The longest branch matching the model's own choices had <b>{acc}</b> token{'s' * (acc != 1)}; "
                   + _committed_words(step, own)),
        ("recycle", f"The candidates the model produced at {_positions(step.forward_tokens)}, accepted or not, "
                    f"were written into {len(step.rows_written)} matrix row{'s' * (len(step.rows_written) != 1)}"
                    f"{_one_row_each(step)}{' and into pair rows' if paired else ''}"
                    f" ({ms.get('update', 0):.1f} ms)."),
    ]
    return _cells(cells, frame)


def _committed_words(step: Step, own: str) -> str:
    """What the accept phase committed: the accepted drafts and the model's own token, or, where the text
    ended within the drafts (its end or the token budget), the drafts up to there."""
    k, acc = len(step.committed), step.accepted_drafts
    if k > acc:
        return (f"the model added <b class='tokname'>{own}</b> itself, so this step committed <b>{k}</b> "
                f"({acc} from the draft + {k - acc} of its own).")
    if k == acc:
        return (f"the text ended with it (end of text or the token budget), so this step committed <b>{k}</b>, "
                "all from the draft.")
    return f"the text ended within it (end of text or the token budget), so this step committed its first <b>{k}</b>."


# what a pair row is (tr_core.pairs), said wherever a phase names them
PAIR_WORDS = (' <span class="term"><b>Pair rows</b>: rows kept for a pair (previous token, token), so "of the" '
              'and "in the" draft apart; a node whose pair was seen before drafts its children from the pair row, '
              'else from its token\'s row.</span>')


def _one_row_each(step: Step) -> str:
    """Why fewer rows than positions: one row per distinct token (a token at two positions writes one row)."""
    rows = len(step.rows_written)
    if step.forward_tokens <= rows:
        return ""
    return (f", one per distinct token (the {step.forward_tokens} positions held {rows} different tokens: "
            "a token at several positions writes one row)")


def _blank(step: Step) -> str:
    empty = sum(1 for s in step.tree.sources if s == "empty")
    if empty:
        return f"; {empty} of them from empty rows (∅, never written)"
    if step.blank_drafts:
        n = step.blank_drafts
        return (f"; {n} more of the tree's place{'s were' if n != 1 else ' was'} left out: {'they' if n != 1 else 'it'} "
                "would have come from rows never written (∅), which hold no prediction yet")
    return ""


def _cells(cells: list[tuple[str, str]], frame: int = 0) -> str:
    """Teach mode (``frame`` 1-4) tells no phase before its frame: a class guesses what comes next."""
    body = "".join(f'<div class="ph-cell"><span class="ph">{i + 1}. {name}</span> '
                   f'{text if not frame or i < frame else "<i class=ph-later>… Phase ▶ shows it.</i>"}</div>'
                   for i, (name, text) in enumerate(cells))
    return f'<div class="phases">{body}</div>'


def _ptd_cells(step: Step, root: str, own: str, ms: dict, acc: int, frame: int = 0) -> str:
    """Progressive Tree Drafting's phases: retrieve a trie, verify with the draft riding along, expand."""
    d = step.draft_tree
    fate = {k: sum(1 for s in (d.sources[1:] if d else []) if s == k) for k in ("new", "pruned")}
    riding = step.forward_tokens - len(step.tree.tokens)
    return _cells([
        ("retrieve", f"The candidate trie for the last token <b class='tokname'>{root}</b> gave {step.tree.size} "
                     f"draft tokens: "
                     f"n-grams harvested earlier from the draft tree's predictions (and, where extra tokens cost, "
                     f"from the prompt and the text so far) ({ms.get('retrieve', 0):.1f} ms)."),
        ("verify", f"One forward pass of {step.forward_tokens} tokens checked the candidates and, in the same "
                   f"pass, ran the {riding} nodes of the evolving draft tree ({ms.get('forward', 0):.0f} ms)."),
        ("accept", f"The longest candidate path matching the model's choices had <b>{acc}</b> token"
                   f"{'s' * (acc != 1)}; " + _committed_words(step, own)),
        ("expand", f"Every draft node gained the model's next token as a child ({fate['new']} new nodes, shown in "
                   f"the draft-tree tab); {fate['pruned']} were pruned by depth stepping or the root window, and the "
                   f"new paths went into the tries ({ms.get('expand', 0):.1f} ms)."),
    ], frame)
