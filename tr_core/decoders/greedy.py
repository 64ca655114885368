"""Plain decoding, one token per forward: greedy (the baseline every speedup is measured against)
or, with ``sampling``, plain sampling with the same logits processing as the tree decoders."""
from __future__ import annotations

import torch

from ..trace import DraftTree, Step
from .base import Decoder, ForwardRequest


class GreedyDecoder(Decoder):
    method = "greedy"

    @torch.inference_mode()
    def prepare_step(self) -> ForwardRequest:
        """The last committed token alone: ``input_ids [1, 1]`` right after the cache."""
        self._check_running()
        input_ids = self.last.view(1, 1)
        return self.new_request(input_ids, self.next_positions(input_ids))

    @torch.inference_mode()
    def finish_step(self, request: ForwardRequest, logits: torch.Tensor) -> Step:
        """``logits [1, vocab]``: the model's token (argmax, or a draw) is committed."""
        clock, past, root = request.clock, request.past, int(request.input_ids[0, 0])
        with clock.phase("verify"):
            where = torch.tensor([past], device=logits.device)  # the fed token's position
            choice = self.sampler.draw(logits[-1:], where)[0] if self.sampler else logits[-1].argmax()
            token = int(choice)
        self.last = choice
        committed = self.commit([token])
        return self.record(Step(
            index=len(self.steps) + 1, method=self.method,
            tree=DraftTree(tokens=[root], parents=[-1], depths=[0], ranks=[0], sources=["root"]),
            accepted_path=[0], committed=committed, model_choices=[token], rows_written=[],
            forward_tokens=1, cache_length=past, timings=clock.seconds, sampled=self.sampler is not None))
