"""``memfit.estimate.xla_gpu``: the public path of :mod:`memfit.estimate.xla.gpu`.

XLA's GPU compiler for a named card, without the card. Importing this module gives that module
itself (one module object: a patch or an attribute read through either name is the same), so
code written against the old flat layout keeps working.
"""

import sys

from memfit.estimate.xla import gpu as _module
from memfit.estimate.xla.gpu import *  # noqa: F403

sys.modules[__name__] = _module
