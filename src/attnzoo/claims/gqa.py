"""GQA's claims (Ainslie et al., 2023, arXiv 2305.13245): grouped-query attention, uptrained from a multi-head
checkpoint.
"""

from __future__ import annotations

from attnzoo.claims.claim import HIGHER, NONINFERIOR, Claim, register_claim
from attnzoo.claims.gates import LanguageModelGate
from attnzoo.claims.measures import SpikeRule, loss_spikes
from attnzoo.claims.protocol import BASELINE, LM_EFFECT, LM_EFFECT_SOURCE, LM_PROTOCOL, SETUP_CHECKS, VAL_LOSS

PAPER = "GQA (Ainslie et al., 2023)"
# GQA's claims name their own budget, the uptraining fraction α: the gap is read where that budget ends.
UPTRAINING_PROTOCOL = LanguageModelGate(loss_effect=LM_EFFECT, fixed_budget=True)
GQA_SOURCE = "arXiv 2305.13245, abstract; shared/seeds/001:248–249"
# gqa.mqa_less_stable's spike rule and where it runs, fixed before the run: a logged training loss (every 20 steps)
# more than 0.1 nats above the median of the 5 logged before it.
SPIKE_RULE = SpikeRule(window=5, nats=0.1)
STABILITY_PRESET = "claims-stability"
STABILITY_LR = 2e-2
UPTRAINING_CHECKS = (
    "the uptrained model is the same seed's trained baseline with its kv heads mean-pooled in groups, as the paper "
    "converts a checkpoint (attnzoo convert --kv-heads, tests/test_kv_pooling.py)",
    "uptrained with pre-training's recipe again over α of its steps: the same data, warmup share, peak learning "
    "rate, cosine and floor (tests/test_compare.py)",
)


register_claim(
    Claim(
        id="gqa.uptrained_close_to_mha",
        paper=PAPER,
        statement=(
            "An MHA checkpoint converted to grouped-query attention and uptrained with 5% of the original pre-training "
            "compute reaches quality close to MHA at MQA's speed (figure not available)."
        ),
        source=GQA_SOURCE,
        variant="mha+rope+kv2+up0.05",
        baseline=BASELINE,
        measure=VAL_LOSS,
        rule=NONINFERIOR,
        smallest_effect=LM_EFFECT,
        smallest_effect_source=LM_EFFECT_SOURCE,
        gate=UPTRAINING_PROTOCOL,
        primary=True,
        paper_scale="T5 checkpoints uptrained with 5% of their pre-training compute (arXiv 2305.13245, abstract)",
        paper_regime=(
            "T5 checkpoints uptrained with 5% of their pre-training compute (arXiv 2305.13245, abstract); sizes, "
            "heads and tokens not given in shared/seeds or shared/notes"
        ),
        checks=UPTRAINING_CHECKS,
    )
)

register_claim(
    Claim(
        id="gqa.uptrained_10pct_close_to_mha",
        paper=PAPER,
        statement=(
            "With 10% of the steps to uptrain, converted grouped-query attention stays close to MHA (figure not "
            "available)."
        ),
        source=GQA_SOURCE,
        variant="mha+rope+kv2+up0.1",
        baseline=BASELINE,
        measure=VAL_LOSS,
        rule=NONINFERIOR,
        smallest_effect=LM_EFFECT,
        smallest_effect_source=LM_EFFECT_SOURCE,
        gate=UPTRAINING_PROTOCOL,
        paper_scale="T5 checkpoints uptrained with 5% of their pre-training compute (arXiv 2305.13245, abstract)",
        checks=UPTRAINING_CHECKS,
    )
)

register_claim(
    Claim(
        id="gqa.mqa_less_stable",
        paper=PAPER,
        statement="Multi-query attention risks lower quality and trains less stably than MHA (figure not available).",
        source="shared/seeds/001:234",
        variant="mha+rope+kv1",
        baseline="mha+rope+kv2",
        measure=loss_spikes(SPIKE_RULE, STABILITY_PRESET),
        rule=HIGHER,
        smallest_effect=1.0,
        smallest_effect_source=(
            "one loss spike per run, our choice; the spike rule's 0.1 nats is about twice the largest rise over the "
            "running median in the claims ladder's small-rung runs at 3e-3 (0.03–0.06 nats, MHA and DCMHA seeds 0 "
            "and 1, docs/claims/small)"
        ),
        gate=LM_PROTOCOL,
        paper_scale="uptrained checkpoints (sizes not given in the review)",
        checks=(
            "trained from scratch at a peak learning rate near the stability edge (the claims-stability preset: "
            f"{STABILITY_LR:g}, twice the largest rate benchmarks/results/lr_sweep.md trained every model at), the "
            "rest the claims ladder's small rung; the spike rule: " + SPIKE_RULE.describe(),
        ),
        preset=STABILITY_PRESET,
    )
)

register_claim(
    Claim(
        id="gqa.close_to_mha",
        paper=PAPER,
        statement=(
            "Grouped-query attention reaches quality close to MHA (figure not available; here trained from "
            "scratch, not uptrained)."
        ),
        source="shared/seeds/001:249",
        variant="mha+rope+kv2",
        baseline=BASELINE,
        measure=VAL_LOSS,
        rule=NONINFERIOR,
        smallest_effect=LM_EFFECT,
        smallest_effect_source=LM_EFFECT_SOURCE,
        gate=LM_PROTOCOL,
        paper_scale="uptrained checkpoints (sizes not given in the review)",
        checks=SETUP_CHECKS,
    )
)

register_claim(
    Claim(
        id="gqa.mqa_behind_gqa",
        paper=PAPER,
        statement=(
            "Uptrained multi-query attention loses some quality, while uptrained grouped-query attention stays "
            "close to MHA (figure not available)."
        ),
        source="shared/seeds/001:230, 001:234, 001:249",
        variant="mha+rope+kv1+up0.05",
        baseline="mha+rope+kv2+up0.05",
        measure=VAL_LOSS,
        rule=HIGHER,
        smallest_effect=LM_EFFECT,
        smallest_effect_source=LM_EFFECT_SOURCE,
        gate=UPTRAINING_PROTOCOL,
        paper_scale="T5 checkpoints uptrained with 5% of their pre-training compute (arXiv 2305.13245, abstract)",
        checks=UPTRAINING_CHECKS,
    )
)
