"""The third-party models of the estimator's accuracy benchmark (transformers, stable-baselines3),
as the bench scripts name them. They are defined in ``tests/shared/third_party_workloads.py``,
where the tests build them too.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "shared"))

from third_party_workloads import (
    SMALL_THIRD_PARTY,
    THIRD_PARTY_WORKLOADS,
    make_bert,
    make_gpt2,
    make_sb3_dqn_cnn,
    make_sb3_ppo_mlp,
    make_sb3_ppo_multi,
    make_t5,
    make_vit,
)

__all__ = [
    "SMALL_THIRD_PARTY",
    "THIRD_PARTY_WORKLOADS",
    "make_bert",
    "make_gpt2",
    "make_sb3_dqn_cnn",
    "make_sb3_ppo_mlp",
    "make_sb3_ppo_multi",
    "make_t5",
    "make_vit",
]
