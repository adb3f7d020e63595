"""Start JAX (and Brax) without their start-up noise in memfit's output.

On a machine without a GPU, JAX's CUDA plugin (installed by the ``gpu-target`` extra) logs a
traceback ending in ``RuntimeError: Unable to load CUDA. Is it installed?`` when JAX first
looks for its backends, jaxlib's C++ writes ``cudart_stub.cc`` lines and absl's
``WARNING: All log messages before absl::InitializeLog() ...`` straight to file descriptor 2,
and importing Brax prints ``Failed to import warp`` (MuJoCo's optional Warp backend) on
stdout, where it would also break ``--json``; making a Brax env from its MJCF (the humanoid,
the ant) warns that Brax is not maintained (:data:`BRAX_NOTICE`). None of it is memfit's or
the user's business: JAX then works on the CPU (or compiles deviceless for a card, in a child
process).

:func:`quiet_jax_start` imports JAX (and Brax, when asked), starts its backends with those
lines held back and writes back every other line; it does nothing once JAX's backends are
started (whatever was going to be said was said).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import sys
import tempfile
from collections.abc import Iterator

__all__ = ["BRAX_NOTICE", "NOISE", "quiet_brax_notices", "quiet_jax_start"]

#: Lines of JAX's, jaxlib's and Brax's start-up that say nothing to a memfit user.
NOISE: tuple[str, ...] = (
    "cudart_stub.cc",
    "All log messages before absl::InitializeLog() is called",
    "Failed to import warp",
    "Failed to import mujoco_warp",
)


#: The start of the ``UserWarning`` Brax's ``brax.io.mjcf`` gives for every env it loads
#: (brax 0.14: Brax's pipelines are no longer maintained, see MJX and MuJoCo Playground).
BRAX_NOTICE = "Brax System, piplines and environments are not actively being maintained"


def quiet_brax_notices() -> None:
    """Keep Brax's :data:`BRAX_NOTICE` warning out of memfit's output (only that warning)."""
    import re
    import warnings

    warnings.filterwarnings("ignore", message=re.escape(BRAX_NOTICE), category=UserWarning)


class _PluginFilter(logging.Filter):
    """Drops JAX's "Jax plugin configuration error" record whose cause is a CUDA that cannot
    be loaded (no driver): JAX goes on without the plugin."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith("Jax plugin configuration error"):
            return True
        exc = record.exc_info[1] if record.exc_info else None
        return not (exc is not None and "Unable to load CUDA" in str(exc))


_FILTER = _PluginFilter()


def _started() -> bool:
    bridge = sys.modules.get("jax._src.xla_bridge")
    check = getattr(bridge, "backends_are_initialized", None)
    return bool(check()) if callable(check) else False


@contextlib.contextmanager
def _held_fd2() -> Iterator[None]:
    """File descriptor 2 into a temporary file for the block; afterwards, every line that is
    not :data:`NOISE` written back."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no fd 2 to hold
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [
                line
                for line in held.read().decode(errors="replace").splitlines(keepends=True)
                if not any(n in line for n in NOISE)
            ]
            if kept:
                with contextlib.suppress(OSError, ValueError):
                    os.write(2, "".join(kept).encode())


def quiet_jax_start(*, brax: bool = False) -> None:
    """Import JAX (and ``brax.envs`` with ``brax=True``) and start its backends, with their
    start-up noise held back (:data:`NOISE`; the CUDA plugin's traceback when no CUDA can be
    loaded); a no-op when JAX's backends are already started. Errors are left to the first
    real use (an ``ImportError`` here is ignored)."""
    logging.getLogger("jax._src.xla_bridge").addFilter(_FILTER)
    if brax:
        quiet_brax_notices()
    if _started() and (not brax or "brax.envs" in sys.modules):
        return
    printed = io.StringIO()
    with _held_fd2(), contextlib.redirect_stdout(printed):
        try:
            import jax

            jax.devices()
            if brax:
                importlib.import_module("brax.envs")
        except Exception:  # the caller's first real use says what is wrong
            pass
    kept = [
        line
        for line in printed.getvalue().splitlines(keepends=True)
        if not any(n in line for n in NOISE)
    ]
    if kept:
        sys.stdout.write("".join(kept))
