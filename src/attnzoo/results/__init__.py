"""What a comparison leaves behind, as typed records: one comparison's results (:mod:`~attnzoo.results.comparison`)
and a ladder of comparisons at several model sizes (:mod:`~attnzoo.results.ladder`).

They sit below both the comparison that writes them (:mod:`attnzoo.compare`) and the claims judged on them
(:mod:`attnzoo.claims`).
"""

from attnzoo.results.comparison import SCHEMA_VERSION, CompareResults, TaskResult, TaskRun
from attnzoo.results.ladder import Ladder, load_ladder

__all__ = ["SCHEMA_VERSION", "CompareResults", "Ladder", "TaskResult", "TaskRun", "load_ladder"]
