"""Implementation checks: exact properties of the code, read off a comparison, that no seed changes.

They are not claims: a check passes or fails by arithmetic on the configuration, so it can never count as
evidence for a paper. The report shows them in their own table, after the verdicts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from attnzoo.results.comparison import CompareResults

Status = Literal["pass", "fail"]


@dataclass(frozen=True)
class CheckResult:
    name: str
    expected: str
    measured: str
    status: Status


def kv_cache_checks(results: CompareResults) -> list[CheckResult]:
    """Each grouped- or multi-query variant's KV cache is the baseline's ÷ (n_heads ÷ n_kv_heads), as allocated."""
    base = results.variants[results.baseline]
    rows = []
    for label, variant in results.variants.items():
        heads, kv_heads = variant.config["n_heads"], variant.config["n_kv_heads"]
        if label == results.baseline or kv_heads == heads or variant.config["attention"] != "mha":
            continue
        base_kv = base.config["n_kv_heads"]
        expected = base_kv / kv_heads
        measured = base.kv_cache_bytes_per_token / variant.kv_cache_bytes_per_token
        rows.append(
            CheckResult(
                f"{label}: KV-cache bytes per token, {results.baseline} ÷ {label}",
                f"{expected:g}× ({base_kv} ÷ {kv_heads} kv heads)",
                f"{measured:g}× ({base.kv_cache_bytes_per_token:,} ÷ {variant.kv_cache_bytes_per_token:,} bytes)",
                "pass" if math.isclose(measured, expected, rel_tol=1e-9) else "fail",
            )
        )
    return rows


def run_checks(results: CompareResults) -> list[CheckResult]:
    return kv_cache_checks(results)
