#!/usr/bin/env bash
# The README's second command: install what is missing and run the whole test suite
# (unit, loopback and end-to-end tests; the end-to-end tests build and drive the real binary).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh --test
swift build --product datamode-proxy
swift test "$@"
