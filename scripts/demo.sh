#!/usr/bin/env bash
# The main job on a fresh machine: set up, start the simulator server, run the example v3 conversation
# against it over a real WebSocket (spoken turn, typed turn, barge-in), write the assistant audio, stop.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q -e .
wait_ready() {  # until the server on $PORT answers /health (60 s at most)
    .venv/bin/python - "$PORT" <<'PY'
import sys, time, urllib.request
deadline = time.monotonic() + 60
while True:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=1)
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit("the server did not become ready")
        time.sleep(0.1)
PY
}
PORT=${PORT:-$(.venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
.venv/bin/vllm-omni-voicechat serve --model sim --host 127.0.0.1 --port "$PORT" --log-level warning &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true' EXIT
wait_ready
.venv/bin/python examples/v3_conversation.py --url "ws://127.0.0.1:$PORT/v1/realtime" --wav out/v3_assistant.wav "$@"
kill "$SERVER" 2>/dev/null || true
wait "$SERVER" 2>/dev/null || true

# The same simulator with real speech, when eSpeak NG is installed (bash scripts/install_espeak.sh): a question
# spoken by eSpeak NG, heard by PocketSphinx, answered aloud; the answer lands in out/real_speech/ to listen to.
echo
if command -v espeak-ng >/dev/null; then
    .venv/bin/pip install -q -e '.[voice]'
    .venv/bin/vllm-omni-voicechat serve --model sim --speech real --host 127.0.0.1 --port "$PORT" --log-level warning &
    SERVER=$!
    mkdir -p out/real_speech
    espeak-ng -v en-us+f2 -s 140 -w out/real_speech/question.wav "Hello there, how are you doing?"
    wait_ready
    .venv/bin/vllm-omni-voicechat talk --url "ws://127.0.0.1:$PORT" --wav out/real_speech/question.wav \
        --save-wav out/real_speech
else
    echo "Real speech (PocketSphinx in, eSpeak NG out): bash scripts/install_espeak.sh, then run this again."
fi
echo
echo "Talk to it in your browser: .venv/bin/vllm-omni-voicechat serve --model sim --port 8765 (add --speech real"
echo "to use your own voice: pip install -e '.[voice]' and bash scripts/install_espeak.sh), then open"
echo "http://127.0.0.1:8765/ (Connect, Start microphone, speak or type; 'call local_time {}' shows a tool call)."
