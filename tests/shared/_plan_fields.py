"""The fields of a plan, in order: ``Plan.to_dict()`` and ``memfit plan --json`` give exactly
these (written out here, not read from memfit, so that a change to them fails a test)."""

from __future__ import annotations

PLAN_FIELDS = [
    "gpu",
    "budget_bytes",
    "predicted_bytes",
    "fits",
    "knobs",
    "breakdown",
    "sources",
    "binding",
    "alternatives",
    "gpu_total_bytes",
    "pool_bytes",
    "host_bytes",
    "used_bytes",
    "headroom_bytes",
    "environment",
    "notes",
    "would_fit",
    "host_memory_bytes",
    "host_budget_bytes",
    "context",
    "compiled_for",
    "basis",
    "predicted_low_bytes",
    "predicted_high_bytes",
    "high_fits",
]
