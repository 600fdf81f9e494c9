"""The built-in page in a real headless Chromium against the simulator in its real-speech mode (``--speech real``):
the fake microphone speaks a sentence in eSpeak NG's voice, the page's turn goes through the browser's capture, the
simulator hears it with PocketSphinx and answers aloud with eSpeak NG. A module of its own: Playwright's sync API
runs one instance at a time, and tests/test_browser_page.py's browser lives for its module.

Skips without Chromium (as tests/test_browser_page.py) or without pocketsphinx / espeak-ng, unless
``VOICECHAT_REQUIRE_SPEECH=1`` (CI) makes the latter a failure."""

from __future__ import annotations

import base64
import os
import wave

import pytest

from vllm_omni_voicechat.server import ServerConfig

from .server_fixture import running_app
from .test_browser_page import CHROMIUM_ARGS, Page, _chromium

pytestmark = pytest.mark.browser


REAL_SAID = "hello there how are you doing"


@pytest.fixture(scope="module")
def real_speech_browser(tmp_path_factory):
    """A browser whose fake microphone says REAL_SAID in eSpeak NG's voice (the real-speech mode's own mouth)."""
    from vllm_omni_voicechat.sim import real_speech

    try:
        real_speech.check_available()
    except real_speech.SpeechUnavailable as exc:
        if os.environ.get("VOICECHAT_REQUIRE_SPEECH") == "1":
            pytest.fail(f"VOICECHAT_REQUIRE_SPEECH=1 but {exc}", pytrace=False)
        pytest.skip(str(exc))
    executable = _chromium()
    path = tmp_path_factory.mktemp("mic") / "real.wav"
    pcm = bytes(8_000 * 2) + real_speech.espeak(REAL_SAID, 16_000).tobytes() + bytes(10 * 16_000 * 2)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16_000)
        w.writeframes(pcm)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable,
                              args=[*CHROMIUM_ARGS, f"--use-file-for-fake-audio-capture={path}"])
        with running_app(ServerConfig.simulator(max_sessions=2, real_speech=True)) as (url, _):
            yield b, url.replace("ws://", "http://")
        b.close()


@pytest.mark.parametrize("dialect", ["v3", "tiered"])
def test_the_page_in_the_real_speech_mode_hears_a_voice_and_answers_aloud(real_speech_browser, dialect):
    browser_, base_ = real_speech_browser
    tab = Page(browser_, base_)
    try:
        assert tab.wait("window.voicechat.health && window.voicechat.health.status") == "ready"
        health = tab.js("Array.from(document.querySelectorAll('#health dt, #health dd'), e => e.textContent)")
        assert health[-2:] == ["speech", "real: PocketSphinx hears you, eSpeak NG answers"]
        tab.connect(dialect)  # v3: the page's detector ends the turn; tiered: the model does
        tab.page.click("#mic")
        rid = tab.wait("(() => { const v = window.voicechat, rid = v.order[0];"
                       " return rid && v.responses[rid].status !== 'in_progress' ? rid : false; })()")
        tab.page.click("#mic")
        response = tab.js("(rid) => { const r = window.voicechat.responses[rid]; return {...r, chunks: undefined}; }",
                          rid)
        heard = tab.js("window.voicechat.userTurns.map(t => t.transcript)")[0]
        assert response["status"] == "completed" and response["text"] == f"You said: {heard}."
        assert set(heard.split()) & set(REAL_SAID.split())  # words of what was said, through the browser's capture
        pcm = base64.b64decode(tab.js("(rid) => window.voicechat.pcmBase64(rid)", rid))
        assert any(pcm) and len(pcm) == 2 * response["scheduledSamples"]  # eSpeak NG's answer, played
    finally:
        tab.close()
