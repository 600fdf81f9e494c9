"""vLLM-Omni's real orchestrator, session manager and runner with our plugin over fake stage engines (CPU).

The base of the engine-side Stage 0 runner: one append of 1,280 samples is one Stage-0 submit on the
session's resumable request, Stage-2 audio reaches our plugin's data plane, closing aborts the stage requests.
"""

from __future__ import annotations

import importlib.util
import queue

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None or importlib.util.find_spec("vllm_omni") is None,
    reason="vllm_omni is not installed (create an omni venv with scripts/install_omni_cpu.sh)",
)


@pytest.fixture(scope="module")
def fake():
    import numpy as np

    from .omni_fake_engine import build_fake_engine, voicechat_plugin

    plugin = voicechat_plugin()
    projected: list[tuple[int | None, str | None]] = []
    project = plugin.data_plane.project

    def tap(result, *, context=None):
        for out in result.get("data_plane_outputs", []):
            projected.append((getattr(out, "stage_id", None), getattr(out, "request_id", None)))
        return project(result, context=context)

    plugin.data_plane.project = tap
    decided: list[tuple[int, tuple[int, ...], dict, object]] = []
    decide = plugin.decide_output

    def tap_decide(**kw):
        decided.append((kw["stage_id"], kw["segment_token_ids"], kw["segment_output_metadata"], kw["output"]))
        return decide(**kw)

    plugin.decide_output = tap_decide
    stage2_outputs: list[object] = []

    def tap_stage2(result, *, context=None):
        stage2_outputs.extend(o for o in result.get("data_plane_outputs", []) if getattr(o, "stage_id", None) == 2)
        return tap(result, context=context)

    plugin.data_plane.project = tap_stage2
    built = build_fake_engine(plugin)
    built.projected, built.decided, built.stage2_outputs = projected, decided, stage2_outputs
    built.frame = np.zeros(1280, np.float32).tobytes()

    def drain_events():
        out = []
        while True:
            try:
                message = built.engine.output_queue.sync_q.get_nowait()
            except queue.Empty:
                return out
            event = getattr(message, "event", None)
            out.append(getattr(event, "type", type(message).__name__) if event is not None else type(message).__name__)
            if type(event).__name__ == "ErrorEvent":
                out.append(str(getattr(event, "raw", event))[:300])

    built.drain_events = drain_events
    return built


def test_each_append_is_one_stage0_submit_on_the_resumable_request_and_close_aborts(fake):
    from vllm_omni.engine.duplex.commands import AppendAudio
    from vllm_omni.entrypoints.duplex_omni import DuplexOmni

    from .omni_fake_engine import wait_until

    engine, stage0 = fake.engine, fake.clients[0]
    config = DuplexOmni._resolve_session_config(
        {"modalities": ["audio", "text"], "input_audio_format": "pcm_f32le", "output_audio_format": "pcm16",
         "instructions": "Be brief.", "extra_body": {"auto_response": True}}, model="m")
    sid = "duplex-" + "a" * 32
    assert engine._open_session(sid, config).ok
    for _ in range(5):
        engine._submit_command(sid, AppendAudio(audio=fake.frame, format="pcm_f32le", sample_rate_hz=16000))
    # (the constant audio opens a response at position 5, which vLLM-Omni's runner then plays out with positions of
    # its own: count the first five, not an exact total a poll may miss)
    wait_until(lambda: len(stage0.requests) >= 5 and len(fake.stage2_packets) >= 5,
               state=lambda: (len(stage0.requests), len(fake.stage2_packets), fake.drain_events()))

    ids = {r.request_id for r in stage0.requests}
    assert len(ids) == 1 and next(iter(ids)).endswith(".r.stage0")  # one resumable Stage-0 request
    seqs = [r.model_intermediate_buffer["duplex"]["seq"] for r in stage0.requests[:5]]
    assert seqs == [1, 2, 3, 4, 5]
    assert all(r.resumable for r in stage0.requests)
    assert len(stage0.requests[0].prompt_token_ids) > len(stage0.requests[1].prompt_token_ids)  # prompt + frame 0
    wait_until(lambda: sum(1 for stage, _ in fake.projected if stage == 2) >= 5)

    assert engine._close_session(sid).ok
    wait_until(lambda: next(iter(ids)) in stage0.aborted)
    wait_until(lambda: not fake.orchestrator.request_states)
    drained = []
    while True:
        try:
            drained.append(engine.output_queue.sync_q.get_nowait())
        except queue.Empty:
            break
    assert drained  # session events flowed back to the API side


