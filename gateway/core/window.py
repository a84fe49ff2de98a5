"""``WindowPolicy``: the model's context window and when its projection is compressed (DESIGN §5)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WindowPolicy:
    """How the projection is fitted (all ratios are of ``context_window_tokens``).

    Attributes:
        context_window_tokens: the model's context window in tokens (prompt + reply).
        threshold: compress once the estimated request reaches this share.
        keep_ratio: after compressing, recent turns kept verbatim up to this share.
        summary_ratio: the summary's cap (longer summaries are cut to it).
        reserve_ratio: kept free for the reply and the estimate's error: a turn starts at most at
            ``threshold``, and the space up to ``1 - reserve_ratio`` is for its own tool steps.
    """

    context_window_tokens: int = 128_000
    threshold: float = 0.75
    keep_ratio: float = 0.35
    summary_ratio: float = 0.15
    reserve_ratio: float = 0.1

    def __post_init__(self) -> None:
        """Raises ``ValueError`` unless ``0 < keep_ratio + summary_ratio < threshold <= 1 -
        reserve_ratio`` (a fresh summary plus the kept turns must leave room below the threshold)."""
        if not 0 < self.keep_ratio + self.summary_ratio < self.threshold <= 1 - self.reserve_ratio:
            raise ValueError("need 0 < keep_ratio + summary_ratio < threshold <= 1 - reserve_ratio")

    @property
    def compress_at(self) -> int:
        """Estimated request tokens at which older turns are summarised."""
        return int(self.context_window_tokens * self.threshold)

    @property
    def hard_limit(self) -> int:
        """Estimated request tokens a turn's steps should stay under (not enforced inside a turn:
        tool results are capped by ``agent.tool_result_max_chars`` instead)."""
        return int(self.context_window_tokens * (1 - self.reserve_ratio))

    @property
    def summary_tokens(self) -> int:
        """The longest summary kept, in estimated tokens."""
        return int(self.context_window_tokens * self.summary_ratio)
