"""Progressive Tree Drafting (arXiv 2607.10661): the model drafts for itself inside the forward
that verifies.

Each step, in phases:
  1. retrieve  - the candidate trie keyed by the last committed token (``tr_core.ptd``) becomes
     the verified tree under the root (where extra tokens cost: only the candidates that pay,
     ``PTDPlanner``); the draft tree rides along behind it in the same input
  2. forward   - one forward: candidates see the cache, the root and their ancestors; draft
     nodes see the cache and their own ancestors
  3. verify    - the longest candidate path equal to the model's argmax, plus the model's token,
     exactly as Token Recycling does (so the output is plain greedy's)
  4. expand    - every draft node gains the model's argmax as a child; new paths are harvested
     into the tries; stepping and the root window prune
  5. prune     - keep only the accepted path's KV entries (the draft nodes' entries go too)
  6. harvest   - (``harvest_output``, the CPU default) the n-grams ending at each committed token go
     into the tries too: the verified text is the model's own prediction on the live context, and
     where only a few draft nodes can ride along it is most of what the tries get
"""
from __future__ import annotations

from dataclasses import replace

import torch

from ..cost import cost_curve_for
from ..models import LoadedModel
from ..ptd import CandidateTries, DraftForest, FlatForest, PTDConfig, PTDPlanner, candidate_keys, keep_candidates
from ..sampling import SamplingConfig
from ..trace import DraftTree, Step
from ..trees import TreeTensors
from .base import PhaseClock
from .tree_step import TreeDecoder


class ProgressiveTreeDecoder(TreeDecoder):
    method = "ptd"

    def __init__(self, lm: LoadedModel, max_new_tokens: int = 128, config: PTDConfig | None = None,
                 sampling: SamplingConfig | None = None, planner: PTDPlanner | None = None):
        """``config``: default :meth:`PTDConfig.for_device`; when cost-aware, ``planner`` (made here
        unless given, and shareable across requests) cuts candidates and draft nodes to what pays."""
        super().__init__(lm, max_new_tokens, sampling)
        config = config or PTDConfig.for_device(lm.device)
        self.planner = None
        if config.cost_aware:
            self.planner = planner or PTDPlanner(cost_curve_for(lm), config.max_nodes)
            self.planner.use_temperature(sampling.temperature if sampling is not None else 0.0)
            config = replace(config, max_nodes=self.planner.draft_budget())  # this decoder's own copy
        self.config = config
        self.lookahead = max(self.config.ngram, self.config.depth) + 1
        self.forest = DraftForest(self.config)
        self.tries = CandidateTries(self.config.trie_nodes, self.config.ngram)

    def start(self, prompt_ids) -> None:
        """Prefill as usual; the draft tree is seeded from the prompt and the tries start empty."""
        super().start(prompt_ids)
        self.forest.seed(self.prompt)
        self.tries = CandidateTries(self.config.trie_nodes, self.config.ngram)

    @torch.inference_mode()
    def step(self) -> Step:
        self._check_running()
        clock, root = PhaseClock(self.lm.device), int(self.last)
        with clock.phase("retrieve"):
            cand, cand_parents, cand_depths = self.tries.candidates(root)
            if self.planner is not None:  # the draft tree's size follows the cost as it is now
                self.config.max_nodes = self.planner.draft_budget()
            flat = self.forest.flatten(self.config.max_nodes)
            if self.planner is not None:
                keep = self.planner.cut(cand_parents, cand_depths, len(flat.nodes))
                cand, cand_parents, cand_depths = keep_candidates(cand, cand_parents, cand_depths, keep)
            tokens, tree, m = self.step_input(root, cand, cand_parents, cand_depths, flat)
        logits, verdict, path = self.verify_tree(tokens, tree, clock, verified=m)
        if self.planner is not None:
            self.planner.record(candidate_keys(cand_parents, cand_depths), [i - 1 for i in path[1:]],
                                tokens.shape[0], clock.seconds["forward"],
                                self.cache_length - tokens.shape[0])
        with clock.phase("expand"):
            choices = logits[m:].argmax(dim=-1).tolist() if flat.nodes else []  # drafts grow greedily
            for p in self.forest.expand(flat, choices):
                self.tries.harvest(p)
            grown = self.forest.flatten()
            self.forest.step_depth()
            self.forest.add_branch(int(verdict.bonus))
            draft = growth_view(root, flat, grown, self.forest.flatten())
        step = self.finish_tree_step(tokens, tree, ["root"] + ["trie"] * len(cand), verdict, path, clock,
                                     verified=m)
        step.draft_tree = draft
        if self.config.harvest_output:
            self.harvest_committed(len(step.committed))
        return step

    def harvest_committed(self, count: int) -> None:
        """Harvest the n-gram ending at each of the last ``count`` committed tokens (prompt included)."""
        context, n = self.prompt + self.output, self.config.ngram
        for j in range(len(context) - count, len(context)):
            self.tries.harvest(context[max(0, j - n + 1):j + 1])

    def step_input(self, root: int, cand: list[int], cand_parents: list[int], cand_depths: list[int],
                   flat: FlatForest):
        """``tokens [q]``, the forest's tensors, and ``m`` = 1 + candidates (the verified head)."""
        m = 1 + len(cand)
        parents = [0] + cand_parents + [(p + m if p >= 0 else -1) for p in flat.parents]
        # A first-level draft node sits at the root's position (depth 0), its children below it.
        depths = [0] + cand_depths + [d - 1 for d in flat.depths]
        tree = TreeTensors.from_parents(parents, depths, self.lm.device, self.lm.dtype)
        tokens = torch.tensor([root] + cand + flat.tokens, dtype=torch.long, device=self.lm.device)
        return tokens, tree, m


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
