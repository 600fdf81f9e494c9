"""Model-owned turn taking (the tiered dialect's policy) through the session core on the simulator."""

from __future__ import annotations

import dataclasses

from vllm_omni_voicechat.audio.speech import decode_speech, render_speech
from vllm_omni_voicechat.session.commands import AppendAudio, CancelResponse, ClearInput, CommitInput
from vllm_omni_voicechat.sim.model import SimulatorModel

from .helpers import LOUD_NOISE_FRAME, SILENCE_FRAME, R, T, audio, metrics, names, protocol, session

REPLY_HELLO = [
    ("ResponseCreated", T(1), R(1)),
    ("TextDelta", T(1), R(1), "You", "You"),
    ("TextDelta", T(1), R(1), " sai", "You sai"),
    ("TextDelta", T(1), R(1), "d:", "You said:"),
    ("TextDelta", T(1), R(1), " Hel", "You said: Hel"),
    ("TextDelta", T(1), R(1), "lo.", "You said: Hello."),
    ("TextDone", T(1), R(1), "You said: Hello."),
    ("AudioDone", T(1), R(1), False),
    ("ResponseDone", T(1), R(1), "completed", "post_eos_audio_silence"),
]


def run_until_response(d, positions_after: int = 2) -> None:
    while "ResponseCreated" not in names(d.events):
        d.run(max_positions=1)
    d.run(max_positions=positions_after)


def model_session(**config):
    config.setdefault("settlement_blank_frames", 10)
    config.setdefault("gate_open_after", 1)  # the tiered session's setting: simulator words are 1-3 frames
    return session(turn_policy="model", **config)


def test_speech_then_silence_ends_the_turn_on_the_blank_fence_without_a_commit():
    d = model_session()
    d.events.clear()
    d.send(AppendAudio(render_speech("Hello") + SILENCE_FRAME * 12))
    d.run()
    assert protocol(d.events) == [
        ("SpeechStarted", T(1), "microphone", None, ""),
        ("TranscriptDelta", T(1), "Hello", "Hello", "microphone", None),
        ("SpeechStopped", T(1), "microphone", None),
        ("TranscriptCompleted", T(1), "Hello", "microphone", None),
        *REPLY_HELLO,
    ]
    assert decode_speech(audio(d.events), 22_050) == "You said: Hello."
    # one synthetic settlement position carries the fused EOU once the real frames reached fence - 1 blanks
    kinds = [m.kind for m in metrics(d.events) if m.kind != "gated"]
    assert kinds.count("settlement") == 1 and "eou" not in kinds


def test_not_enough_silence_keeps_listening_and_a_commit_forces_the_eou():
    d = model_session()
    d.events.clear()
    d.send(AppendAudio(render_speech("Hello") + SILENCE_FRAME * 3))
    d.run()
    assert names(d.events) == ["SpeechStarted", "TranscriptDelta"]
    d.events.clear()
    d.send(CommitInput("c1"))
    d.run()
    assert protocol(d.events) == [
        ("SpeechStopped", T(1), "microphone", None),
        ("TranscriptCompleted", T(1), "Hello", "microphone", None),
        *REPLY_HELLO,
    ]


def test_auto_eou_off_waits_for_the_commit():
    d = model_session()
    d.core.auto_eou = False
    d.send(AppendAudio(render_speech("Hello") + SILENCE_FRAME * 30))
    d.run()
    assert "SpeechStopped" not in names(d.events)
    d.events.clear()
    d.send(CommitInput("c1"))
    d.run()
    assert names(d.events)[:3] == ["SpeechStopped", "TranscriptCompleted", "ResponseCreated"]


def test_commit_of_silence_is_a_listen_decision():
    d = model_session()
    d.events.clear()
    d.send(AppendAudio(SILENCE_FRAME * 5))
    d.send(CommitInput("c1"))
    d.run()
    assert protocol(d.events) == [("ListenDecision", None, "silence_or_noise", "c1")]


def test_commit_after_the_model_took_the_turn_is_benign():
    d = model_session()
    d.send(AppendAudio(render_speech("Hello") + SILENCE_FRAME * 12))
    d.run()
    d.events.clear()
    d.send(AppendAudio(SILENCE_FRAME * 3))
    d.send(CommitInput("c1"))
    d.run()
    assert protocol(d.events) == []


