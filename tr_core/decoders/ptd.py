"""Progressive Tree Drafting (arXiv 2607.10661): the model drafts for itself inside the forward
that verifies.

Each step, in phases:
  1. retrieve  - the candidate trie keyed by the last committed token (``tr_core.progressive``) becomes
     the verified tree under the root (where extra tokens cost: only the candidates that pay,
     ``PTDPlanner``); the draft tree rides along behind it in the same input (where extra tokens
     cost: as many of its nodes as pay for themselves, at least ``min_draft``)
  2. forward   - one forward: candidates see the cache, the root and their ancestors; draft
     nodes see the cache and their own ancestors
  3. verify    - the longest candidate path equal to the model's argmax, plus the model's token,
     exactly as Token Recycling does (so the output is plain greedy's)
  4. expand    - every draft node gains the model's argmax as a child; new paths are harvested
     into the tries; stepping and the root window prune
  5. prune     - keep only the accepted path's KV entries (the draft nodes' entries go too)
  6. harvest   - (``harvest_context``, the CPU default) the n-grams ending at each committed token go
     into the tries too, as the prompt's did at the start: the verified text is the model's own
     prediction on the live context, and where few draft nodes can ride along it is most of what
     the tries get
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..cost import cost_curve_for
from ..models import LoadedModel
from ..progressive import Candidates, CandidateTries, DraftForest, FlatForest, PTDConfig, PTDPlanner, candidate_keys
from ..sampling import SamplingConfig
from ..trace import DraftTree, Step
from ..trees import TreeTensors
from .base import ForwardRequest, PhaseClock
from .tree_step import StepState, TreeDecoder


@dataclass
class ProgressiveState(StepState):
    """A PTD step: the verified candidates (``cand``) and the draft tree riding behind them
    (``flat``, in BFS order); ``grown``: the draft tree after expansion, as the record draws it."""

    root: int = 0
    cand: Candidates | None = None
    flat: FlatForest | None = None
    grown: DraftTree | None = None


class ProgressiveTreeDecoder(TreeDecoder):
    method = "ptd"

    def __init__(self, lm: LoadedModel, max_new_tokens: int = 128, config: PTDConfig | None = None,
                 sampling: SamplingConfig | None = None, planner: PTDPlanner | None = None):
        """``config``: default :meth:`PTDConfig.default`; when cost-aware, ``planner`` (made here
        unless given, and shareable across requests) cuts candidates and draft nodes to what pays."""
        super().__init__(lm, max_new_tokens, sampling)
        config = config or PTDConfig.default()
        self.planner = None
        if config.cost_aware:
            self.planner = planner or PTDPlanner(cost_curve_for(lm), config.max_nodes)
            self.planner.use_temperature(sampling.temperature if sampling is not None else 0.0)
            budget = max(self.planner.draft_budget(), min(config.min_draft, config.max_nodes))
            config = replace(config, max_nodes=budget)  # this decoder's own copy: the size changes step by step
        self.config = config
        self.lookahead = max(self.config.ngram, self.config.depth) + 1
        self.forest = DraftForest(self.config)
        self.tries = CandidateTries(self.config.trie_nodes, self.config.ngram)

    def prepare_start(self, prompt_ids) -> bool:
        """As every decoder; the draft tree is seeded from the prompt; the tries start empty, or
        (``harvest_context``) with the prompt's n-grams."""
        reads = super().prepare_start(prompt_ids)
        self.forest.seed(self.prompt)
        self.tries = CandidateTries(self.config.trie_nodes, self.config.ngram)
        if self.config.harvest_context:
            self.harvest_text(len(self.prompt) - 1)
        return reads

    # ---- the step: draft | forward | verify, plan, expand, prune, record, harvest ----------
    def draft(self, clock: PhaseClock) -> ProgressiveState:
        """Phase 1: the root's candidate trie (what pays of it), then the draft tree riding along."""
        root = int(self.last)
        with clock.phase("retrieve"):
            cand = self.tries.candidates(root)
            if self.planner is not None:  # what pays now: the candidates and the draft tree's size
                keep, self.config.max_nodes = self.planner.plan(cand.parents, cand.depths, self.config.min_draft,
                                                                available=len(self.forest.flatten().nodes))
                cand = cand.keep(keep)
            flat = self.forest.flatten(self.config.max_nodes)
            tokens, tree = self.step_input(root, cand, flat)
        return ProgressiveState(tokens, tree, ["root"] + ["trie"] * len(cand.tokens), verified=1 + len(cand.tokens),
                                root=root, cand=cand, flat=flat)

    @torch.inference_mode()
    def finish_step(self, request: ForwardRequest, logits: torch.Tensor) -> Step:
        request.finish_begins()
        state = request.draft
        self.verify(state, logits, request)
        self.plan(state, request)
        self.expand(state, logits, request.clock)
        self.prune(state, request)
        step = self.record(self.to_step(state, request))
        step.draft_tree = state.grown
        if self.config.harvest_context:
            self.harvest_text(len(step.committed))
        if self.planner is not None:
            self.planner.record_host(state.size, request.own_host_seconds())
        return step

    def plan(self, state: ProgressiveState, request: ForwardRequest) -> None:
        """Feed the planner this step's acceptance, forward size and time."""
        if self.planner is None:
            return
        accepted = [i - 1 for i in state.path[1:]]
        cand = state.cand
        self.planner.record(candidate_keys(cand.parents, cand.depths), accepted, state.size,
                            request.clock.seconds["forward"], request.past,
                            riding=len(state.flat.nodes), drafted_hits=sum(cand.drafted[i] for i in accepted))

    def expand(self, state: ProgressiveState, logits: torch.Tensor, clock: PhaseClock) -> None:
        """Phase 4: every riding draft node gains the model's argmax (``logits [q, vocab]``, its
        rows after the verified head) as a child; new paths go into the tries; stepping and the
        root window prune the draft tree."""
        with clock.phase("expand"):
            flat, m = state.flat, state.head
            choices = logits[m:].argmax(dim=-1).tolist() if flat.nodes else []  # drafts grow greedily
            for p in self.forest.expand(flat, choices):
                self.tries.harvest(p, drafted=True)
            grown = self.forest.flatten()
            self.forest.step_depth()
            self.forest.add_branch(int(state.verdict.bonus))
            state.grown = growth_view(state.root, flat, grown, self.forest.flatten())

    def harvest_text(self, count: int) -> None:
        """Harvest the n-gram ending at each of the context's last ``count`` tokens (prompt and output)."""
        context, n = self.prompt + self.output, self.config.ngram
        for j in range(max(len(context) - count, 1), len(context)):
            self.tries.harvest(context[max(0, j - n + 1):j + 1])

    def step_input(self, root: int, cand: Candidates, flat: FlatForest) -> tuple[torch.Tensor, TreeTensors]:
        """``tokens [q]`` (the root, the candidates, the riding draft nodes) and their tensors; the
        first ``1 + len(cand.tokens)`` form the verified tree."""
        m = 1 + len(cand.tokens)
        parents = [-1] + cand.parents + [(p + m if p >= 0 else -1) for p in flat.parents]
        # A first-level draft node sits at the root's position (depth 0), its children below it.
        depths = [0] + cand.depths + [d - 1 for d in flat.depths]
        tree = TreeTensors.from_parents(parents, depths, self.lm.device, self.lm.dtype)
        tokens = torch.tensor([root] + cand.tokens + flat.tokens, dtype=torch.long, device=self.lm.device)
        return tokens, tree


