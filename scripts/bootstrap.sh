#!/usr/bin/env bash
# Installs the Debian packages datamode-proxy needs to build and run, only those that are missing.
# Used by scripts/start.sh, scripts/test.sh and docker/Dockerfile: one list, one place.
#   scripts/bootstrap.sh            build + run dependencies (libevent, OpenSSL)
#   scripts/bootstrap.sh --test     also what the test suite drives (curl, openssl CLI)
set -euo pipefail
packages=(libevent-dev libssl-dev pkg-config ca-certificates)
if [ "${1:-}" = "--test" ]; then
    packages+=(curl openssl)
fi
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "bootstrap: installing ${missing[*]}" >&2
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
