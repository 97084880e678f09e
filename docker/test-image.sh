#!/usr/bin/env bash
# Builds docker/Dockerfile with podman and checks the image for real: the container, then the compose example.
# docker/README.md ("Testing the image with podman") explains each step and records a run's output.
#
#   docker/test-image.sh            install what is missing, make the base images (first run only), build, check
#
# On a Debian 12 machine with root and no Docker Hub (the project's machine kind):
#   - installs podman, buildah, runc, mmdebstrap (Debian) and podman-compose (PyPI, in a venv) if missing;
#   - makes the two base images the Dockerfile names, the first time only (cached in podman's storage after):
#     localhost/debian:bookworm-slim (mmdebstrap) and localhost/swift:6.3-bookworm (that, plus the Swift
#     toolchain this machine builds with);
#   - builds the Dockerfile as it is in the repository (nothing patched), as datamode-proxy:local;
#   - runs the container with host networking on free loopback ports, a read-only root, no capabilities,
#     and checks it (each check prints PASS or FAIL); then brings up docker/compose.yaml with podman-compose,
#     and docker/transparent/compose.yaml (the transparent sidecar: an app with no proxy setting, SPEC §16).
# Exit status: 0 when every check passed, 1 when one failed, 2 when the setup failed (nothing was checked).
# Every container, volume and temporary file it makes is removed on exit; the images stay (they are the cache).
#
# Environment:
#   DATAMODE_CONTAINER_CACHE   where the podman config, the venv and the SwiftPM cache copy live
#                              (default /var/tmp/datamode-proxy-containers)
#   DATAMODE_DEBIAN_MIRROR     the Debian mirror for the base image (default http://deb.debian.org/debian)
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${DATAMODE_CONTAINER_CACHE:-/var/tmp/datamode-proxy-containers}
mirror=${DATAMODE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security_mirror=${mirror%/debian}/debian-security
image=localhost/datamode-proxy:local
app_image=localhost/datamode-example-app:local
debian_image=localhost/debian:bookworm-slim
swift_image=localhost/swift:6.3-bookworm
podman_compose_version=1.6.0
run_id="dmtest-$$"            # names every container and volume this run makes
drain_timeout=10              # the default drain-timeout (SPEC.md section 8); the example config sets none

# --- output ---------------------------------------------------------------------------------------

started=$(date +%s)
failures=0
passes=0
section() { printf '\n== %s\n' "$*"; }
note() { printf '   %s\n' "$*"; }
pass() { passes=$((passes + 1)); printf 'PASS %s\n' "$*"; }
fail() { failures=$((failures + 1)); printf 'FAIL %s\n' "$*"; }
die() {
    printf 'SETUP FAILED: %s\n' "$*" >&2
    exit 2
}
elapsed() { echo "$(($(date +%s) - started)) s"; }

# podman without its stderr noise on a machine without systemd ("unable to get systemd connection" for
# health check timers it cannot make); every other message stays.
quiet_podman() {
    local status=0
    podman "$@" 2>"$work/podman.stderr" || status=$?
    grep -v -e 'unable to get systemd connection' "$work/podman.stderr" >&2 || true
    return "$status"
}

# --- cleanup --------------------------------------------------------------------------------------

work=''
containers=()
volumes=()
background=()
compose_up=false
transparent_up=false
cleanup() {
    local status=$?
    set +e
    if $compose_up; then
        compose down -v >/dev/null 2>&1
    fi
    if $transparent_up; then
        compose_transparent down -v >/dev/null 2>&1
    fi
    [ -z "$transparent_netns" ] || ip netns del "$transparent_netns" 2>/dev/null
    # SIGKILL: a parent may hand this script down a blocked SIGTERM (a Swift test process does), and an origin
    # left running would keep the caller waiting on the output it inherited.
    for pid in "${background[@]}"; do kill -KILL "$pid" 2>/dev/null; done
    # -v: also the anonymous volume a container without a volume option gets for the image's VOLUME.
    for name in "${containers[@]}"; do podman rm -f -v -t 0 "$name" >/dev/null 2>&1; done
    for name in "${volumes[@]}"; do podman volume rm -f "$name" >/dev/null 2>&1; done
    [ -z "$work" ] || rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- installing what is missing -------------------------------------------------------------------

[ "$(id -u)" -eq 0 ] || die "run as root: the checks use rootful podman (docker/README.md)"
command -v dpkg-query >/dev/null || die "this script installs with apt-get: run it on Debian 12 (bookworm)"

install_packages() {
    local missing=() package
    for package in podman buildah runc mmdebstrap python3-venv curl python3 ca-certificates; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        note "installing ${missing[*]} (Debian)"
        # Another apt-get may hold the lock (a bootstrap running beside this): wait for it rather than fail.
        { apt-get -o DPkg::Lock::Timeout=600 update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}"; } \
            >"$work/apt.log" 2>&1 || {
            tail -n 20 "$work/apt.log" >&2
            die "apt-get install ${missing[*]} failed (last lines above)"
        }
    fi
    # Debian's podman-compose (1.0.3) passes `${VAR:-}` through literally; 1.6 reads compose.yaml as Compose does.
    if ! "$cache/venv/bin/podman-compose" --version 2>/dev/null | grep -q "podman-compose version $podman_compose_version"; then
        note "installing podman-compose $podman_compose_version (PyPI) in $cache/venv"
        python3 -m venv "$cache/venv"
        "$cache/venv/bin/pip" install --quiet --disable-pip-version-check "podman-compose==$podman_compose_version"
    fi
}

# podman's own settings, without touching /etc: this machine kind's sandbox refuses crun's setrlimit of the
# default ulimits and runs cgroups in hybrid mode, which crun does not support (docker/README.md).
configure_podman() {
    cat >"$cache/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
EOF
    export CONTAINERS_CONF="$cache/containers.conf"
    BUILDAH_RUNTIME=$(command -v runc)
    export BUILDAH_RUNTIME
    podman info >/dev/null 2>"$work/podman-info.err" || die "podman info fails: $(cat "$work/podman-info.err")"
}

# --- base images ----------------------------------------------------------------------------------

# debian:bookworm-slim's stand-in: a minbase bootstrap with the official slim image's dpkg exclusions, its
# apt settings (no package caches left in a layer after apt-get) and its three apt sources (so that the
# Dockerfile's apt-get sees security fixes). /usr is merged by mmdebstrap's hook, as debuerreotype does it
# for the official image, rather than by the usrmerge package (which would bring perl, 50 MB, along).
# The package caches apt made during the bootstrap are removed by hand: with docker-clean's settings in
# place, mmdebstrap's own cleanup no longer finds them.
make_debian_image() {
    podman image exists "$debian_image" && return
    note "making $debian_image with mmdebstrap (first run only, about a minute)"
    local excludes=() path
    for path in doc man groff info lintian linda locale; do
        excludes+=(--dpkgopt="path-exclude=/usr/share/$path/*")
    done
    cat >"$work/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::Languages "none";
EOF
    # shellcheck disable=SC2016 # "$1" in a hook is mmdebstrap's: the root file system being made
    mmdebstrap --variant=minbase "${excludes[@]}" --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --customize-hook="copy-in $work/docker-clean /etc/apt/apt.conf.d" \
        --customize-hook='rm -f "$1"/var/cache/apt/*.bin' \
        bookworm "$work/rootfs.tar" \
        "deb $mirror bookworm main" "deb $mirror bookworm-updates main" \
        "deb $security_mirror bookworm-security main" </dev/null >"$work/mmdebstrap.log" 2>&1 || {
        tail -n 20 "$work/mmdebstrap.log" >&2
        die "mmdebstrap failed (last lines above; is $mirror reachable? set DATAMODE_DEBIAN_MIRROR)"
    }
    podman import --quiet --change 'CMD ["bash"]' "$work/rootfs.tar" "$debian_image" >/dev/null
    rm -f "$work/rootfs.tar"
}

# swift:6.3-bookworm's stand-in: the official image's packages, and this machine's toolchain laid out as in
# the official image (its usr/ merged into /usr, so the runtime is in /usr/lib/swift/linux as there).
# Every build here runs its RUN steps on the host's network (--network host): on podman's default network,
# netavark would add a bridge (podman0), a veth, iptables rules (NETAVARK_*) and ip_forward=1 to the host's
# own network namespace, and this script changes nothing there (checked at the end).
make_swift_image() {
    podman image exists "$swift_image" && return
    local swift toolchain version
    swift=$(command -v swift) || die "no swift on PATH: the Swift image is made from this machine's toolchain"
    toolchain=$(dirname "$(dirname "$(dirname "$(readlink -f "$swift")")")")
    [ -x "$toolchain/usr/bin/swift" ] || die "cannot find the toolchain directory of $swift (looked at $toolchain)"
    version=$("$toolchain/usr/bin/swift" --version 2>&1 | head -n 1)
    case $version in
        *"Swift version 6.3"*) ;;
        *) die "the toolchain at $toolchain is not Swift 6.3 ($version)" ;;
    esac
    note "making $swift_image from $toolchain ($version; first run only, a few minutes)"
    cat >"$work/swift.Containerfile" <<EOF
