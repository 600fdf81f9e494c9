"""The strict ``voicechat.realtime`` v3 dialect."""

from .connection import V3Options, V3Session
from .schema import PROTOCOL, close_code_for

__all__ = ["PROTOCOL", "V3Options", "V3Session", "close_code_for"]
