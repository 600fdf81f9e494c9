"""The tiered OpenAI/duplex dialect (vLLM-Omni's vocabulary and the OpenAI lane): the parser, the session
(``connection``) and its projector of core events onto wire events, with the resume journal, the epoch fence and the
playback ledger. See docs/tiered-dialect.md."""
