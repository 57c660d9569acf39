"""The facts probes produce and gates judge, in one import (compatibility).

The model lives in :mod:`afddiag.model`: fabric facts in :mod:`afddiag.model.fabric`, GPU facts in
:mod:`afddiag.model.gpu`, host facts in :mod:`afddiag.model.host`. New code imports from there.
"""

from __future__ import annotations

from afddiag.model import to_jsonable  # noqa: F401
from afddiag.model.fabric import *  # noqa: F401,F403
from afddiag.model.fabric import ERRNO_WORDS, errno_words  # noqa: F401
from afddiag.model.gpu import *  # noqa: F401,F403
from afddiag.model.gpu import _int, _num  # noqa: F401
from afddiag.model.host import *  # noqa: F401,F403
