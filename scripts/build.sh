#!/usr/bin/env bash
# Builds datamode-proxy. `scripts/build.sh` = release build; prints the binary's path last.
set -euo pipefail
cd "$(dirname "$0")/.."
configuration="${1:-release}"
swift build -c "$configuration" --product datamode-proxy >&2
echo "$(swift build -c "$configuration" --show-bin-path)/datamode-proxy"
