"""The workloads of the estimator's accuracy benchmark (factories returning ``TorchStep`` or
``JaxStep``), as the bench scripts and the command line name them
(``memfit estimate bench.estimate_workloads:make_ppo_mlp``). They are defined in
``tests/shared/accuracy_workloads.py``, where the tests build them too.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "shared"))

from accuracy_workloads import (
    JAX_WORKLOADS,
    TORCH_WORKLOADS,
    make_act_policy,
    make_bn_convnet,
    make_checkpointed_mlp,
    make_dqn_cnn,
    make_gpt,
    make_jax_ppo,
    make_ppo_mlp,
    make_resnet18,
    make_transformer_block,
)

__all__ = [
    "JAX_WORKLOADS",
    "TORCH_WORKLOADS",
    "make_act_policy",
    "make_bn_convnet",
    "make_checkpointed_mlp",
    "make_dqn_cnn",
    "make_gpt",
    "make_jax_ppo",
    "make_ppo_mlp",
    "make_resnet18",
    "make_transformer_block",
]
