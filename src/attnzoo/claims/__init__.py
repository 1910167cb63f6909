"""The papers' claims as records, and how a comparison's results decide each.

One module per paper registers its claims (:mod:`~attnzoo.claims.alibi`, :mod:`~attnzoo.claims.dcformer`,
:mod:`~attnzoo.claims.diff`, :mod:`~attnzoo.claims.gqa`, :mod:`~attnzoo.claims.selective`) from the record
(:mod:`~attnzoo.claims.claim`), its gates (:mod:`~attnzoo.claims.gates`), the measures
(:mod:`~attnzoo.claims.measures`) and the choices they share (:mod:`~attnzoo.claims.protocol`).
:mod:`~attnzoo.claims.verdicts` judges them on a comparison or a ladder of comparisons (:mod:`attnzoo.results`):
each size measured and the sizes read together (:mod:`~attnzoo.claims.sizes`), the statement's further parts
(:mod:`~attnzoo.claims.parts`), each decided by the rules fixed before the run (:mod:`~attnzoo.claims.rules`), with
the statistics of :mod:`attnzoo.stats`, into a :class:`~attnzoo.claims.verdict.Verdict`;
:mod:`~attnzoo.claims.report` renders the report's section.

>>> from attnzoo.claims import CLAIMS, judge_all
>>> CLAIMS["diff.lm_loss"].primary
True
"""

from attnzoo.claims import alibi, dcformer, diff, gqa, selective  # noqa: F401  (each registers its paper's claims)
from attnzoo.claims.claim import CLAIMS, Claim, register_claim
from attnzoo.claims.experiments import claim_tasks, claim_variants
from attnzoo.claims.verdict import Verdict
from attnzoo.claims.verdicts import judge, judge_all

__all__ = ["CLAIMS", "Claim", "Verdict", "claim_tasks", "claim_variants", "judge", "judge_all", "register_claim"]
