"""Token Recycling: a lossless, training-free speculative decoder for Hugging Face causal LMs.

UI-free: importable without gradio.  See ``decoders`` for the step interface.
"""
from .decoders import (DECODERS, Additions, Decoder, DecodeError, GreedyDecoder, PaperTokenRecycling, PromptLookupDecoder,
                       TokenRecyclingDecoder)
from .matrix import AdjacencyMatrix, MatrixFileError
from .models import LoadedModel, ModelLoadError, load_model, wrap_model
from .trace import DraftTree, RowUpdate, Step
from .trees import TreeError, TreeShape, list_presets, load_tree

__all__ = ["Additions", "AdjacencyMatrix", "DECODERS", "Decoder", "DecodeError", "DraftTree", "GreedyDecoder",
           "LoadedModel", "MatrixFileError", "ModelLoadError", "PaperTokenRecycling", "PromptLookupDecoder", "RowUpdate", "Step",
           "TokenRecyclingDecoder", "TreeError", "TreeShape", "list_presets", "load_model", "load_tree", "wrap_model"]
