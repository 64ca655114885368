"""One file per method, all on the step interface of ``base.Decoder``."""
from .base import Decoder, DecodeError, PhaseClock
from .greedy import GreedyDecoder
from .recycling import TokenRecyclingDecoder, default_tree_name

DECODERS = {"greedy": GreedyDecoder, "tr": TokenRecyclingDecoder}

__all__ = ["DECODERS", "Decoder", "DecodeError", "GreedyDecoder", "PhaseClock", "TokenRecyclingDecoder",
           "default_tree_name"]
