"""``memfit.estimate.torch_trace``: the public path of :mod:`memfit.estimate.torch.trace`.

The torch trace. Importing this module gives that module itself (one module object: a patch or
an attribute read through either name is the same), so code written against the old flat layout
keeps working.
"""

import sys

from memfit.estimate.torch import trace as _module
from memfit.estimate.torch.trace import *  # noqa: F403

sys.modules[__name__] = _module
