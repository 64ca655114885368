"""Sampling settings and the draw at every tree node, processed as transformers' ``generate`` does.

Lossless sampling over a draft tree whose tokens were *not* sampled (TR's matrix, prompt lookup,
PTD's tries): at the root, draw a token from the model's processed distribution; if it equals one
of the node's children, move to that child and draw again from *its* distribution; otherwise
commit the drawn token and stop.  Every committed token is then a draw from exactly the
distribution plain sampling would use at that position, so the output distribution is that of
plain sampling, while matching drafts still save forwards.

Drawing one token at *every* node up front is the same thing (see ``verify.verify_sampled``).  Each
draw is an inverse-CDF lookup at a uniform number that depends on the seed and the node's position
only: nodes at the same depth share it, and the walk reads one node per depth, so every committed
token still gets a fresh uniform.  Hence the same seed gives the same text whatever tree a planner
chose (and, up to rounding at a CDF boundary, the text plain sampling gives with that seed).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """``temperature`` > 0; ``top_k`` = 0 and ``top_p`` = 1.0 switch those filters off.

    Only the settings given here are applied (not a model's ``generation_config`` defaults), in
    ``generate``'s order: temperature, top-k, top-p."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"temperature must be above 0 (got {self.temperature}); use greedy decoding for 0.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (got {self.top_p}).")
        if self.top_k < 0:
            raise ValueError(f"top_k must be 0 (off) or positive (got {self.top_k}).")

    def generate_kwargs(self) -> dict:
        """The same settings for ``model.generate`` (the reference of the statistical tests)."""
        return {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}


UNIFORM_BLOCK = 256  # uniforms are drawn this many at a time, always in order: the stream never depends on a tree


class Sampler:
    """Processes logits like ``generate`` and draws with its own seeded generator (one per decode)."""

    def __init__(self, config: SamplingConfig, device: torch.device):
        from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        self.config = config
        steps = []
        if config.temperature != 1.0:
            steps.append(TemperatureLogitsWarper(config.temperature))
        if config.top_k:
            steps.append(TopKLogitsWarper(top_k=config.top_k))
        if config.top_p < 1.0:
            steps.append(TopPLogitsWarper(top_p=config.top_p))
        self.processors = LogitsProcessorList(steps)
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(config.seed)
        self.uniforms = torch.empty(0, device=device)  # [positions so far]: the uniform of each position

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits [q, vocab]`` -> processed probabilities ``[q, vocab]`` (float32)."""
        scores = self.processors(None, logits.float())
        return torch.softmax(scores, dim=-1)

    def uniform(self, positions: torch.Tensor) -> torch.Tensor:
        """``positions [q]`` -> the uniform number of each position, ``[q]`` in [0, 1)."""
        need = int(positions.max()) + 1
        while self.uniforms.numel() < need:
            block = torch.rand(UNIFORM_BLOCK, generator=self.generator, device=self.device)
            self.uniforms = torch.cat([self.uniforms, block])
        return self.uniforms[positions]

    def draw(self, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``logits [q, vocab]`` of nodes at ``positions [q]`` -> one draw per row, ``[q]`` long: the
        token whose CDF interval holds the position's uniform."""
        cdf = self.probabilities(logits).cumsum(dim=-1)  # [q, vocab]
        target = self.uniform(positions) * cdf[:, -1]  # [q]: scaled, as the sum may miss 1 by rounding
        return torch.searchsorted(cdf, target[:, None], right=True).squeeze(1).clamp_(max=cdf.shape[-1] - 1)
