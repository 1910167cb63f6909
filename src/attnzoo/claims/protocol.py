"""What every paper's claims share, fixed before any run: the baseline, the smallest effects of interest with their
sources, the gates, and the checks that rule out a setup error.

Figures are quoted only from a source named in the claim: a review in ``shared/seeds/`` (file and line) or the
paper's own text at its address; where neither gives a number the statement says "figure not available".
"""

from __future__ import annotations

from attnzoo.claims.gates import LanguageModelGate, TaskLearned
from attnzoo.claims.measures import lm_metric

BASELINE = "mha+rope"
# The GPU preset of the one-size ablations (DCMHA's pre/post and query-wise compositions, selective attention's
# position temperature), at the GPU ladder's heads of 48; on the CPU, the claims ladder's small rung runs them as its
# claims-ablations part (attnzoo.compare.presets).
ABLATIONS = "gpu-ablations"
# The GPU ladder of ALiBi's claims against sinusoidal positions trained at 2L, which no CPU size makes competent
# (attnzoo.claims.alibi.SINUSOIDAL_CALIBRATION).
ALIBI_LADDER = "gpu-alibi"
VAL_LOSS = lm_metric("val_loss", "validation loss (nats/token)")

# The smallest LM-loss difference of interest, and the gate that goes with it: see LM_EFFECT_SOURCE.
LM_EFFECT = 0.02
LM_EFFECT_SOURCE = (
    "our choice, no paper figure being citable: 2% in perplexity, about a quarter of what 1.5× the training compute "
    "buys MHA. Fixed before the claims ladder ran, on the one-size run (docs/claims-one-size, made at c76947c: "
    "mha+rope 1.7929 → 1.7051 nats with 1.5× the steps at 0.12M, mean of 3 seeds); on the ladder's own curve "
    "(docs/claims: MHA's loss against training compute fitted across its two sizes per seed, α = 0.121 on the mean "
    "of 5 seeds), 1.5× the compute buys 0.091 nats at 0.12M and 0.077 at 0.25M, a quarter of which is 0.023 and 0.019"
)
LM_PROTOCOL = LanguageModelGate(loss_effect=LM_EFFECT)
ACCURACY_EFFECT_SOURCE = (
    "our choice: 5 accuracy points, about 1.4 binomial standard errors of one seed's accuracy near 50% at 200 samples"
)
LEARNED = TaskLearned()

SETUP_CHECKS = (
    "every variant parameter-matched to the baseline within 2% (the params column)",
    "the same data in the same order: seed k fixes it for every variant",
    "the same optimiser, learning rate, warmup and schedule for every variant",
)
