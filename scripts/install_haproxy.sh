#!/usr/bin/env bash
# Debian's HAProxy for the replica tests (tests/test_fleet.py) and `vllm-omni-voicechat serve --replicas N`: the
# load balancer in front of replicas is the distribution's, never one of ours (deploy/haproxy/README.md).
#   scripts/install_haproxy.sh        install it when missing, then print its version
set -euo pipefail
if ! command -v haproxy >/dev/null; then
    SUDO=""
    [[ $(id -u) -eq 0 ]] || SUDO="sudo"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q haproxy
fi
# The Debian package may start a system haproxy on its default config; ours runs its own processes only.
haproxy -v | sed -n 1p  # sed reads it all: head would close the pipe under pipefail (SIGPIPE)
