"""One file per method, all on the step interface of ``base.Decoder``."""
from .base import Decoder, DecodeError, PhaseClock
from .greedy import GreedyDecoder
from .pld import PromptLookupDecoder
from .ptd import ProgressiveTreeDecoder
from .recycling import DEFAULT_TREE, TokenRecyclingDecoder
from .tree_step import TreeDecoder

DECODERS = {"greedy": GreedyDecoder, "tr": TokenRecyclingDecoder, "pld": PromptLookupDecoder, "ptd": ProgressiveTreeDecoder}

__all__ = ["DECODERS", "Decoder", "DecodeError", "GreedyDecoder", "PhaseClock", "ProgressiveTreeDecoder", "PromptLookupDecoder",
           "TokenRecyclingDecoder", "TreeDecoder", "DEFAULT_TREE"]
