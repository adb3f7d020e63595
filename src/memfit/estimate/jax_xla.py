"""``memfit.estimate.jax_xla``: the public path of :mod:`memfit.estimate.xla.step`.

One JAX step compiled. Importing this module gives that module itself (one module object: a
patch or an attribute read through either name is the same), so code written against the old
flat layout keeps working.
"""

import sys

from memfit.estimate.xla import step as _module
from memfit.estimate.xla.step import *  # noqa: F403

sys.modules[__name__] = _module
