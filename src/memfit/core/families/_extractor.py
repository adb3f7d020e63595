"""A frozen feature extractor beside the learner (``feature_extractor:``): its memory terms.

Isaac Lab's ``image_features`` observation term (``isaaclab/envs/mdp/observations.py``) runs
a pretrained encoder (``resnet18``, ``theia``) on every environment's camera image each step
under ``torch.inference_mode``: the ``uint8`` images become a float copy (``permute``,
``float() / 255``, then normalised with the model's mean and standard deviation), the model
runs layer by layer, and its pooled features join the policy's observation. Nothing of it is
trained. Terms, per device:

* ``extractor_parameters``: the model's parameters in its dtype;
* ``extractor_input``: the float copy of ``num_envs x count`` images;
* ``extractor_activations``: the largest moment of one layer's forward: its input and its
  output (with batch normalisation, the convolution's output and the normalised copy, before
  the in-place ReLU). Under inference mode nothing is kept for a backward.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from memfit.core.families.common import Term, camera_count, camera_hw, conv_shapes
from memfit.core.workload import Workload

__all__ = ["extractor_terms"]

_DTYPE = {"float32": 4, "float16": 2, "bfloat16": 2}


def _input(workload: Workload, values: Mapping[str, int]) -> tuple[int, int, int]:
    """``(height, width, images per env)`` of the extractor's input."""
    fx = workload.feature_extractor
    assert fx is not None
    if fx.height is not None and fx.width is not None:
        h = values[fx.height] if isinstance(fx.height, str) else fx.height
        w = values[fx.width] if isinstance(fx.width, str) else fx.width
    else:
        h, w = camera_hw(workload, values)
    if fx.count is not None:
        count = values[fx.count] if isinstance(fx.count, str) else fx.count
    else:
        count = max(1, camera_count(workload, values))
    return h, w, count


def extractor_terms(workload: Workload, values: Mapping[str, int]) -> list[Term]:
    """The frozen extractor's terms at these knob values (per device).

    Raises:
        ConfigError: When the backbone shrinks the image to nothing, or the extractor reads
            cameras the workload lacks.
    """
    fx = workload.feature_extractor
    assert fx is not None
    nbytes = _DTYPE[fx.dtype]
    h, w, count = _input(workload, values)
    images = values.get("num_envs", 1) * count
    first = fx.channels * h * w
    sizes = [first] + [c * y * x for c, y, x in conv_shapes(fx.channels, h, w, fx.backbone)]
    copies = 2 if fx.batch_norm else 1
    # the float input stays referenced by the caller through the whole forward
    pairs = enumerate(itertools.pairwise(sizes))
    peak = max(copies * out + (prev if i > 0 else 0) for i, (prev, out) in pairs)
    return [
        Term("extractor_parameters", (fx.params * nbytes,)),
        Term("extractor_input", (images * first * nbytes,)),
        Term("extractor_activations", (images * peak * nbytes,)),
    ]
