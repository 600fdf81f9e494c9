"""The model port: per-position controls in, step result out."""

from .port import *  # noqa: F401,F403
from .port import __all__  # noqa: F401
