"""The tiered OpenAI/duplex dialect (vLLM-Omni's vocabulary): pure building blocks so far — the resume journal,
the epoch fence and the playback ledger. See docs/tiered-dialect.md."""
