"""Memory terms every family shares: parameters, gradients, optimizer state, activations of
MLP and CNN networks, observation sizes, and the allocator's reserved-vs-allocated slack.

Every function is pure: workload facts and knob values in, bytes (``int``) out.

Sources:

* Parameter, gradient and optimizer-state sizes: one value per parameter in the parameter
  dtype; ``torch.optim.Adam``/``AdamW`` keep two states (``exp_avg``, ``exp_avg_sq``) shaped
  like the parameter, SGD with momentum and RMSprop one, plain SGD none. Under mixed precision
  (``amp``) the master weights, gradients and states stay fp32 and the half-precision copies of
  the weights come on top (autocast's weight cache).
* Activations kept for backward: each layer keeps its input and its pre-activation output, so
  an MLP keeps about ``2 x sum(widths)`` values per item; convolution output sizes follow
  ``floor((size + 2 * padding - kernel) / stride) + 1`` (``torch.nn.Conv2d`` docs).
* Allocator slack: PyTorch's caching allocator rounds each block to 512 bytes and takes 2 MiB
  segments for requests up to 1 MiB, 20 MiB segments up to 10 MiB and 2 MiB-rounded segments
  above (``c10/cuda/CUDACachingAllocator.cpp``, :mod:`memfit.allocator.model`). XLA's BFC
  allocator rounds each allocation to 256 bytes (``kMinAllocationSize`` in
  ``xla/tsl/framework/bfc_allocator.h``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from memfit.allocator.model import (
    K_LARGE_BUFFER,
    K_MIN_LARGE_ALLOC,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    round_size,
    segment_size,
)
from memfit.core._workload_schema import ConvLayer, Dtype, NetworkSpec, Workload, dtype_bytes
from memfit.core.families.registry import Term
from memfit.errors import ConfigError
from memfit.hardware.cuda import CUDNN_FITTED, CUDNN_FITTED_SOURCE

__all__ = [
    "CONV_WORKSPACE_BASIS",
    "CONV_WORKSPACE_TERM",
    "MODEL_TERMS",
    "Term",
    "activation_bytes",
    "allocator_slack",
    "camera_count",
    "camera_hw",
    "conv_shapes",
    "conv_weight_counts",
    "conv_workspace_bytes",
    "ddp_terms",
    "fsdp_terms",
    "network_input",
    "network_output_width",
    "network_param_counts",
    "network_widths",
    "observation_bytes",
    "optimizer_state_count",
    "param_bytes",
    "parameter_terms",
]

#: Terms an estimator's measurement replaces (parameters, gradients, states, activations).
MODEL_TERMS = frozenset(
    {
        "parameters",
        "parameters_amp_copy",
        "gradients",
        "optimizer_state",
        "activations",
        "ddp_gradient_buckets",
        "fsdp_all_gather",
        "fsdp_reduce_scatter",
        "target_network",
        "cudnn_conv_workspace",
    }
)

_BFC_ROUND = 256


def param_bytes(workload: Workload) -> int:
    """Bytes per stored parameter (fp32 master weights under amp)."""
    return 2 if workload.precision in ("bf16", "fp16") else 4


def activation_bytes(workload: Workload) -> int:
    """Bytes per activation value: 2 under bf16, fp16 and amp (autocast), else 4."""
    if workload.precision in ("bf16", "fp16", "amp"):
        return 2
    if workload.vision is not None and workload.vision.autocast:
        return 2
    return 4


def optimizer_state_count(workload: Workload) -> int:
    """States per parameter: Adam/AdamW 2, SGD with momentum and RMSprop 1, SGD and none 0
    (``optimizer_states`` in the workload overrides)."""
    if workload.optimizer_states is not None:
        return workload.optimizer_states
    return {"adam": 2, "adamw": 2, "sgd_momentum": 1, "rmsprop": 1, "sgd": 0, "none": 0}[
        workload.optimizer
    ]


def camera_hw(workload: Workload, values: Mapping[str, int]) -> tuple[int, int]:
    """Camera height and width, resolving knob or setting names.

    Raises:
        ConfigError: When there are no cameras.
    """
    cams = workload.observations.cameras
    if cams is None:
        raise ConfigError(
            "this model needs observations.cameras",
            key_path="observations",
            hint="add observations: {cameras: {count, height, width}}",
        )
    h = values[cams.height] if isinstance(cams.height, str) else cams.height
    w = values[cams.width] if isinstance(cams.width, str) else cams.width
    for axis, ref, value in (("height", cams.height, h), ("width", cams.width, w)):
        if value < 1:  # a knob or setting the camera names, at 0: no image, not a free one
            raise ConfigError(
                f"observations.cameras.{axis} is {value} (from {ref!r}): a camera has at "
                "least one pixel a side",
                key_path=f"observations.cameras.{axis}",
                hint=f"give {ref} a value of at least 1",
            )
    return h, w


def camera_count(workload: Workload, values: Mapping[str, int]) -> int:
    """Cameras per environment, resolving a knob or setting name (0 without cameras)."""
    cams = workload.observations.cameras
    if cams is None:
        return 0
    return values[cams.count] if isinstance(cams.count, str) else cams.count


def observation_bytes(
    workload: Workload, values: Mapping[str, int], *, stored: bool = False
) -> int:
    """Bytes of one observation: vector, stacked raster and camera frames, each in its dtype;
    with ``stored``, as a buffer keeps it (``observations.storage_dtype`` where given)."""
    obs = workload.observations
    keep = obs.storage_dtype if stored else None

    def size(dtype: Dtype) -> int:
        return dtype_bytes(keep or dtype)

    total = obs.vector * size(obs.dtype)
    if obs.raster is not None:
        r = obs.raster
        total += r.channels * r.frame_stack * r.height * r.width * size(r.dtype)
    if obs.cameras is not None:
        c = obs.cameras
        h, w = camera_hw(workload, values)
        count = camera_count(workload, values)
        total += count * h * w * c.channels * c.frame_stack * size(c.dtype)
    return total


def conv_shapes(
    channels: int, height: int, width: int, layers: Sequence[ConvLayer]
) -> list[tuple[int, int, int]]:
    """Output shape ``(C, H, W)`` after each layer (repeats expanded).

    Raises:
        ConfigError: When a layer would shrink the map to nothing.

    >>> conv_shapes(3, 84, 84, [ConvLayer(out_channels=32, kernel=8, stride=4)])
    [(32, 20, 20)]
    """
    shapes: list[tuple[int, int, int]] = []
    c, h, w = channels, height, width
    for index, layer in enumerate(layers):
        for rep in range(layer.repeat):
            # later repeats of a stage keep the size: stride 1, "same" padding for convs
            stride = layer.stride if rep == 0 else 1
            pad = layer.padding
            if rep > 0 and layer.kind == "conv":
                pad = (layer.kernel - 1) // 2
            h = (h + 2 * pad - layer.kernel) // stride + 1
            w = (w + 2 * pad - layer.kernel) // stride + 1
            if h < 1 or w < 1:
                raise ConfigError(
                    f"layer {index} leaves a {h}x{w} feature map",
                    key_path=f"conv[{index}]",
                    hint="use a larger input, a smaller kernel or stride, or padding",
                )
            if layer.kind == "conv":
                assert layer.out_channels is not None  # the schema requires it
                c = layer.out_channels
            shapes.append((c, h, w))
    return shapes


def conv_weight_counts(channels: int, layers: Sequence[ConvLayer]) -> list[int]:
    """Parameter counts of each conv weight and bias (pool layers have none)."""
    counts: list[int] = []
    c = channels
    for layer in layers:
        if layer.kind != "conv":
            continue
        assert layer.out_channels is not None
        for _ in range(layer.repeat):
            counts.append(layer.out_channels * c * layer.kernel * layer.kernel)
            counts.append(layer.out_channels)
            c = layer.out_channels
    return counts


#: The term of cuDNN's convolution workspace in a plan (PyTorch workloads on CUDA).
CONV_WORKSPACE_TERM = "cudnn_conv_workspace"

#: How :data:`CONV_WORKSPACE_TERM` is obtained: ``(basis, source)``.
CONV_WORKSPACE_BASIS = ("fitted", CUDNN_FITTED_SOURCE)


def conv_workspace_bytes(
    channels: int,
    height: int,
    width: int,
    layers: Sequence[ConvLayer],
    items: int,
    act_bytes: int,
    param_bytes: int,
    *,
    backward: bool,
) -> int:
    """The largest workspace cuDNN takes in one convolution kernel of a network (a transient,
    one kernel at a time): a fitted factor times the kernel's input, output and filter bytes
    (:data:`memfit.hardware.cuda.CUDNN_FITTED`; basis :data:`CONV_WORKSPACE_BASIS`), as a
    card with room gives it.

    Args:
        channels, height, width: The network's input.
        layers: Its convolution stack.
        items: Images per call (batch x cameras).
        act_bytes, param_bytes: Bytes per activation and per parameter.
        backward: Whether the network trains (backward data and filter kernels too; the
            first layer's input takes no gradient).

    >>> conv_workspace_bytes(4, 84, 84, [ConvLayer(out_channels=32, kernel=8, stride=4)], 2, 4, 4,
    ...                      backward=False)
    360960
    """
    best = 0
    c, h, w = channels, height, width
    shapes = iter(conv_shapes(channels, height, width, layers))
    weights = iter(conv_weight_counts(channels, layers))
    first = True
    for layer in layers:
        for _ in range(layer.repeat):
            oc, oh, ow = next(shapes)
            if layer.kind == "conv":
                weight = next(weights)
                next(weights)  # the bias
                base = items * (c * h * w + oc * oh * ow) * act_bytes + weight * param_bytes
                kinds = ["forward"]
                if backward:
                    kinds += ["backward_filter"] if first else ["backward_data", "backward_filter"]
                for kind in kinds:
                    best = max(best, int(base * CUDNN_FITTED[kind][0]))
                first = False
            c, h, w = oc, oh, ow
    return best


def network_input(
    workload: Workload, net: NetworkSpec, values: Mapping[str, int]
) -> tuple[int, int, int]:
    """Input shape ``(C, H, W)`` of a network (``(D, 1, 1)`` for a vector).

    Raises:
        ConfigError: When the network reads an observation the workload does not have.
    """
    obs = workload.observations
    kind = net.input or (
        ("raster" if obs.raster is not None else "camera") if net.conv else "vector"
    )
    if kind == "raster":
        if obs.raster is None:
            raise ConfigError(
                "network input raster needs observations.raster",
                key_path="observations.raster",
                hint="add observations: {raster: {channels, height, width}}, or set the "
                "network's input:",
            )
        r = obs.raster
        return r.channels * r.frame_stack, r.height, r.width
    if kind == "camera":
        cams = obs.cameras
        if cams is None:
            raise ConfigError(
                "network input camera needs observations.cameras",
                key_path="observations.cameras",
                hint="add observations: {cameras: {count, height, width}}, or set the "
                "network's input:",
            )
        h, w = camera_hw(workload, values)
        return cams.channels * cams.frame_stack, h, w
    if obs.vector < 1:
        raise ConfigError(
            "an MLP network reads observations.vector, which is 0",
            key_path="observations.vector",
            hint="give observations: {vector: DIM}, or conv: layers over a raster or cameras",
        )
    return obs.vector, 1, 1


def network_output_width(workload: Workload, net: NetworkSpec, values: Mapping[str, int]) -> int:
    """Values per item of a network's output: its last layer, else its last conv map
    flattened (what a head on this network as its ``trunk`` reads).

    Raises:
        ConfigError: When the network is given as a bare ``params`` count (its output width
            is unknown) or reads an observation the workload lacks.
    """
    if net.params is not None:
        raise ConfigError(
            "a trunk given as params: has no known output width",
            key_path="networks",
            hint="describe the trunk with conv: and layers:, or give the head its own input",
        )
    if net.layers:
        return net.layers[-1]
    return _flat_features(workload, net, values)


def _flat_features(workload: Workload, net: NetworkSpec, values: Mapping[str, int]) -> int:
    """Values per item entering the MLP part: the trunk's output, or the input (after the
    conv layers), plus the action for a critic ``Q(obs, action)``."""
    action = workload.action_dim if net.action_input else 0
    if net.trunk is not None:
        return network_output_width(workload, workload.networks[net.trunk], values) + action
    c, h, w = network_input(workload, net, values)
    if net.conv:
        oc, oh, ow = conv_shapes(c, h, w, net.conv)[-1]
        return oc * oh * ow + action
    return c * h * w + action


def network_widths(workload: Workload, net: NetworkSpec, values: Mapping[str, int]) -> list[int]:
    """Values per item of the input and of each layer's output (conv maps, then MLP), for
    every copy of the network (twin critics count twice). A head on a trunk starts at the
    trunk's features (the trunk's own maps are the trunk network's)."""
    if net.params is not None:
        return []
    if net.trunk is not None:
        widths = [_flat_features(workload, net, values)]
    else:
        c, h, w = network_input(workload, net, values)
        widths = [c * h * w + (workload.action_dim if net.action_input and not net.conv else 0)]
        if net.conv:
            for oc, oh, ow in conv_shapes(c, h, w, net.conv):
                widths.append(oc * oh * ow)
    widths.extend(net.layers or [])
    return widths * net.copies