FROM $debian_image
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
        binutils git gnupg2 libc6-dev libcurl4-openssl-dev libedit2 libgcc-12-dev libpython3.11 libsqlite3-0 \\
        libstdc++-12-dev libxml2-dev libncurses-dev libz3-dev pkg-config tzdata unzip zlib1g-dev ca-certificates \\
 && rm -rf /var/lib/apt/lists/*
RUN cp -a /toolchain/usr/. /usr/ && swift --version
EOF
    podman build --format docker --network host -v "$toolchain:/toolchain:ro" -f "$work/swift.Containerfile" \
        -t "$swift_image" "$work" >"$work/swift-image.log" 2>&1 || {
        tail -n 20 "$work/swift-image.log" >&2
        die "building $swift_image failed (last lines above)"
    }
}

# --- the image ------------------------------------------------------------------------------------

build_image() {
    # The build stage resolves the Swift packages, and GitHub is out of reach: give it a copy of this machine's
    # SwiftPM cache (a copy, so that the build cannot change the host's).
    local swiftpm_cache="${HOME}/.cache/org.swift.swiftpm"
    [ -d "$swiftpm_cache/repositories" ] ||
        die "no SwiftPM cache at $swiftpm_cache: run swift package resolve on this machine once (it needs the network)"
    rm -rf "$cache/swiftpm"
    cp -a "$swiftpm_cache" "$cache/swiftpm"
    local before after
    before=$(podman image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
    # --format docker keeps the HEALTHCHECK (the OCI format has no field for it). --network host: see above.
    podman build --format docker --network host -v "$cache/swiftpm:/root/.cache/org.swift.swiftpm" \
        -f "$repo/docker/Dockerfile" -t "$image" "$repo" >"$work/build.log" 2>&1 || {
        tail -n 40 "$work/build.log" >&2
        die "podman build of docker/Dockerfile failed (last lines above)"
    }
    after=$(podman image inspect --format '{{.Id}}' "$image")
    # The image this build replaced is no use as a cache any more.
    if [ -n "$before" ] && [ "$before" != "$after" ]; then podman rmi "$before" >/dev/null 2>&1 || true; fi
    # The compose examples' app, built here rather than by podman-compose up (which would build it on the default
    # network: see above); up then finds it and builds nothing.
    podman build --format docker --network host -f "$repo/docker/example/app.Dockerfile" -t "$app_image" \
        "$repo/docker/example" >"$work/app-build.log" 2>&1 || {
        tail -n 20 "$work/app-build.log" >&2
        die "podman build of docker/example/app.Dockerfile failed (last lines above)"
    }
}

# --- helpers for the checks ----------------------------------------------------------------------

# Free TCP ports on 127.0.0.1, as the kernel hands them out (bound, then released for the container).
free_ports() { # COUNT
    python3 -c '
import socket, sys
sockets = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in sockets: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in sockets))
for s in sockets: s.close()' "$1"
}

# A loopback origin: GET /hello answers a fixed text; GET /slow answers 2100 bytes after 3 s (a request in
# flight for the drain check). It logs each request's path and Via header to $work/origin.requests.
start_origin() {
    cat >"$work/origin.py" <<'PY'
import http.server, os, sys, time
work = sys.argv[1]
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.path == "/slow":
            time.sleep(3)
        body = b"hello from the loopback origin\n" if self.path == "/hello" else b"slow body, all of it\n" * 100
        with open(os.path.join(work, "origin.requests"), "a") as log:
            log.write("%s via=%s\n" % (self.path, self.headers.get("Via", "-")))
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(os.path.join(work, "origin.port.tmp"), "w") as f:
    f.write(str(server.server_address[1]))
os.rename(os.path.join(work, "origin.port.tmp"), os.path.join(work, "origin.port"))
server.serve_forever()
PY
    python3 "$work/origin.py" "$work" &
    background+=($!)
    disown $! # not a job: its SIGKILL at the cleanup is not reported as one
    local tries=0
    until [ -s "$work/origin.port" ]; do
        tries=$((tries + 1))
        [ $tries -lt 100 ] || die "the loopback origin did not start"
        sleep 0.1
    done
    origin_port=$(cat "$work/origin.port")
}

# podman run with the settings of every check: host network, read-only root, a tmpfs /tmp, no capabilities,
# no privilege gain, the state volume, the example's config and variant file mounted from the host.
run_proxy() { # NAME [ENV=VALUE...]
    local name=$1 variable environment=()
    shift
    for variable in "$@"; do environment+=(-e "$variable"); done
    containers+=("$name")
    quiet_podman run -d --name "$name" --network host --read-only --tmpfs /tmp --cap-drop ALL \
        --security-opt no-new-privileges \
        -v "$volume:/var/lib/datamode-proxy" \
        -v "$repo/docker/example/datamode.yaml:/etc/datamode-proxy/datamode.yaml:ro" \
        -v "$repo/docker/example/variants:/etc/datamode-proxy/variants:ro" \
        -e "DATAMODE_LISTEN=127.0.0.1:$proxy_port" -e "DATAMODE_ADMIN_LISTEN=127.0.0.1:$admin_port" \
        -e "DATAMODE_ADMIN_TOKEN=$token" -e DATAMODE_THREADS=1 "${environment[@]}" "$image" >/dev/null
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# Waits until /healthz answers 200 (60 s at most); prints the milliseconds since START-MS.
wait_healthy() { # NAME START-MS
    local start=$2
    while true; do
        if curl -fsS -o /dev/null --max-time 1 "http://127.0.0.1:$admin_port/healthz" 2>/dev/null; then
            echo $(($(now_ms) - start))
            return 0
        fi
        if [ "$(podman inspect --format '{{.State.Running}}' "$1")" != true ]; then
            podman logs "$1" 2>&1 | tail -n 20 | sed 's/^/   | /' >&2
            return 1
        fi
        [ $(($(now_ms) - start)) -lt 60000 ] || return 1
        sleep 0.05
    done
}

# METHOD PATH [JSON] on the admin API with the token: the body, then the status on the last line.
admin() {
    local method=$1 path=$2 data=()
    [ $# -lt 3 ] || data=(--data "$3")
    curl -sS --max-time 10 -X "$method" -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
        "${data[@]}" -w '\n%{http_code}' "http://127.0.0.1:$admin_port$path"
}

# URL [CURL-ARGS...] through the proxy: headers to $work/headers, body to $work/body; prints the status.
through_proxy() {
    local url=$1
    shift
    curl -sS --max-time 20 --noproxy '' -x "http://127.0.0.1:$proxy_port" -D "$work/headers" -o "$work/body" \
        -w '%{http_code}' "$@" "$url"
}

header() { # NAME: its value in $work/headers
    sed -n "s/^$1: *//Ip" "$work/headers" | tr -d '\r' | tail -n 1
}

