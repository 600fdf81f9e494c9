"""Process-wide test settings."""

import os

# The vLLM-Omni tests run CPU fakes: vLLM's app builder infers a device and caches the platform per process, so
# the choice must be made before any test module imports vllm (a user may still override it).
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