def network_param_counts(
    workload: Workload, net: NetworkSpec, values: Mapping[str, int]
) -> list[int]:
    """Parameter counts of each weight and bias tensor (one entry for ``params:``), for every
    copy of the network."""
    if net.params is not None:
        return [net.params] * net.copies
    counts: list[int] = []
    if net.conv:
        c, _h, _w = network_input(workload, net, values)
        counts.extend(conv_weight_counts(c, net.conv))
    prev = _flat_features(workload, net, values)
    for width in net.layers or []:
        counts.append(prev * width)
        counts.append(width)
        prev = width
    return counts * net.copies


def parameter_terms(
    workload: Workload, values: Mapping[str, int], *, training: bool = True
) -> list[Term]:
    """Parameters, the amp copy, gradients, optimizer state, target networks, DDP buckets.

    Per device: FSDP shards parameters, gradients and states over ``devices.count``; DDP keeps
    a gradient bucket copy (``gradient_as_bucket_view=False``, the default); JAX pmap and
    single devices keep everything whole.
    """
    pb = param_bytes(workload)
    trained: list[int] = []
    target: list[int] = []
    for net in workload.networks.values():
        counts = network_param_counts(workload, net, values)
        (target if net.target else trained).extend(counts)
    dev = workload.devices
    fsdp = dev.strategy == "fsdp" and dev.fsdp_sharding != "no_shard"
    shard = dev.count if fsdp else 1
    # shard_grad_op and hybrid_shard keep what full_shard shards: hybrid shards within one
    # node only (taken as all devices here), shard_grad_op keeps parameters whole
    param_shard = 1 if dev.fsdp_sharding == "shard_grad_op" else shard

    def sized(counts: Sequence[int], nbytes: int, by: int = shard) -> tuple[int, ...]:
        return tuple(-(-n // by) * nbytes for n in counts)

    terms = [Term("parameters", sized(trained, pb, param_shard))]
    if workload.precision == "amp" or (workload.vision is not None and workload.vision.autocast):
        terms.append(Term("parameters_amp_copy", tuple(n * 2 for n in trained)))
    if target:
        terms.append(Term("target_network", sized(target, pb)))
    if not training:
        return terms
    terms.append(Term("gradients", sized(trained, pb)))
    states = optimizer_state_count(workload)
    if states:
        terms.append(Term("optimizer_state", sized(trained, pb) * states))
    if dev.strategy == "ddp" or (dev.strategy == "fsdp" and dev.fsdp_sharding == "no_shard"):
        terms.extend(ddp_terms(sum(trained) * pb, dev.gradient_as_bucket_view))
    elif fsdp and trained:
        terms.extend(fsdp_terms(trained, pb, dev.fsdp_sharding))
    return terms


def ddp_terms(grad_bytes: int, gradient_as_bucket_view: bool) -> list[Term]:
    """DDP's gradient buckets: flat tensors as large as all gradients together, however
    ``bucket_cap_mb`` splits them (torch/csrc/distributed/c10d/reducer.cpp); none beside the
    gradients with ``gradient_as_bucket_view=True`` (the gradients are views into them).
    ``static_graph`` changes no memory.

    >>> [t.name for t in ddp_terms(1000, False)], ddp_terms(1000, True)
    (['ddp_gradient_buckets'], [])
    """
    return [] if gradient_as_bucket_view else [Term("ddp_gradient_buckets", (grad_bytes,))]


def fsdp_terms(unit_counts: Sequence[int], nbytes: int, sharding: str) -> list[Term]:
    """FSDP's gathered buffers: the largest unit's parameters unsharded for the all-gather,
    twice with ``full_shard``/``hybrid_shard`` (the unit running and the next prefetched,
    ``forward_prefetch``/``backward_prefetch`` defaults), and its gradient unsharded for the
    reduce-scatter (torch/distributed/fsdp/_flat_param.py; FSDP2's
    ``fully_shard`` allocates the same all-gather and reduce-scatter outputs). A unit here is a
    layer of the network, as an auto-wrap policy per layer makes it.

    >>> [(t.name, t.tensors) for t in fsdp_terms([10, 30], 4, "full_shard")]
    [('fsdp_all_gather', (120, 120)), ('fsdp_reduce_scatter', (120,))]
    """
    unit = max(unit_counts) * nbytes
    gathers = 1 if sharding == "shard_grad_op" else 2
    return [
        Term("fsdp_all_gather", (unit,) * gathers),
        Term("fsdp_reduce_scatter", (unit,)),
    ]


def allocator_slack(framework: str, tensors: Sequence[int]) -> int:
    """Reserved minus allocated bytes for these buffers, all live at once.

    PyTorch: 512-byte rounding, small requests packed into 2 MiB segments, requests up to
    10 MiB packed into 20 MiB segments, larger ones each in a segment rounded up to 2 MiB.
    JAX/XLA: 256-byte rounding inside its pool.

    >>> allocator_slack("torch", [100])  # one small block: a 2 MiB segment
    2097052
    >>> allocator_slack("jax", [100])
    156
    """
    if framework == "jax":
        return sum(-(-t // _BFC_ROUND) * _BFC_ROUND - t for t in tensors if t > 0)
    slack = 0
    small = 0
    mid = 0
    for t in tensors:
        if t <= 0:
            continue
        r = round_size(t)
        slack += r - t
        if r <= K_SMALL_SIZE:
            small += r
        elif r < K_MIN_LARGE_ALLOC:
            mid += r
        else:
            slack += segment_size(r) - r
    if small:
        slack += -(-small // K_SMALL_BUFFER) * K_SMALL_BUFFER - small
    if mid:
        slack += -(-mid // K_LARGE_BUFFER) * K_LARGE_BUFFER - mid
    return slack
