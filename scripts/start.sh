#!/usr/bin/env bash
# The README's first command: install what is missing, build, and start the proxy with config/datamode.yaml.
# Extra arguments go to `datamode-proxy run` (e.g. --mode constrained).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
binary=$(scripts/build.sh release)
exec "$binary" run --config config/datamode.yaml "$@"
