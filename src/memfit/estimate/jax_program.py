"""``memfit.estimate.jax_program``: the public path of :mod:`memfit.estimate.xla.program`.

A JAX training loop replayed through XLA's BFC allocator. Importing this module gives that
module itself (one module object: a patch or an attribute read through either name is the same),
so code written against the old flat layout keeps working.
"""

import sys

from memfit.estimate.xla import program as _module
from memfit.estimate.xla.program import *  # noqa: F403

sys.modules[__name__] = _module
