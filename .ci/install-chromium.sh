#!/usr/bin/env bash
# Install Debian's Chromium for the browser tests (tests/test_report_browser.py) when it is
# missing. Idempotent: does nothing when a chromium is already on PATH. Needs root (or
# sudo) and apt; the package index is refreshed only when something must be installed.
set -euo pipefail
for name in chromium chromium-browser; do
    if command -v "$name" >/dev/null 2>&1; then
        echo "install-chromium: $(command -v "$name") is already installed"
        exit 0
    fi
done
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-chromium: no chromium and no apt-get: install Chromium by hand" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
# another apt may hold the dpkg lock (an unattended upgrade): wait for it, up to 10 min
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -q
$SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -q chromium
command -v chromium
