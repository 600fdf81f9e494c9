"""The package's public names: each importable from the package itself, loaded lazily."""

from __future__ import annotations

import subprocess
import sys

import pytest

import vllm_omni_voicechat

PUBLIC = {
    "SessionCore": "vllm_omni_voicechat.session.core",
    "SessionConfig": "vllm_omni_voicechat.session.core",
    "V3Session": "vllm_omni_voicechat.wire.v3",
    "TieredSession": "vllm_omni_voicechat.wire.tiered.connection",
    "create_app": "vllm_omni_voicechat.server",
    "ServerConfig": "vllm_omni_voicechat.server",
    "V3Client": "vllm_omni_voicechat.client",
    "SimulatorModel": "vllm_omni_voicechat.sim.model",
    "render_speech": "vllm_omni_voicechat.sim",
    "decode_speech": "vllm_omni_voicechat.sim",
}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_each_public_name_imports_from_the_package(name):
    namespace: dict = {}
    exec(f"from vllm_omni_voicechat import {name}", namespace)
    home = __import__(PUBLIC[name], fromlist=[name])
    assert namespace[name] is getattr(home, name)
    assert name in vllm_omni_voicechat.__all__ and name in dir(vllm_omni_voicechat)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError):
        vllm_omni_voicechat.NoSuchThing  # noqa: B018


def test_importing_the_package_loads_none_of_it():
    code = ("import sys, vllm_omni_voicechat; "
            "print(sorted(m for m in sys.modules if m.startswith(('vllm_omni_voicechat.', 'numpy', 'starlette'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_simulator_speech_codec_is_reexported_by_sim():
    from vllm_omni_voicechat.audio.speech import decode_speech, render_speech
    from vllm_omni_voicechat.sim import decode_speech as sim_decode
    from vllm_omni_voicechat.sim import render_speech as sim_render

    assert (sim_render, sim_decode) == (render_speech, decode_speech)
    assert sim_decode(sim_render("hi there"), 16_000) == "hi there"
