"""The step record: plain dataclasses, JSON-serialisable, the only thing the UI, bench and tests see."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class DraftTree:
    """A verified tree; node 0 is the root (the last committed token), ``parents[0] = -1``."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # where each node came from: "root", "matrix", ...

    @property
    def size(self) -> int:
        """Draft nodes, the root not counted."""
        return max(len(self.tokens) - 1, 0)


@dataclass
class RowUpdate:
    """One matrix row written: ``M[token]`` went from ``old`` to ``new``."""

    token: int
    old: list[int]
    new: list[int]


@dataclass
class Step:
    """One decoding step = exactly one verification forward."""

    index: int  # 1-based step number
    method: str
    tree: DraftTree  # empty for greedy except the root
    accepted_path: list[int]  # node indices from the root (0) to the deepest accepted node
    committed: list[int]  # accepted draft tokens + the model's own token (cut at EOS / budget)
    model_choices: list[int]  # the model's token after each tree node (argmax, or the draw when sampling)
    rows_written: list[RowUpdate]
    forward_tokens: int  # query length of the forward
    cache_length: int  # KV entries before this step's forward
    timings: dict[str, float]  # phase -> seconds, device synchronised
    done: bool = False
    sampled: bool = False  # lossless sampling: model_choices are draws; the walk followed them
    # PTD: the evolving draft tree after this step's expansion; ``sources`` holds each node's
    # fate ("kept", "new", "pruned").  Its nodes ride along in the forward but are never verified.
    draft_tree: DraftTree | None = None
    blank_drafts: int = 0  # TR: nodes of the tree shape left out, drafted from rows never written (or below one)
    blank_under: list[int] = field(default_factory=list)  # TR: tree nodes whose children were left out (rows never written)
    wall: float | None = None  # the whole step's wall-clock seconds, device synchronised once (tr_core.race.timed_stepping)
    alongside: int = 0  # other requests in the forward that ran it (a class on one server): its time is that whole forward

    @property
    def accepted_drafts(self) -> int:
        return len(self.accepted_path) - 1

    @property
    def seconds(self) -> float:
        """The step's seconds: its wall clock where measured (host work included), else its phases' sum."""
        return self.wall if self.wall is not None else sum(self.timings.values())

    def to_dict(self) -> dict:
        return asdict(self)
