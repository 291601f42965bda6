#!/usr/bin/env bash
# Install Debian's chromium (headless browser for tests/report/test_browser.py) when it is missing.
# Idempotent; needs root (or sudo) and Debian's package archive.
set -euo pipefail
for name in chromium chromium-browser; do
  if command -v "$name" >/dev/null 2>&1; then
    echo "chromium present: $(command -v "$name")"
    exit 0
  fi
done
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
echo "chromium installed: $(command -v chromium)"
