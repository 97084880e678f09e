#!/bin/sh
# Copies the Swift runtime libraries a binary loads into a staging root, at the same absolute paths,
# so that `COPY --from=build STAGING/ /` puts them where the binary's RUNPATH already looks
# (swift build links with RUNPATH=<toolchain>/lib/swift/linux:$ORIGIN; in the swift image that is
# /usr/lib/swift/linux). Only what `ldd` lists is copied: a binary that uses Foundation needs about
# 76 MB of the toolchain's ~140 MB of libraries, and one built with --static-swift-stdlib needs none.
# The copies are stripped of their static symbol tables when `strip` is there (binutils; the swift image
# has it): 64 MB instead of 76. Their exported symbols stay, so linking and the Swift backtracer's names
# for public runtime functions are unchanged; the proxy binary itself is not stripped.
# Debian's own libraries (libevent, OpenSSL, libstdc++) are not copied: the runtime stage installs their
# packages, and checks with ldd that nothing is missing.
#   docker/collect-swift-runtime.sh BINARY STAGING-ROOT     prints each library it copied
set -eu
if [ $# -ne 2 ]; then
    echo "usage: $0 BINARY STAGING-ROOT" >&2
    exit 64
fi
binary=$1
staging=$2
[ -f "$binary" ] || { echo "$0: no such binary: $binary" >&2; exit 66; }

listing=$(ldd "$binary")
if printf '%s\n' "$listing" | grep -q 'not found'; then
    echo "$0: $binary has unresolved libraries in the build image:" >&2
    printf '%s\n' "$listing" | grep 'not found' >&2
    exit 1
fi
# Lines look like "	libswiftCore.so => /usr/lib/swift/linux/libswiftCore.so (0x...)".
printf '%s\n' "$listing" | awk '$2 == "=>" && $3 ~ /\/lib\/swift\// { print $3 }' | sort -u |
    while IFS= read -r library; do
        mkdir -p "$staging$(dirname "$library")"
        cp -L "$library" "$staging$library"
        if command -v strip >/dev/null; then strip --strip-unneeded "$staging$library"; fi
        echo "$library"
    done
