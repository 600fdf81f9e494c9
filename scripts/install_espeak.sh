#!/usr/bin/env bash
# Debian's eSpeak NG, the mouth of the simulator's real-speech mode (serve --speech real; sim/real_speech.py) and
# of its tests (tests/test_real_speech.py). PocketSphinx, its ear, is the `voice` extra (a PyPI wheel with models).
#   scripts/install_espeak.sh        install it when missing, then print its version
set -euo pipefail
if ! command -v espeak-ng >/dev/null; then
    SUDO=""
    [[ $(id -u) -eq 0 ]] || SUDO="sudo"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q espeak-ng
fi
espeak-ng --version
