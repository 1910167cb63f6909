"""The evaluations a comparison runs on each trained language model, as a typed, validated record.

It lives beside the evaluations rather than with the comparison's specs because a comparison's results record it
(:class:`attnzoo.results.CompareResults`), and the results sit below the comparison that writes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnzoo.validation import is_int, require

BENCH_MODES = ("train", "prefill")


@dataclass(frozen=True)
class EvalSpec:
    """The evaluations run on each trained language model, beside the validation loss the trainer computes."""

    # Train short, test long (ALiBi §4): nonoverlapping evaluation at these multiples of the training length.
    extrapolation_multiples: tuple[int, ...] = (1, 2, 4, 8, 16)
    # Blocks of the longest length scored, from the start of the validation split; every length scores
    # the same tokens, so the curves differ only by the context each token gets.
    extrapolation_blocks: int = 4
    extrapolation_batch_size: int = 4
    map_tokens: int = 64  # attention maps are drawn on the first this-many validation tokens
    # The final validation loss scores the whole validation split, as this many contiguous blocks: the verdicts'
    # intervals count the sampling of the evaluation text (blocks) as well as the seeds.
    val_blocks: int = 64
    # None: the whole split; a number scores at most that many windows, spread evenly over it (toy runs only: the
    # intervals then sample less of the text).
    val_windows: int | None = None
    # Outliers, entropy and spikiness of every trained model, on this many validation windows of the training length.
    probe_windows: int = 8
    # Throughput and peak memory: (mode, multiple of the training length), each case in a fresh process and
    # with batch_size / multiple sequences, so every case processes as many tokens; the longer case shows how
    # memory grows with length.
    bench_cases: tuple[tuple[str, int], ...] = (("train", 1), ("train", 8))
    bench_repeats: int = 5  # timed repeats per case, spread over the rounds
    bench_warmup: int = 1  # untimed steps per case and round
    # The case list is measured in turn this many times, each case in a fresh process every round, so a change in
    # the machine's load falls on every variant alike rather than on whichever ran during it.
    bench_rounds: int = 2

    def __post_init__(self) -> None:
        multiples = self.extrapolation_multiples
        require(
            len(multiples) > 0 and all(is_int(m) and m >= 1 for m in multiples) and 1 in multiples,
            "extrapolation_multiples",
            multiples,
            "must be integers >= 1 that include 1 (the training length)",
        )
        for name in (
            "extrapolation_blocks",
            "extrapolation_batch_size",
            "map_tokens",
            "val_blocks",
            "probe_windows",
            "bench_repeats",
            "bench_rounds",
        ):
            value = getattr(self, name)
            require(is_int(value) and value >= 1, name, value, "must be an integer >= 1")
        require(is_int(self.bench_warmup) and self.bench_warmup >= 0, "bench_warmup", self.bench_warmup, "must be >= 0")
        require(
            self.val_windows is None or (is_int(self.val_windows) and self.val_windows >= 1),
            "val_windows",
            self.val_windows,
            "must be None (the whole validation split) or an integer >= 1",
        )
        for case in self.bench_cases:
            require(
                len(case) == 2 and case[0] in BENCH_MODES and is_int(case[1]) and case[1] >= 1,
                "bench_cases",
                self.bench_cases,
                f"must be (mode, multiple) pairs with mode in {list(BENCH_MODES)} and multiple >= 1",
            )
