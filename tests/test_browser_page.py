"""The built-in page in a real headless Chromium (Debian's ``chromium``, driven by Playwright), against the simulator
server, on both dialects.

Chromium's fake capture device plays a WAV of simulator speech into ``getUserMedia`` (it loops: the WAV is the
utterance and then silence longer than any test waits for a turn). The page keeps what it scheduled for playback
per response (``window.voicechat``); the tests decode that PCM with ``decode_speech``, so they assert what the
browser would have played, not only which events arrived. Every wait is on a condition in the page, with a
timeout; the server's trace checker sees every socket.

Without Chromium (or the playwright package) the tests skip, unless ``VOICECHAT_REQUIRE_BROWSER=1`` (CI) makes that
a failure. ``VOICECHAT_SCREENSHOTS=DIR`` keeps the screenshots (docs/figures/ holds the ones in the README).
"""

from __future__ import annotations

import base64
import os
import shutil
import wave
from pathlib import Path

import pytest

from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.audio.speech import decode_speech, render_speech

from .server_fixture import running_app

pytestmark = pytest.mark.browser

SAID = "hello from the browser"
LONG = ("please tell me a very long story about the sea and the sky and the ships that sail between the harbours of "
        "the world, and about the people who wait for them on the shore every evening")
WAIT_MS = 30_000
DIALECTS = ["v3", "tiered"]
# As root Chromium needs --no-sandbox; the rest keeps it off the network (this machine has none) and quiet.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--use-fake-device-for-media-stream",
                 "--use-fake-ui-for-media-stream", "--autoplay-policy=no-user-gesture-required"]


def _chromium() -> str:
    """The browser's path, or a skip (a failure under VOICECHAT_REQUIRE_BROWSER=1) naming what is missing."""
    missing = None
    path = os.environ.get("VOICECHAT_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing = "the playwright package is not installed (pip install -e '.[test]')"
    if missing is None and path is None:
        missing = "no Chromium found (apt-get install chromium, or set VOICECHAT_CHROMIUM)"
    if missing is None:
        return path
    if os.environ.get("VOICECHAT_REQUIRE_BROWSER") == "1":
        pytest.fail(f"VOICECHAT_REQUIRE_BROWSER=1 but {missing}", pytrace=False)
    pytest.skip(missing)


@pytest.fixture(scope="module")
def microphone_wav(tmp_path_factory) -> Path:
    """Half a second of silence, the utterance, then ten seconds of silence (the fake device loops the file)."""
    path = tmp_path_factory.mktemp("mic") / "hello.wav"
    pcm = bytes(8_000 * 2) + render_speech(SAID) + bytes(10 * 16_000 * 2)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16_000)
        w.writeframes(pcm)
    return path