def test_stage_outputs_reach_the_plugin_through_vllm_omnis_real_output_processor(fake):
    """Every stage's engine-core outputs go through ``MultimodalOutputProcessor`` (the class vLLM-Omni's
    ``build_engine_output_processor`` builds), registered by the orchestrator's own submits: Stage 0's per
    position, Stages 1-2 by the async-chunk prewarm. So the plugin sees the real processor's request outputs."""
    import numpy as np
    import torch
    from vllm.outputs import RequestOutput
    from vllm_omni.engine.duplex.commands import AppendAudio
    from vllm_omni.entrypoints.duplex_omni import DuplexOmni
    from vllm_omni.outputs.mm_outputs import MultimodalPayload
    from vllm_omni.outputs.output_processor import MultimodalOutputProcessor

    from vllm_omni_voicechat.omni.stage2 import stage2_audio

    from .omni_fake_engine import PAD, wait_until

    assert [type(pool.output_processor) for pool in fake.orchestrator.stage_pools] == [MultimodalOutputProcessor] * 3
    engine = fake.engine
    config = DuplexOmni._resolve_session_config(
        {"modalities": ["audio", "text"], "input_audio_format": "pcm_f32le", "output_audio_format": "pcm16",
         "instructions": "Be brief.", "extra_body": {"auto_response": True}}, model="m")
    sid = "duplex-" + "b" * 32
    decided0, stage2_0, req0 = len(fake.decided), len(fake.stage2_outputs), len(fake.clients[0].requests)
    assert engine._open_session(sid, config).ok
    for _ in range(3):
        engine._submit_command(sid, AppendAudio(audio=fake.frame, format="pcm_f32le", sample_rate_hz=16000))
    wait_until(lambda: sum(1 for d in fake.decided[decided0:] if d[0] == 0) >= 3
               and len(fake.stage2_outputs) - stage2_0 >= 3,
               state=lambda: (len(fake.decided) - decided0, len(fake.stage2_outputs) - stage2_0))
    rid = fake.clients[0].requests[req0].request_id
    # the orchestrator's async-chunk prewarm registered Stages 1 and 2 (one request each, the session's id)
    assert [r.request_id for r in fake.clients[1].requests if r.request_id == rid] == [rid]
    assert [r.request_id for r in fake.clients[2].requests if r.request_id == rid] == [rid]

    stage0 = [d for d in fake.decided[decided0:] if d[0] == 0 and d[3].request_id == rid][:3]
    for _, tokens, metadata, output in stage0:
        assert isinstance(output, RequestOutput)  # the processor's, not a stand-in
        assert tokens == (PAD,) and list(output.outputs[0].token_ids) == [PAD]
        assert isinstance(output.outputs[0].multimodal_output, MultimodalPayload)
        assert torch.equal(metadata["nvc_function_token"], torch.tensor([PAD]))

    # Stage 2: the codec's ``model_outputs`` + int32 ``sr``, as the processor hands them on (``audio``)
    outs = [o for o in fake.stage2_outputs[stage2_0:] if o.request_id == rid][:3]
    seqs = [r.model_intermediate_buffer["duplex"]["seq"] for r in fake.clients[0].requests[req0:req0 + 3]]
    assert seqs == [1, 2, 3]
    for output, seq in zip(outs, seqs):
        mm = output.outputs[0].multimodal_output  # the processor's MultimodalCompletionOutput, wrapped
        assert isinstance(mm, MultimodalPayload) and "audio" in mm and "model_outputs" not in mm
        np.testing.assert_array_equal(stage2_audio(output), np.full(1764, seq / 1000, np.float32))
    assert engine._close_session(sid).ok
    wait_until(lambda: rid in fake.clients[0].aborted)