def draft_view(root: int, flat: FlatForest) -> DraftTree:
    """The draft tree as the forward saw it, under the step's root (drawn, never verified)."""
    return DraftTree(tokens=[root] + flat.tokens, parents=[-1] + [p + 1 if p >= 0 else 0 for p in flat.parents],
                     depths=[0] + flat.depths, ranks=[0] * (1 + len(flat.tokens)),
                     sources=["root"] + ["draft"] * len(flat.tokens))


def growth_view(root: int, before: FlatForest, grown: FlatForest, final: FlatForest) -> DraftTree:
    """The draft tree after this step's expansion, each node marked with its fate in ``sources``:
    ``kept``, ``new`` (an argmax attached this step, or the root window's new branch) or
    ``pruned`` (stepped away or out of the window; it will not ride along next step)."""
    old, kept = {id(n) for n in before.nodes}, {id(n) for n in final.nodes}
    shown = {id(n) for n in grown.nodes}
    extra = [n for n in final.nodes if id(n) not in shown]  # the window's new branch (first level)
    view = draft_view(root, grown)
    view.tokens += [n.token for n in extra]
    view.parents += [0] * len(extra)
    view.depths += [1] * len(extra)
    view.ranks += [0] * len(extra)
    view.sources = ["root"] + [
        "pruned" if id(n) not in kept else "kept" if id(n) in old else "new" for n in grown.nodes
    ] + ["new"] * len(extra)
    return view
