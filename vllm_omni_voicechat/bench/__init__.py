"""The voicechat latency benchmark, free of vLLM: the workload (``workload``), a session driver over either wire
dialect (``driver``) and per-turn measurement from timestamped events (``metrics``). ``omni/bench.py`` plugs it
into ``vllm-omni bench serve``; other benchmarks and tests can use it directly."""
