"""Deterministic CPU simulator of the full-duplex speech model."""
