#!/usr/bin/env bash
# Debian's Chromium for the built-in page's browser tests (tests/test_browser_page.py): Playwright drives it
# through executable_path, so no browser is downloaded from anywhere but the distribution's archive.
#   scripts/install_browser.sh        install it when missing, then print its version
set -euo pipefail
if ! command -v chromium >/dev/null; then
    SUDO=""
    [[ $(id -u) -eq 0 ]] || SUDO="sudo"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium
fi
# Debian's wrapper script prints a harmless shell warning on some machines; the version line is what matters.
chromium --version 2>/dev/null | grep -q '^Chromium ' || { echo "chromium is installed but does not run" >&2; exit 1; }
chromium --version 2>/dev/null
