"""The ``vllm-omni-voicechat`` command line: the simulator default and the vllm-omni delegation argv."""

from __future__ import annotations

import subprocess
import sys

from vllm_omni_voicechat.omni.register import PACKAGED_DEPLOY_CONFIG
from vllm_omni_voicechat.omni.serve import engine_env, omni_argv


def test_a_checkpoint_is_served_by_vllm_omni_with_our_packaged_deploy_yaml():
    assert omni_argv("nvidia/NVIDIA-NemotronLabs-VoiceChat-11B", ["--port", "9000"]) == [
        "vllm-omni", "serve", "nvidia/NVIDIA-NemotronLabs-VoiceChat-11B", "--port", "9000", "--omni",
        "--deploy-config", str(PACKAGED_DEPLOY_CONFIG),
    ]


def test_an_explicit_deploy_config_and_omni_flag_are_kept():
    argv = omni_argv("m", ["--omni", "--deploy-config=deploy/voicechat.yaml"])
    assert argv == ["vllm-omni", "serve", "m", "--omni", "--deploy-config=deploy/voicechat.yaml"]


def test_the_engine_environment_is_set_unless_the_caller_set_it():
    assert engine_env({}) == {"VLLM_OMNI_EVENT_DRIVEN_ORCH": "1"}
    assert engine_env({"VLLM_TARGET_DEVICE": "cpu"}) == {"VLLM_OMNI_EVENT_DRIVEN_ORCH": "1",
                                                       "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert engine_env({"VLLM_TARGET_DEVICE": "cpu", "VLLM_OMNI_EVENT_DRIVEN_ORCH": "0",
                       "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}) == {}


def test_serve_help_of_the_simulator_default_needs_no_vllm():
    done = subprocess.run([sys.executable, "-m", "vllm_omni_voicechat.cli", "serve", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--realtime-default" in done.stdout
    assert PACKAGED_DEPLOY_CONFIG.is_file()


def test_make_tiny_checkpoint_parses_without_importing_torch():
    code = ("import sys; from vllm_omni_voicechat.cli import build_parser; "
            "a = build_parser().parse_args(['make-tiny-checkpoint', 'out', '--seed', '3']); "
            "print(a.command, a.directory, a.seed, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["make-tiny-checkpoint", "out", "3", "False"]
