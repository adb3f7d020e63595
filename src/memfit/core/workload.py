"""The workload file: schema, loading and validation.

A workload describes one training or inference job in YAML: its fixed facts (framework,
precision, optimizer, networks, observations, environment state per env, devices), the knobs a
planner may tune (named as the framework names its arguments), the throughput proxy to
maximise, and the rules the knobs must keep. ``docs/workload.md`` documents every field.

Loading (:func:`load_workload`) reports every user mistake as a
:class:`memfit.errors.ConfigError` that says where it is:

* a YAML syntax error names the file, line and column (``fire.yaml:12:3``);
* an unknown key names its path and suggests the nearest known key ("did you mean ...");
* a value of the wrong type or out of range names its key path and what is allowed.

Bundled workloads live in ``memfit/workloads/*.yaml`` and are loaded by name
(``load_workload("brax_humanoid_ppo")``); a variant is picked with ``name@variant``
(``brax_humanoid_ppo@quick``), which deep-merges the file's ``variants.<variant>`` section
over the base document before validation.

>>> w = load_workload("brax_humanoid_ppo@quick")
>>> w.family, w.framework, sorted(w.knobs)[:2]
('ppo', 'jax', ['batch_size', 'num_envs'])
"""

from __future__ import annotations

from memfit.core._workload_load import (
    BUNDLED_DIR,
    bundled_names,
    load_workload,
    parse_workload,
    require_workload,
)
from memfit.core._workload_schema import (
    CameraSpec,
    ConvLayer,
    DeviceSpec,
    EffectiveBatch,
    FeatureExtractorSpec,
    JaxSettings,
    KnobSpec,
    NetworkSpec,
    Observations,
    OffPolicySpec,
    PlannedFor,
    PpoSpec,
    RasterSpec,
    Rule,
    SacReplaySpec,
    SacSpec,
    TransformerSpec,
    VisionSpec,
    Workload,
    dtype_bytes,
)

__all__ = [
    "BUNDLED_DIR",
    "CameraSpec",
    "ConvLayer",
    "DeviceSpec",
    "EffectiveBatch",
    "FeatureExtractorSpec",
    "JaxSettings",
    "KnobSpec",
    "NetworkSpec",
    "Observations",
    "OffPolicySpec",
    "PlannedFor",
    "PpoSpec",
    "RasterSpec",
    "Rule",
    "SacReplaySpec",
    "SacSpec",
    "TransformerSpec",
    "VisionSpec",
    "Workload",
    "bundled_names",
    "dtype_bytes",
    "load_workload",
    "parse_workload",
    "require_workload",
]
