"""Vision policy rollout (ACT-style inference) memory model.

Terms, per device, for ``num_envs`` parallel rollouts (LeRobot ACT, shared REFERENCE.md:
ResNet-18 backbone per camera, a transformer with ``dim_model`` 512, action chunks of
``chunk_size`` 100):

* ``camera_frames``: ``num_envs x cameras x H x W x C x dtype x frame_stack``;
* ``backbone_activations``: the backbone runs without autograd, so only a layer's input and
  output are live at once: ``num_envs x cameras x max_i(in_i + out_i)`` values, the first input
  being the frame converted to the activation dtype;
* ``backbone_features``: the last feature map of every camera, kept as transformer tokens;
* ``transformer_activations``: one layer at a time over ``T = cameras x H_f x W_f +
  extra_tokens + chunk_size`` tokens: hidden state, queries, keys, values and output
  (``5 x T x dim_model``), the attention scores (``heads x T x T``, the math path of
  ``scaled_dot_product_attention``) and the feed-forward hidden layer (``T x ff_dim``);
* ``action_queue``: ``num_envs x chunk_size x action_dim`` float32 (the queue of predicted
  actions ACT executes before it queries the policy again);
* ``parameters`` (and their half copy under autocast); ``env_state`` when the simulator is on
  the GPU;
* ``cudnn_conv_workspace`` (PyTorch): the largest workspace cuDNN takes in one backbone
  convolution, a transient on top of the layer's input and output (basis: fitted,
  :data:`memfit.core.families.common.CONV_WORKSPACE_BASIS`; elastic: torch runs a smaller
  engine where it cannot be allocated, so on a small card it is an upper bound).

Autocast (``vision.autocast`` or precision bf16/fp16/amp) halves the activations.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from memfit.core._workload_schema import CameraSpec, VisionSpec, Workload, dtype_bytes
from memfit.core.families.common import (
    CONV_WORKSPACE_BASIS,
    CONV_WORKSPACE_TERM,
    Term,
    activation_bytes,
    camera_count,
    camera_hw,
    conv_shapes,
    conv_workspace_bytes,
    param_bytes,
    parameter_terms,
)
from memfit.core.families.registry import Fallback, Family, device_terms, register
from memfit.errors import ConfigError

__all__ = ["FAMILY", "terms", "token_count"]

_F32 = 4


def _vision_and_cameras(workload: Workload) -> tuple[VisionSpec, CameraSpec]:
    """The workload's vision section and cameras, which this family needs."""
    vision = workload.vision
    cams = workload.observations.cameras
    if vision is None or cams is None:
        raise ConfigError(
            "family vision_inference needs vision: and observations.cameras",
            key_path="vision",
            hint="see the act_dual_camera workload in docs/workload.md",
        )
    return vision, cams


def token_count(workload: Workload, values: Mapping[str, int]) -> int:
    """Transformer tokens per rollout: image-feature tokens, extra tokens, chunk queries.

    Raises:
        ConfigError: Without a vision section or cameras.
    """
    vision, cams = _vision_and_cameras(workload)
    h, w = camera_hw(workload, values)
    _, fh, fw = conv_shapes(cams.channels * cams.frame_stack, h, w, vision.backbone)[-1]
    extra = vision.transformer.extra_tokens if vision.transformer else 0
    return camera_count(workload, values) * fh * fw + extra + vision.chunk_size


def terms(workload: Workload, values: Mapping[str, int]) -> list[Term]:
    """Memory terms of a vision policy rollout at these knob values (per device).

    Args:
        workload: A ``family: vision_inference`` workload.
        values: Knob and setting values (``num_envs``; camera sizes when they are knobs).

    Returns:
        Camera frames, backbone activations and features, transformer activations, action
        queue, parameters, env state.

    Raises:
        ConfigError: Without a vision section or cameras, or when the backbone shrinks the
            image to nothing.
    """
    vision, cams = _vision_and_cameras(workload)
    envs = values["num_envs"]
    h, w = camera_hw(workload, values)
    ab = activation_bytes(workload)
    channels = cams.channels * cams.frame_stack
    images = envs * camera_count(workload, values)
    frames = images * h * w * cams.channels * dtype_bytes(cams.dtype) * cams.frame_stack
    shapes = conv_shapes(channels, h, w, vision.backbone)
    sizes = [channels * h * w] + [c * y * x for c, y, x in shapes]
    pair = max(a + b for a, b in itertools.pairwise(sizes))
    out = [
        *parameter_terms(workload, values, training=False),
        Term("env_state", (envs * workload.env_state_bytes,)),
        Term("camera_frames", (frames,)),
        Term("backbone_activations", (images * pair * ab,)),
        Term("backbone_features", (images * sizes[-1] * ab,)),
    ]
    if vision.transformer is not None:
        t = vision.transformer
        tokens = token_count(workload, values)
        per_env = 5 * tokens * t.dim_model + t.heads * tokens * tokens + tokens * t.ff_dim
        out.append(Term("transformer_activations", (envs * per_env * ab,)))
    queue = envs * vision.chunk_size * workload.action_dim * _F32
    out.append(Term("action_queue", (queue,)))
    if workload.framework == "torch":
        ws = conv_workspace_bytes(
            channels, h, w, vision.backbone, images, ab, param_bytes(workload), backward=False
        )
        if ws:
            out.append(Term(CONV_WORKSPACE_TERM, (ws,), basis=CONV_WORKSPACE_BASIS[0]))
    return out


def fallbacks(workload: Workload) -> list[Fallback]:
    """What may fit when the requested rollout does not: cameras at half the resolution
    (a quarter of the pixels, in the frames, the backbone and the renderer), when their size
    is given as numbers. Fewer environments is tried for every family (a pinned knob
    released)."""
    cams = workload.observations.cameras
    if cams is None or not isinstance(cams.height, int) or not isinstance(cams.width, int):
        return []
    if cams.height < 32 or cams.width < 32:
        return []
    h, w = cams.height // 2, cams.width // 2
    changes: dict[str, Any] = {"observations": {"cameras": {"height": h, "width": w}}}
    sim = workload.simulator
    if sim is not None and sim.cameras:
        if not all(isinstance(c.height, int) and isinstance(c.width, int) for c in sim.cameras):
            return []
        changes["simulator"] = {
            "cameras": [
                {**c.model_dump(exclude_none=True), "height": c.height // 2, "width": c.width // 2}
                for c in sim.cameras
                if isinstance(c.height, int) and isinstance(c.width, int)
            ]
        }
    return [Fallback(f"smaller cameras: {h}x{w} instead of {cams.height}x{cams.width}", changes)]


FAMILY = register(
    Family(
        name="vision_inference",
        summary="policy rollout with cameras (ACT-style)",
        terms=device_terms(terms),
        section="vision",
        schema=None,
        requires=(("vision", "family vision_inference needs a vision: section"),),
        required_names=lambda _w: ("num_envs",),
        fallbacks=fallbacks,
    )
)
