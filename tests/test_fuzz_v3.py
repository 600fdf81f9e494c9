"""Protocol fuzzing of the v3 dialect, in-process (docs/reliability.md, "Fuzzing").

Seed-fixed generated client streams (valid, invalid and hostile events, model behaviours, disconnects) drive
``V3Session`` over the simulator; every server event goes through the trace checker. Zero crashes, hangs,
invariant violations, and every session that only saw recoverable errors still answers a valid turn.
``benchmarks/fuzz.py`` runs the same generator at 100,000+ events.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .fuzz import FuzzStats, fuzz


def assert_clean(stats: FuzzStats) -> None:
    summary = stats.summary()
    assert stats.ok, json.dumps(summary, indent=1)[:6000]


@settings(max_examples=10, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
def test_generated_v3_streams_keep_every_invariant(seed):
    stats = fuzz("v3", seed=seed, events=500)
    assert_clean(stats)
    assert stats.client_events >= 500 and stats.episodes >= 1


def test_v3_fuzz_covers_the_error_table_and_fatal_paths():
    """One fixed seed, checked for coverage: the generator must reach the rejections and endings it claims."""
    stats = fuzz("v3", seed=20261130, events=3000)
    assert_clean(stats)
    seen = set(stats.errors_by_code)
    for code in ("invalid_json", "invalid_event", "unsupported_event", "binary_audio_unsupported",
                 "session_not_configured", "unsupported_audio_encoding", "unsupported_sample_rate",
                 "unsupported_channel_count", "empty_audio", "invalid_audio", "audio_packet_too_large",
                 "invalid_conversation_item", "settings_locked", "input_turn_conflict"):
        assert code in seen, (code, sorted(seen))
    assert stats.usability_checks > 0
    assert {e.split()[0] for e in stats.endings} >= {"close", "disconnect"}
