"""The strict ``voicechat.realtime`` v3 dialect."""

from .connection import V3Options, V3Session, busy_error
from .schema import PROTOCOL, close_code_for

__all__ = ["PROTOCOL", "V3Options", "V3Session", "busy_error", "close_code_for"]