one_line() { tr '\r\n' '  ' | cut -c 1-400; }

# --- the container checks -------------------------------------------------------------------------

check_container() {
    local name="$run_id-proxy" ms out status start
    volume="$run_id-state"
    volumes+=("$volume")
    podman volume create "$volume" >/dev/null
    read -r proxy_port admin_port <<<"$(free_ports 2)"
    token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
    start_origin
    note "proxy 127.0.0.1:$proxy_port, admin API 127.0.0.1:$admin_port, origin 127.0.0.1:$origin_port, volume $volume"

    start=$(now_ms)
    run_proxy "$name" DATAMODE_MODE=normal
    if ms=$(wait_healthy "$name" "$start"); then
        pass "the container starts: GET /healthz is 200 $ms ms after podman run"
        startup_ms=$ms
    else
        fail "the container did not become healthy within 60 s"
        return
    fi

    # The image's own HEALTHCHECK, as podman runs it (no systemd here: `podman healthcheck run` runs it once).
    local healthcheck health
    healthcheck=$(podman image inspect --format '{{json .Config.Healthcheck}}' "$image")
    if [[ $healthcheck == *datamode-healthcheck* ]] && out=$(quiet_podman healthcheck run "$name" 2>&1); then
        health=$(podman inspect --format '{{.State.Health.Status}}' "$name" 2>/dev/null || true)
        pass "HEALTHCHECK $healthcheck: podman healthcheck run exits 0 (${out:-no output}; status ${health:-?})"
    else
        fail "HEALTHCHECK: the image has '$healthcheck'; podman healthcheck run: $out"
    fi

    # What the proxy runs as, as the kernel sees it (PID 1 is the proxy: the entrypoint execs it).
    out=$(podman exec "$name" sh -c 'id -u; cat /proc/1/comm; sed -n "s/^\(CapEff\|CapBnd\|NoNewPrivs\):\s*//p" /proc/1/status; touch /etc/datamode-proxy/x 2>&1 || true' 2>&1)
    if [ "$(printf '%s\n' "$out" | head -n 5 | tr '\n' ' ')" = "10001 datamode-proxy 0000000000000000 0000000000000000 1 " ] &&
        [[ $out == *"Read-only file system"* ]]; then
        pass "PID 1 is datamode-proxy, uid 10001, no capabilities (CapEff, CapBnd 0), no_new_privs, read-only root"
    else
        fail "uid/capabilities/read-only root: $(printf '%s' "$out" | one_line)"
    fi

    out=$(curl -sS -o /dev/null -w '%{http_code}' "http://127.0.0.1:$admin_port/mode")
    if [ "$out" = 401 ]; then pass "GET /mode without the token: 401"; else fail "GET /mode without the token: $out"; fi

    # A request forwarded to an origin on the host's loopback.
    status=$(through_proxy "http://127.0.0.1:$origin_port/hello" || true)
    if [ "$status" = 200 ] && [ "$(cat "$work/body")" = "hello from the loopback origin" ] &&
        grep -q '^/hello via=1.1 datamode-proxy' "$work/origin.requests" 2>/dev/null &&
        podman logs "$name" 2>/dev/null | grep -q "\"url\":\"http://127.0.0.1:$origin_port/hello\".*\"outcome\":\"forwarded\""; then
        pass "GET http://127.0.0.1:$origin_port/hello through the proxy: 200, the origin saw Via: 1.1 datamode-proxy, one access log line"
    else
        fail "proxied GET: status $status, body '$(head -c 200 "$work/body" 2>/dev/null)', origin saw: $(one_line <"$work/origin.requests" 2>/dev/null)"
    fi

    # The mode through the admin API, then a variant file mounted from the host, and a rejection.
    out=$(admin PUT /mode '{"mode": "constrained"}' || true)
    if [ "${out##*$'\n'}" = 200 ] && [[ $out == *'"mode":'*'"constrained"'* ]]; then
        pass "PUT /mode {\"mode\": \"constrained\"}: 200"
    else
        fail "PUT /mode constrained: $(printf '%s' "$out" | one_line)"
    fi
    check_variant "after PUT /mode"
    status=$(through_proxy http://clips.video.example/intro.mp4 || true)
    if [ "$status" = 403 ] && [ "$(header Network-Unavailable-Reason)" = constrained ]; then
        pass "GET http://clips.video.example/intro.mp4 (rule video-is-discretionary): 403, Network-Unavailable-Reason: constrained"
    else
        fail "constrained rejection: status $status, $(one_line <"$work/headers")"
    fi

    # The API mode lives in the state volume: a new container on the same volume starts in it, although its
    # DATAMODE_MODE says normal. (The root file system is read-only: the volume is the only place it can be.)
    quiet_podman stop "$name" >/dev/null
    quiet_podman rm "$name" >/dev/null
    start=$(now_ms)
    run_proxy "$name" DATAMODE_MODE=normal
    if ms=$(wait_healthy "$name" "$start"); then
        restart_ms=$ms
        out=$(admin GET /mode || true)
        if [[ $out == *'"mode":'*'"constrained"'* && $out == *'"source":'*'"api"'* ]]; then
            pass "the API mode survives: a new container on the same volume is constrained (source api), up in $ms ms"
        else
            fail "the API mode in a new container: $(printf '%s' "$out" | one_line)"
        fi
        check_variant "in the new container"
    else
        fail "the new container on the same volume did not become healthy"
        return
    fi

    # SIGTERM (podman stop sends the image's STOPSIGNAL) while a request is in flight: it completes, exit 0.
    local slow stop_ms exit_code
    through_proxy "http://127.0.0.1:$origin_port/slow" >"$work/slow.status" 2>&1 &
    slow=$!
    background+=("$slow")
    sleep 1
    start=$(now_ms)
    quiet_podman stop -t $((drain_timeout + 5)) "$name" >/dev/null
    stop_ms=$(($(now_ms) - start))
    wait "$slow" || true
    exit_code=$(podman inspect --format '{{.State.ExitCode}}' "$name")
    if [ "$exit_code" = 0 ] && [ "$stop_ms" -lt $((drain_timeout * 1000)) ] && [ "$(cat "$work/slow.status")" = 200 ] &&
        [ "$(wc -c <"$work/body")" = 2100 ]; then
        pass "SIGTERM with a request in flight: the request completes (200, 2100 bytes), exit 0 after $stop_ms ms (drain-timeout ${drain_timeout} s)"
    else
        fail "SIGTERM: exit $exit_code after $stop_ms ms; the request in flight: $(one_line <"$work/slow.status"), $(wc -c <"$work/body") bytes"
    fi

    # A bad DATAMODE_MODE stops the start, with the entrypoint's message.
    local bad="$run_id-bad"
    containers+=("$bad")
    status=0
    timeout 60 podman run --name "$bad" --network host --read-only --cap-drop ALL -e DATAMODE_MODE=bogus "$image" \
        >"$work/bad.out" 2>&1 || status=$?
    out=$(grep -v -e 'unable to get systemd connection' "$work/bad.out" || true)
    if [ "$status" = 78 ] && [[ $out == *"DATAMODE_MODE='bogus' is not a data mode"* ]]; then
        pass "DATAMODE_MODE=bogus: exit 78, $(printf '%s' "$out" | head -n 1 | cut -c 1-80)..."
    else
        fail "DATAMODE_MODE=bogus: exit $status, output: $(printf '%s' "$out" | one_line)"
    fi
}

check_variant() { # WHEN
    local status
    status=$(through_proxy http://cdn.example/promo.mp4 -H 'Allow-Constrained: ?0' || true)
    if [ "$status" = 200 ] && [ "$(header Data-Mode-Variant)" = promo-poster ] &&
        cmp -s "$work/body" "$repo/docker/example/variants/promo-poster.svg"; then
        pass "$1: GET http://cdn.example/promo.mp4 is the variant file mounted from the host (200, Data-Mode-Variant: promo-poster, same bytes)"
    else
        fail "$1: the variant: status $status, $(one_line <"$work/headers")"
    fi
}

# --- the compose example --------------------------------------------------------------------------

compose() {
    "$cache/venv/bin/podman-compose" -p "$run_id" -f "$repo/docker/compose.yaml" "$@" 2>&1 |
        { grep -v -e 'unable to get systemd connection' || true; }
    return "${PIPESTATUS[0]}"
}

check_compose() {
    local out app_log proxy_log tries
    read -r proxy_port admin_port <<<"$(free_ports 2)"
    export DATAMODE_PORT=$proxy_port DATAMODE_ADMIN_PORT=$admin_port DATAMODE_MODE=constrained
    export DATAMODE_ADMIN_TOKEN=$token EXAMPLE_PAGE_URL="http://127.0.0.1:$origin_port/hello" EXAMPLE_INTERVAL=1
    note "proxy 127.0.0.1:$proxy_port, admin API 127.0.0.1:$admin_port, origin 127.0.0.1:$origin_port, DATAMODE_MODE=constrained, project $run_id"
    if out=$(compose config 2>&1); then
        pass "podman-compose config accepts docker/compose.yaml"
    else
        fail "podman-compose config: $(printf '%s' "$out" | one_line)"
    fi
    : >"$work/origin.requests"
    compose_up=true
    if ! out=$(compose up -d 2>&1); then
        fail "podman-compose up -d: $(printf '%s' "$out" | tail -n 20)"
        return
    fi
    tries=0
    while true; do
        app_log=$(podman logs "${run_id}_app_1" 2>/dev/null || true)
        if [[ $app_log == *"video  200 variant=promo-poster"* && $app_log == *"clip   403 reason=constrained"* &&
            $app_log == *"page   200"* ]]; then
            break
        fi
        tries=$((tries + 1))
        if [ $tries -ge 240 ]; then
            fail "the app's log after 120 s: $(printf '%s' "$app_log" | tail -n 10)"
            podman logs "${run_id}_datamode-proxy_1" 2>&1 | tail -n 10 | sed 's/^/   | /'
            return
        fi
        sleep 0.5
    done
    printf '%s\n' "$app_log" | head -n 3 | sed 's/^/   app | /'
    proxy_log=$(podman logs "${run_id}_datamode-proxy_1" 2>/dev/null || true)
    if [[ $proxy_log == *'"url":"http://cdn.example/promo.mp4"'*'"variant":"promo-poster"'* ]]; then
        pass "the app got the variant (video 200 variant=promo-poster), and the proxy's access log has the request"
    else
        fail "the app's variant request is not in the proxy's access log: $(printf '%s' "$proxy_log" | tail -n 3)"
    fi
    if [[ $proxy_log == *'"url":"http://clips.video.example/intro.mp4"'*'"outcome":"rejected"'* ]]; then
        pass "the app got a constrained rejection (clip 403 reason=constrained), and the proxy's access log has it"
    else
        fail "the app's rejected request is not in the proxy's access log: $(printf '%s' "$proxy_log" | tail -n 3)"
    fi
    if grep -q '^/hello via=1.1 datamode-proxy' "$work/origin.requests"; then
        pass "the app's page request reached the loopback origin through the proxy (Via: 1.1 datamode-proxy)"
    else
        fail "the origin saw no request of the app through the proxy: $(one_line <"$work/origin.requests")"
    fi
    compose_up=false
    if out=$(compose down -v 2>&1) &&
        [ -z "$(podman ps -a -q --filter "label=io.podman.compose.project=$run_id")" ] &&
        [ -z "$(podman volume ls -q --filter "label=io.podman.compose.project=$run_id")" ]; then
        pass "podman-compose down -v: no container and no volume of the project is left"
    else
        fail "podman-compose down -v left: $(podman ps -a -q --filter "label=io.podman.compose.project=$run_id") $(podman volume ls -q --filter "label=io.podman.compose.project=$run_id") ($(printf '%s' "$out" | one_line))"
    fi
}

# --- the transparent sidecar example (SPEC §16) ---------------------------------------------------

# The pod's network namespace: one this script makes (`ip netns add`) and removes, with loopback and a veth pair
# whose both ends stay in it (this machine's kernel has no dummy interfaces), one of them holding 10.89.0.2/24 and
# the default route, as a pod's eth0 does: the app's connections to any address are routed, and then redirected
# to the proxy by the init container's rules, inside that namespace; nothing leaves it. The compose file's
# default network, a bridge, would have netavark add a bridge interface and iptables rules in the host's own
# namespace; an override file (the only change to the compose file) puts the proxy, and so the whole pod
# (network_mode: service:datamode-proxy), in this namespace instead.
transparent_netns=''
make_transparent_netns() {
    transparent_netns=$run_id
    ip netns add "$transparent_netns" || return 1
    ip -n "$transparent_netns" link set lo up &&
        ip -n "$transparent_netns" link add dm0 type veth peer name dm1 &&
        ip -n "$transparent_netns" addr add 10.89.0.2/24 dev dm0 &&
        ip -n "$transparent_netns" link set dm1 up &&
        ip -n "$transparent_netns" link set dm0 up &&
        ip -n "$transparent_netns" route add default dev dm0 || return 1
    cat >"$work/transparent.override.yaml" <<EOF
services:
  datamode-proxy:
    network_mode: "ns:/run/netns/$transparent_netns"
EOF
}

compose_transparent() {
    "$cache/venv/bin/podman-compose" -p "$run_id-transparent" -f "$repo/docker/transparent/compose.yaml" \
        -f "$work/transparent.override.yaml" "$@" 2>&1 |
        { grep -v -e 'unable to get systemd connection' || true; }
    return "${PIPESTATUS[0]}"
}

check_transparent_compose() {
    local out app_log proxy_log rules_exit tries app_env project=$run_id-transparent
    export DATAMODE_MODE=constrained EXAMPLE_INTERVAL=1
    if ! make_transparent_netns; then
        fail "ip netns add $run_id (the pod's network namespace) failed"
        return
    fi
    note "project $project: the app has no proxy variable; an init container with NET_ADMIN applies transparent-rules"
    note "in network namespace $transparent_netns (lo; veth dm0 10.89.0.2/24 with the default route, its peer dm1 in it too)"
    transparent_up=true
    # In two steps, in Compose's order: podman 4.3 cannot start a container that requires an exited one whose own
    # dependency is running ("generating dependency graph for container ...: container ... depends on container
    # ... not found in input list"): the app requires the init container, which joined the proxy's namespace.
    # So the proxy and the init container first; then, once the init container has exited 0 (what
    # service_completed_successfully means; podman-compose only waits for it to stop), the app without
    # --requires (up --no-deps).
    if ! out=$(compose_transparent up -d datamode-proxy datamode-rules 2>&1); then
        fail "podman-compose up -d datamode-proxy datamode-rules (transparent): $(printf '%s' "$out" | tail -n 20)"
        return
    fi
    rules_exit=$(timeout 60 podman wait "${project}_datamode-rules_1" 2>/dev/null || echo '?')
    if [ "$rules_exit" = 0 ]; then
        pass "the init container (NET_ADMIN, in the proxy's network namespace) applied the rules and exited 0"
    else
        fail "the init container exited $rules_exit: $(podman logs "${project}_datamode-rules_1" 2>&1 | one_line)"
        return
    fi
    if ! out=$(compose_transparent up -d --no-deps app 2>&1); then
        fail "podman-compose up -d --no-deps app (transparent): $(printf '%s' "$out" | tail -n 20)"
        return
    fi
    tries=0
    while true; do
        app_log=$(podman logs "${project}_app_1" 2>/dev/null || true)
        if [[ $app_log == *"video  200 variant=promo-poster"* && $app_log == *"clip   403 reason=constrained"* &&
            $app_log == *"tls    403 reason=constrained"* ]]; then
            break
        fi
        tries=$((tries + 1))
        if [ $tries -ge 240 ]; then
            fail "the transparent app's log after 120 s: $(printf '%s' "$app_log" | tail -n 10)"
            podman logs "${project}_datamode-proxy_1" 2>&1 | tail -n 10 | sed 's/^/   | /'
            podman logs "${project}_datamode-rules_1" 2>&1 | tail -n 10 | sed 's/^/   rules | /'
            return
        fi
        sleep 0.5
    done
    printf '%s\n' "$app_log" | head -n 3 | sed 's/^/   app | /'
    # What the app runs with, as podman started it: no proxy variable in any spelling.
    app_env=$(podman inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "${project}_app_1" 2>&1 || true)
    if [ -n "$app_env" ] && ! printf '%s\n' "$app_env" | grep -qi -e '^[a-z_]*proxy='; then
        pass "the app's environment has no proxy variable (no http_proxy, https_proxy, all_proxy in any case)"
    else
        fail "the app's environment: $(printf '%s\n' "$app_env" | grep -i proxy | one_line)"
    fi
    # Each answer the app printed, and the proxy's access log line of it: one line with the URL, the outcome and
    # "source":"transparent" (the connection came through the transparent listener, not the proxy port).
    proxy_log=$(podman logs "${project}_datamode-proxy_1" 2>/dev/null || true)
    if printf '%s\n' "$proxy_log" |
        grep -q '"url":"http://cdn.example/promo.mp4","status":200,.*"variant":"promo-poster","source":"transparent"'; then
        pass "the app with no proxy setting got the variant (video 200 variant=promo-poster); access log: \"variant\":\"promo-poster\",\"source\":\"transparent\""
    else
        fail "no transparent variant line in the proxy's access log: $(printf '%s' "$proxy_log" | tail -n 3)"
    fi
    if printf '%s\n' "$proxy_log" |
        grep -q '"url":"http://clips.video.example/intro.mp4","status":403,.*"outcome":"rejected",.*"source":"transparent"'; then
        pass "the app with no proxy setting got a constrained refusal (clip 403 reason=constrained); access log: \"outcome\":\"rejected\", \"source\":\"transparent\""
    else
        fail "no transparent refusal in the proxy's access log: $(printf '%s' "$proxy_log" | tail -n 3)"
    fi
    if printf '%s\n' "$proxy_log" |
        grep -q '"url":"https://clips.video.example/intro.mp4","status":403,.*"outcome":"rejected",.*"source":"transparent"'; then
        pass "the app's HTTPS request was refused inside TLS (tls 403 reason=constrained, the proxy's CA); access log: \"source\":\"transparent\""
    else
        fail "no transparent HTTPS refusal in the proxy's access log: $(printf '%s' "$proxy_log" | tail -n 3)"
    fi
    transparent_up=false
    if out=$(compose_transparent down -v 2>&1) &&
        [ -z "$(podman ps -a -q --filter "label=io.podman.compose.project=$project")" ] &&
        [ -z "$(podman volume ls -q --filter "label=io.podman.compose.project=$project")" ]; then
        pass "podman-compose down -v (transparent): no container and no volume of the project is left"
    else
        fail "podman-compose down -v (transparent) left: $(podman ps -a -q --filter "label=io.podman.compose.project=$project") $(podman volume ls -q --filter "label=io.podman.compose.project=$project") ($(printf '%s' "$out" | one_line))"
    fi
    ip netns del "$transparent_netns" && transparent_netns=''
}

# The host's own network namespace: its iptables and ip6tables rules (without their counters), interfaces, routes
# and IPv4 forwarding, to compare at the end with the start.
host_network() {
    { iptables-save || true; ip6tables-save || true; } 2>/dev/null | grep -v '^#' | sed 's/ \[[0-9]*:[0-9]*\]$//'
    ip -o link show | awk -F': ' '{ print $2 }'
    ip route show
    printf 'ip_forward=%s\n' "$(cat /proc/sys/net/ipv4/ip_forward)"
}

check_host_network() {
    local now
    now=$(host_network)
    if [ "$now" = "$host_network_at_start" ]; then
        pass "the host's own network namespace is as at the start: the same iptables and ip6tables rules, interfaces, routes and ip_forward"
    else
        fail "the host's network namespace changed: $(diff <(printf '%s\n' "$host_network_at_start") <(printf '%s\n' "$now") | grep '^[<>]' | one_line)"
    fi
}

# --- main -----------------------------------------------------------------------------------------

mkdir -p "$cache"
work=$(mktemp -d "$cache/run.XXXXXX")
# Temporary files of apt-get, mmdebstrap and podman go there too, and are removed with it.
export TMPDIR=$work

section "setup"
install_packages
configure_podman
host_network_at_start=$(host_network)
note "podman $(podman version --format '{{.Client.Version}}'), runc $(runc --version | sed -n 's/^runc version //p'), $("$cache/venv/bin/podman-compose" --version 2>/dev/null | grep podman-compose)"
make_debian_image
make_swift_image
note "base images ready ($(elapsed))"

section "build docker/Dockerfile"
build_image
megabytes() { podman image inspect --format '{{.Size}}' "$1" | awk '{ printf "%.0f MB", $1 / 1e6 }'; }
note "built $image ($(elapsed) since the start): $(megabytes "$image"), on $debian_image of $(megabytes "$debian_image")"
note "in it: Swift runtime $(quiet_podman run --rm --network none "$image" du -sh /usr/lib/swift/linux | cut -f 1), datamode-proxy $(quiet_podman run --rm --network none "$image" du -sh /usr/local/bin/datamode-proxy | cut -f 1)"

section "the container (host network, read-only root, no capabilities)"
check_container
note "start-up (podman run to GET /healthz 200): ${startup_ms:-?} ms; a new container on the same volume: ${restart_ms:-?} ms"

section "docker/compose.yaml with podman-compose"
check_compose

section "docker/transparent/compose.yaml: the transparent sidecar"
check_transparent_compose

section "the host"
check_host_network

section "result"
printf '%d checks passed, %d failed, in %s\n' "$passes" "$failures" "$(elapsed)"
[ "$failures" -eq 0 ]
