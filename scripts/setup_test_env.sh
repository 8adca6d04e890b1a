#!/usr/bin/env bash
# Install what the tests need on a fresh Debian bookworm machine (run as root):
# Nsight Systems 2022.4 from Debian non-free, Chromium for the HTML tests,
# the CPU build of torch 2.13.0, and this package with its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
need_apt=()
command -v nsys >/dev/null 2>&1 || need_apt+=(nsight-systems nsight-systems-target)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  if ! grep -rqsE '^[[:space:]]*(Components:|deb[[:space:]]).*[[:space:]]non-free([[:space:]]|$)' \
       /etc/apt/sources.list /etc/apt/sources.list.d/; then
    # The mirror this machine already uses for bookworm main (active lines only, not comments).
    mirror=$( { grep -hE '^[[:space:]]*URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}';
                grep -hE '^[[:space:]]*deb[[:space:]]' /etc/apt/sources.list 2>/dev/null | sed -E 's/\[[^]]*\]//' | awk '{print $2}'; } \
              | grep -v security | head -1) || true
    if [ -z "${mirror}" ]; then
      echo "setup_test_env: no Debian mirror found in /etc/apt/sources.list(.d); configure apt for bookworm first" >&2
      exit 1
    fi
    cat > /etc/apt/sources.list.d/nvtx-trace-nonfree.sources <<SRC
Types: deb
URIs: ${mirror}
Suites: bookworm
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
python3 -m pip install -q "torch==2.13.0"
python3 -m pip install -q -e ".[test]"
nsys --version