def test_a_candidate_turn_without_words_ends_as_model_listen():
    class Deaf(SimulatorModel):
        """Hears energy but never decodes a word."""

        def step(self, position):
            r = super().step(position)
            return dataclasses.replace(r, rnnt=dataclasses.replace(r.rnnt, text_delta=""))

    d = model_session()
    d.model = Deaf()
    d.model.prefill(d.core.prompt)
    d.events.clear()
    d.send(AppendAudio(LOUD_NOISE_FRAME * 4 + SILENCE_FRAME * 12))
    d.run()
    assert protocol(d.events) == [
        ("SpeechStarted", T(1), "microphone", None, ""),
        ("SpeechStopped", T(1), "microphone", None),
        ("TranscriptCompleted", T(1), "", "microphone", None),
        ("ListenDecision", T(1), "model_listen", None),
    ]


def test_cancel_response_runs_the_cancel_tail_and_keeps_the_session_usable():
    d = model_session()
    d.send(AppendAudio(render_speech("Hello") + SILENCE_FRAME * 12))
    run_until_response(d)
    d.events.clear()
    d.send(CancelResponse("client_cancelled"))
    d.run()
    assert protocol(d.events)[-3:] == [
        ("TextDone", T(1), R(1), protocol(d.events)[-3][3]),
        ("AudioDone", T(1), R(1), False),
        ("ResponseDone", T(1), R(1), "cancelled", "client_cancelled"),
    ]
    assert {m.kind for m in metrics(d.events)} >= {"cancel_tail"}
    # no re-prefill: the next turn is answered in the same model context
    prefills = len(d.effects)
    d.events.clear()
    d.send(AppendAudio(render_speech("again") + SILENCE_FRAME * 12))
    d.run()
    assert names(d.events)[-1] == "ResponseDone" and len(d.effects) == prefills
    assert decode_speech(audio(d.events), 22_050) == "You said: again."


def test_cancel_with_nothing_open_is_a_no_op():
    d = model_session()
    d.events.clear()
    d.send(CancelResponse())
    d.run()
    assert protocol(d.events) == []


def test_speech_during_a_response_cancels_it_at_the_new_eou():
    d = model_session()
    d.send(AppendAudio(render_speech("Hello, how are you doing today?") + SILENCE_FRAME * 12))
    run_until_response(d)
    d.events.clear()
    d.send(AppendAudio(render_speech("stop") + SILENCE_FRAME * 12))
    d.run()
    seq = names(d.events)
    assert seq.index("SpeechStarted") < seq.index("ResponseDone")
    done = [e for e in protocol(d.events) if e[0] == "ResponseDone"]
    assert done[0][3:] == ("cancelled", "new_response") and done[1][3] == "completed"


def test_clear_drops_an_open_turn_and_queued_audio():
    d = model_session()
    d.send(AppendAudio(render_speech("Hello world")))
    d.run(max_positions=8)
    d.events.clear()
    d.send(AppendAudio(render_speech("more")))
    d.send(ClearInput())
    d.run()
    assert protocol(d.events) == [("SpeechStopped", T(1), "microphone", None), ("InputCleared", T(1))]
    d.events.clear()
    d.send(CommitInput("c"))
    d.run()
    assert protocol(d.events) == [("ListenDecision", None, "silence_or_noise", "c")]


def test_a_commits_settlement_takes_the_quiet_frames_queued_behind_it():
    d = model_session(settlement_blank_frames=4)
    d.core.auto_eou = False
    d.send(AppendAudio(render_speech("Hello") + SILENCE_FRAME * 1))
    d.run()
    d.events.clear()
    d.send(CommitInput("c1"))
    d.send(AppendAudio(SILENCE_FRAME * 2))
    d.run(max_positions=4)  # the speech's partial last frame, zero-padded, then the settlement
    settling = [(m.kind, m.input_audio, m.turn_state.get("settlement_input_source")) for m in metrics(d.events)]
    assert settling == [("commit_tail_padding", True, None), *[("settlement", True, "queued_microphone_audio")] * 2,
                        ("settlement", False, "zero")]
    d.run()
    assert "ResponseCreated" in names(d.events)
