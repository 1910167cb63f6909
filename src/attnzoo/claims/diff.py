"""Diff Transformer's claims (Ye et al., 2024, arXiv 2410.05258): differential attention cancels attention noise."""

from __future__ import annotations

import math

from attnzoo.claims.claim import HIGHER, LOWER, Claim, register_claim
from attnzoo.claims.gates import TaskLearned
from attnzoo.claims.measures import compute_multiple, lm_probe, task_metric, task_probe
from attnzoo.claims.protocol import ACCURACY_EFFECT_SOURCE, BASELINE, LEARNED, LM_PROTOCOL, SETUP_CHECKS

PAPER = "Diff Transformer (Ye et al., 2024)"
DIFF_MULTIPLE = 1 / 0.65  # "about 65% of model size or training tokens": 1.54× for the Transformer
BOTH_LEARNED = TaskLearned(variant_too=True)  # a claim read off a probe of the mechanism
DIFF_CHECKS = (
    *SETUP_CHECKS,
    "λ_init = 0.8 − 0.6·exp(−0.3·(l − 1)) by depth, as the official code (tests/test_diff.py)",
    "head pairing as the paper: h/2 differential heads of twice the head size, paired with MHA's h heads",
    "the official layout and parameter names; an official state dict loads strict (tests/test_diff.py)",
)


register_claim(
    Claim(
        id="diff.lm_loss",
        paper=PAPER,
        statement=(
            "The scaling curves indicate that Diff Transformer requires only about 65% of model size or training "
            "tokens needed by Transformer to achieve comparable language modeling performance (a 1.54× multiple)."
        ),
        source="arXiv 2410.05258, abstract",
        variant="diff+rope",
        baseline=BASELINE,
        measure=compute_multiple(BASELINE),
        rule=HIGHER,
        smallest_effect=math.log(DIFF_MULTIPLE) / 2,
        smallest_effect_source=(
            "half the paper's multiple in log-compute: ln(1/0.65)/2 = 0.215, a multiple of √1.54 ≈ 1.24×; read as "
            "DCFormer's, off MHA's loss against training compute across the ladder's sizes at one tokens-per-parameter "
            "(at equal size, 65% of the tokens is a compute multiple of 1.54×)"
        ),
        gate=LM_PROTOCOL,
        primary=True,
        paper_scale="scaling curves over model size and training tokens (sizes not given in the review)",
        paper_regime=(
            "the 3B model: 28 layers, hidden 3072, head dim 128 (12 Diff heads against the Transformer's 24), "
            "sequences of 4096, lr 3.2e-4, 350B tokens, the cl100k tokenizer; an ablation at 1.4B "
            "(shared/notes/eval_protocols.md:148–151, 273); the scaling curves' sizes are not given there"
        ),
        checks=DIFF_CHECKS,
    )
)

register_claim(
    Claim(
        id="diff.multi_needle",
        paper=PAPER,
        statement=(
            "Differential attention retrieves key information from a context full of distractors better, by "
            "cancelling attention noise (figure not available)."
        ),
        source="arXiv 2410.05258, abstract (key information retrieval)",
        variant="diff+rope",
        baseline=BASELINE,
        measure=task_metric("needles", "multi-needle accuracy"),
        rule=HIGHER,
        smallest_effect=0.05,
        smallest_effect_source=ACCURACY_EFFECT_SOURCE,
        gate=LEARNED,
        paper_scale="model sizes not given in the review",
        checks=DIFF_CHECKS,
    )
)

register_claim(
    Claim(
        id="diff.attention_to_answer",
        paper=PAPER,
        statement=(
            "Differential attention focuses on the critical information: more attention on the answer (figure not"
            " available)."
        ),
        source="shared/seeds/000:8",
        variant="diff+rope",
        baseline=BASELINE,
        measure=task_probe("needles", "mean/answer", "attention share on the answer"),
        rule=HIGHER,
        smallest_effect=0.05,
        smallest_effect_source="our choice: 5 points of attention share",
        gate=BOTH_LEARNED,
        paper_scale="model sizes not given in the review",
        checks=DIFF_CHECKS,
    )
)

register_claim(
    Claim(
        id="diff.attention_noise",
        paper=PAPER,
        statement=(
            "Differential attention cancels attention noise: less attention on irrelevant context (figure not "
            "available)."
        ),
        source="shared/seeds/000:5, 000:8",
        variant="diff+rope",
        baseline=BASELINE,
        measure=task_probe("needles", "mean/noise", "attention share on the noise context"),
        rule=LOWER,
        smallest_effect=0.05,
        smallest_effect_source="our choice: 5 points of attention share",
        gate=BOTH_LEARNED,
        paper_scale="model sizes not given in the review",
        checks=DIFF_CHECKS,
    )
)

register_claim(
    Claim(
        id="diff.attention_logit_outliers",
        paper=PAPER,
        statement="Differential attention reduces outliers in the attention logits (figure not available).",
        source="arXiv 2410.05258, abstract (activation outliers)",
        variant="diff+rope",
        baseline=BASELINE,
        measure=lm_probe("top1_attention_logit", "largest |attention logit|"),
        rule=LOWER,
        smallest_effect=1.0,
        smallest_effect_source="our choice: one logit unit, about 10% of the values a 1M-parameter model reaches here",
        gate=LM_PROTOCOL,
        paper_scale="model sizes not given in the review",
        checks=DIFF_CHECKS,
    )
)

register_claim(
    Claim(
        id="diff.hidden_state_outliers",
        paper=PAPER,
        statement="Differential attention reduces outliers in the hidden states (figure not available).",
        source="arXiv 2410.05258, abstract (activation outliers)",
        variant="diff+rope",
        baseline=BASELINE,
        measure=lm_probe("hidden_outlier_ratio", "largest ÷ median |hidden state|"),
        rule=LOWER,
        smallest_effect=1.0,
        smallest_effect_source="our choice: a ratio of 1, about 5% of the values a 1M-parameter model reaches here",
        gate=LM_PROTOCOL,
        paper_scale="model sizes not given in the review",
        checks=DIFF_CHECKS,
    )
)
