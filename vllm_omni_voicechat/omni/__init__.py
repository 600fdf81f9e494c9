"""Integration with the real vLLM-Omni stack (``vllm`` / ``vllm_omni``), which is optional: see
``scripts/install_omni_cpu.sh`` for a CPU-only install and ``cpu_shim`` for what that install needs.
``plugin.VoiceChatDuplexPlugin`` is our ``DuplexModelPlugin`` (loaded by ``load_duplex_plugin``)."""
