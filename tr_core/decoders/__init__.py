"""One file per method, all on the step interface of ``base.Decoder`` (``step()``, or its two halves
``prepare_step()`` -> ``ForwardRequest`` and ``finish_step(request, logits)`` around ``run_forward``)."""
from .base import Decoder, DecodeError, ForwardRequest, PhaseClock, model_forward, run_forward
from .greedy import GreedyDecoder
from .paper import PaperTokenRecycling
from .pld import PromptLookupDecoder
from .ptd import ProgressiveTreeDecoder
from .recycling import DEFAULT_TREE, Additions, TokenRecyclingDecoder
from .tree_step import StepState, TreeDecoder

DECODERS = {"greedy": GreedyDecoder, "tr": TokenRecyclingDecoder, "pld": PromptLookupDecoder, "ptd": ProgressiveTreeDecoder}

__all__ = ["DECODERS", "Additions", "Decoder", "DecodeError", "ForwardRequest", "GreedyDecoder", "PaperTokenRecycling",
           "PhaseClock", "ProgressiveTreeDecoder", "PromptLookupDecoder", "StepState", "TokenRecyclingDecoder",
           "TreeDecoder", "DEFAULT_TREE", "model_forward", "run_forward"]