@pytest.fixture(scope="module")
def browser(microphone_wav):
    executable = _chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable,
                              args=[*CHROMIUM_ARGS, f"--use-file-for-fake-audio-capture={microphone_wav}"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def base():
    with running_app(ServerConfig.simulator(max_sessions=8)) as (url, _):
        yield url.replace("ws://", "http://")


class Page:
    """One tab on the page, with its JavaScript errors collected (any fails the test)."""

    def __init__(self, browser, base: str, *, bypass_csp: bool = True) -> None:
        # Playwright evaluates wait predicates with eval, which the page's CSP forbids; one test runs under it.
        self.context = browser.new_context(bypass_csp=bypass_csp, viewport={"width": 1280, "height": 760})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.console: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.goto(base + "/")
        self.page.wait_for_selector("body[data-ready]")

    def wait(self, predicate: str, arg=None, timeout: int = WAIT_MS):
        return self.page.wait_for_function(predicate, arg=arg, timeout=timeout).json_value()

    def js(self, expression: str, arg=None):
        return self.page.evaluate(expression, arg)

    def connect(self, dialect: str) -> None:
        self.page.select_option("#dialect", dialect)
        self.page.uncheck("#aec")  # the browser's voice processing would treat simulator tones as noise
        self.page.click("#connect")
        self.wait("window.voicechat.configured")

    def type(self, text: str) -> None:
        self.page.fill("#text", text)
        self.page.click("#send")

    def response(self, index: int) -> dict:
        """The index-th response the page saw, once it is done, with its scheduled PCM decoded."""
        rid = self.wait("""(i) => { const v = window.voicechat, rid = v.order[i];
                                    return rid && v.responses[rid].status !== 'in_progress' ? rid : false; }""", index)
        r = self.js("(rid) => { const r = window.voicechat.responses[rid]; return {...r, chunks: undefined}; }", rid)
        pcm = base64.b64decode(self.js("(rid) => window.voicechat.pcmBase64(rid)", rid))
        assert len(pcm) == 2 * r["scheduledSamples"]
        return {**r, "id": rid, "heard": decode_speech(pcm, r["rate"])}

    def sent(self) -> list[str]:
        return [e["type"] for e in self.js("window.voicechat.sent")]

    def close(self) -> None:
        self.context.close()
        assert self.errors == [], self.errors


@pytest.fixture
def tab(browser, base):
    t = Page(browser, base)
    yield t
    t.close()


def screenshot(t: Page, name: str, tmp_path: Path) -> None:
    folder = Path(os.environ.get("VOICECHAT_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    t.page.screenshot(path=str(folder / name))
    assert (folder / name).stat().st_size > 10_000


@pytest.mark.parametrize("dialect", DIALECTS)
def test_voice_typed_and_tool_turns(tab, dialect, tmp_path):
    assert tab.wait("window.voicechat.health && window.voicechat.health.status") == "ready"
    health = tab.js("Array.from(document.querySelectorAll('#health dt, #health dd'), e => e.textContent)")
    assert health[:4] == ["status", "ready (simulator)", "protocol", "voicechat.realtime v3"]
    assert health[4:6] == ["sessions", health[5]] and health[5].endswith(" of 8 in use")
    assert health[6:] == ["typed input", "ready (simulator)", "speech",
                          "simulator tones (serve --speech real for your voice)"]
    if dialect == "v3":
        screenshot(tab, "page_idle.png", tmp_path)
    tab.connect(dialect)
    expected_caps = "input_turn_detection" if dialect == "v3" else "supports_model_native_turn_policy"
    assert expected_caps in tab.page.text_content("#capabilities")

    # 1. The fake microphone says SAID: the page's detector opens and ends the turn (v3), or the model does (tiered).
    tab.page.click("#mic")
    voice = tab.response(0)
    assert (voice["status"], voice["heard"], voice["text"]) == ("completed", f"You said: {SAID}.", f"You said: {SAID}.")
    assert voice["rate"] == (22_050 if dialect == "v3" else 24_000)
    assert tab.js("window.voicechat.userTurns.map(t => [t.transcript, t.final])") == [[SAID, True]]
    assert tab.page.locator("#transcript .user .body").first.inner_text() == SAID
    tab.page.click("#mic")  # off: the looping file must not start another turn
    if dialect == "v3":
        assert tab.sent() == ["session.update", "input_audio_buffer.turn_start", "input_audio_buffer.commit"]
    else:
        assert "input_audio_buffer.commit" not in tab.sent() and tab.js("window.voicechat.appendsSent") > 10

    # 2. A typed turn.
    tab.type("what is the weather like")
    typed = tab.response(1)
    assert (typed["status"], typed["heard"]) == ("completed", "You said: what is the weather like.")

    # 3. A tool turn: the simulator calls local_time, the page answers it, the server acknowledges, the model speaks.
    tab.type("call local_time {}")
    call = tab.wait("(() => { const c = window.voicechat.toolCalls[0]; return c?.state === 'applied' ? c : false; })()")
    assert (call["name"], call["arguments"]) == ("local_time", "{}")
    assert len(call["output"]) == 5 and call["output"][2] == ":"  # HH:MM from the browser's clock
    spoken = tab.response(2) if dialect == "v3" else tab.response(3)  # tiered: A ends with the call, B speaks
    assert (spoken["status"], spoken["heard"]) == ("completed", f"The result is {call['output']}.")
    if dialect == "tiered":
        assert tab.response(2)["heard"] == ""  # wire response A carried the call only
    assert "applied" in tab.page.locator("#transcript .tool .meta").inner_text()

    latencies = tab.js("window.voicechat.latencies")
    assert [(l["kind"], l["status"]) for l in latencies] == [("voice", "completed"), ("typed", "completed"),
                                                             ("typed", "completed")]
    for l in latencies:
        assert 0 <= l["createdMs"] <= l["firstAudioMs"] < 5_000, l
    assert tab.page.locator("#latency tbody tr").count() == 3
    assert tab.page.is_hidden("#banner")
    if dialect == "v3":
        screenshot(tab, "page_conversation.png", tmp_path)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_push_to_talk(tab, dialect):
    tab.connect(dialect)
    tab.page.select_option("#turn-mode", "ptt")
    tab.page.click("#mic")
    tab.page.wait_for_selector("#mic.live")
    tab.page.hover("#ptt")
    tab.page.mouse.down()
    # Held for 18 frames (1.44 s): the file's half second of silence, the utterance, then silence.
    tab.wait("window.voicechat.appendsSent >= 18")
    tab.page.mouse.up()
    released = tab.js("window.voicechat.appendsSent")
    answer = tab.response(0)
    assert (answer["status"], answer["heard"]) == ("completed", f"You said: {SAID}.")
    assert tab.js("window.voicechat.appendsSent") == released  # nothing is sent while the button is up
    sent = [t for t in tab.sent() if t != "session.event_ack"]
    if dialect == "v3":
        assert sent == ["session.update", "input_audio_buffer.turn_start", "input_audio_buffer.commit"]
    else:
        assert sent == ["session.update", "input_audio_buffer.commit"]
    tab.page.click("#mic")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_new_turn_barges_in_and_stops_playback(tab, dialect):
    tab.connect(dialect)
    tab.type(LONG)  # a long answer, still playing when the microphone speaks
    tab.wait("(() => { const v = window.voicechat; return v.responses[v.order[0]]?.scheduledSamples > 0; })()")
    tab.page.click("#mic")
    answer = tab.response(1)
    first = tab.response(0)
    assert answer["heard"] == f"You said: {SAID}." and answer["status"] == "completed"
    assert (first["status"], first["reason"]) == ("cancelled", "client_vad" if dialect == "v3" else "client_cancelled")
    full = f"You said: {LONG}."
    assert first["heard"].startswith("You said: ") and full.startswith(first["heard"]) and first["heard"] != full
    stops = tab.js("window.voicechat.stops")
    assert [s["responseId"] for s in stops] == [first["id"]]
    # Nothing of the cancelled answer was scheduled after the stop: what arrived late was dropped.
    assert stops[0]["scheduledSamples"] == first["scheduledSamples"]
    sent = tab.sent()
    if dialect == "v3":  # the turn_start itself is the barge-in: the server cancels to a terminal first
        after = sent[sent.index("input_text.request") + 1:]
        assert after == ["input_audio_buffer.turn_start", "input_audio_buffer.commit"]
    else:  # the model owns turns: the page cancels what it hears over
        assert sent.count("response.cancel") == 1
    tab.page.click("#mic")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_bad_actions_show_typed_errors_and_close_codes_in_plain_words(tab, dialect):
    tab.connect(dialect)
    tab.page.click("#raw-box summary")
    tab.page.fill("#raw-text", "{not json")
    tab.page.click("#raw-send")
    assert tab.page.inner_text("#banner-text").startswith("Error invalid_json: not JSON")

    # A recoverable protocol error from the server: shown, and the session goes on.
    tab.page.fill("#raw-text", '{"type": "response.cancel"}')
    tab.page.click("#raw-send")
    code = "unsupported_event" if dialect == "v3" else "response_not_active"
    tab.wait("(code) => window.voicechat.errors.some(e => e.code === code)", code)
    assert tab.page.inner_text("#banner-text").startswith(f"Error {code}: ")
    tab.type("still there")
    assert tab.response(0)["heard"] == "You said: still there."

    if dialect == "v3":  # a fatal one: a commit without a turn is a protocol violation, closed 1002
        tab.page.fill("#raw-text", '{"type": "input_audio_buffer.commit", "event_id": "x", "client_turn_id": 9}')
        tab.page.click("#raw-send")
        tab.wait("window.voicechat.closes.length === 1")
        assert tab.page.inner_text("#banner-text") == (
            "Fatal error input_turn_conflict: commit 9 without an open client turn — Connection closed (1002): "
            "protocol error: the server refused an event in this state [input_turn_conflict]")  # the close reason
        assert tab.page.get_attribute("#status", "data-state") == "closed"
        assert tab.page.inner_text("#connect") == "Connect"


def test_the_page_runs_under_its_own_content_security_policy(browser, base):
    t = Page(browser, base, bypass_csp=False)
    try:
        t.page.select_option("#dialect", "v3")
        t.page.uncheck("#aec")
        t.page.click("#connect")
        t.page.wait_for_selector("#status[data-state=ready]", timeout=WAIT_MS)
        t.page.click("#mic")  # loads the AudioWorklet module
        t.page.wait_for_selector("#mic.live", timeout=WAIT_MS)
        t.page.wait_for_selector(f"#transcript .assistant .body:text-is('You said: {SAID}.')", timeout=WAIT_MS)
        t.page.click("#mic")
        assert [m for m in t.console if "Content Security Policy" in m or m.startswith("error")] == []
    finally:
        t.close()


def test_with_api_keys_the_page_asks_for_one_and_sends_it_as_a_subprotocol(browser, base):
    plain = Page(browser, base)
    try:
        plain.wait("window.voicechat.health !== undefined")
        assert plain.page.is_hidden("#key-label")  # a server without keys asks for none
    finally:
        plain.close()
    with running_app(ServerConfig.simulator(api_keys=("page-key",))) as (url, _):
        t = Page(browser, url.replace("ws://", "http://"))
        try:
            t.page.wait_for_selector("#key-label", state="visible", timeout=WAIT_MS)  # /health says auth_required
            t.page.fill("#api-key", "page-key")
            t.connect("v3")
            t.type("with a key")
            assert t.response(0)["heard"] == "You said: with a key."
        finally:
            t.close()

