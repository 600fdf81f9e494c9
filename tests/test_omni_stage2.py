"""Stage-2 audio extraction (``omni/stage2.py``): every shape vLLM-Omni's output path can hand the data plane.

Pure, so it runs in the lean venv; the fake-engine tests (tests/test_omni_fake_engine.py) and the engine e2e tests
(tests/test_engine_e2e.py) run it on the real ``MultimodalOutputProcessor``'s outputs."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from vllm_omni_voicechat.omni.stage2 import Stage2AudioError, stage2_audio

PACKET = np.linspace(-0.5, 0.5, 1764, dtype=np.float32)


class FakeTensor:
    """Duck-typed like a torch tensor (the module never imports torch)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def detach(self):
        return self

    def float(self):
        return self

    def cpu(self):
        return self

    def numpy(self):
        return self.array


def out(mm=None, **kw):
    return SimpleNamespace(stage_id=2, multimodal_output=mm, **kw)


@pytest.mark.parametrize("key", ["audio", "model_outputs", "latent"])
def test_the_audio_under_any_of_its_names(key):
    assert np.array_equal(stage2_audio(out({key: PACKET})), PACKET)


def test_a_tensor_a_list_of_one_and_a_list_of_steps():
    assert np.array_equal(stage2_audio(out({"audio": FakeTensor(PACKET)})), PACKET)
    assert np.array_equal(stage2_audio(out({"audio": [FakeTensor(PACKET)]})), PACKET)
    both = stage2_audio(out({"audio": [FakeTensor(PACKET[:1000]), PACKET[1000:]]}))
    assert np.array_equal(both, PACKET) and both.dtype == np.float32
    assert stage2_audio(out({"audio": PACKET.reshape(1, -1)})).shape == (1764,)


def test_wrapped_request_output_and_the_completion_s_dict():
    inner = SimpleNamespace(multimodal_output={"audio": PACKET}, outputs=[])
    assert np.array_equal(stage2_audio(SimpleNamespace(stage_id=2, request_output=inner)), PACKET)
    completion = SimpleNamespace(multimodal_output={"audio": PACKET})
    assert np.array_equal(stage2_audio(SimpleNamespace(stage_id=2, multimodal_output={}, outputs=[completion])),
                          PACKET)


def test_no_audio_is_none():
    assert stage2_audio(out(None)) is None
    assert stage2_audio(out({})) is None
    assert stage2_audio(out({"audio": None, "sr": 22050})) is None


def test_the_sample_rate_is_checked():
    assert stage2_audio(out({"audio": PACKET, "sr": [FakeScalar(22050)]})) is not None
    assert stage2_audio(out({"audio": PACKET, "sample_rate_hz": 22050})) is not None
    with pytest.raises(Stage2AudioError, match="24000 Hz; this runtime needs 22050 Hz"):
        stage2_audio(out({"audio": PACKET, "sr": 24000}))
    with pytest.raises(Stage2AudioError, match="not a number"):
        stage2_audio(out({"audio": PACKET, "sr": "fast"}))


def test_non_numeric_audio_is_a_typed_error():
    with pytest.raises(Stage2AudioError, match="not numeric"):
        stage2_audio(out({"audio": ["a", "b"]}))


class FakeScalar:
    def __init__(self, value):
        self.value = value
        self.size = 1

    def item(self):
        return self.value
