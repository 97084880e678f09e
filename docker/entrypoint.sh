#!/bin/sh
# datamode-proxy container entrypoint: DATAMODE_* environment in, one `datamode-proxy run` invocation out.
#
# It exists so that a bad container setting fails at start with a message that names the variable,
# instead of a proxy that listens on the wrong address or an admin API open to the network.
# The proxy reads the same variables itself (SPEC.md section 8); this script only
#   - treats an empty variable as unset (compose passes `X: ${X:-}` through as an empty string),
#   - checks every value's format before the proxy starts,
#   - refuses a non-loopback admin API without a token (SPEC.md section 7, checked up front),
#   - turns the container defaults (listen on 0.0.0.0, state in the volume) into explicit flags,
#   - then replaces itself with the proxy (exec), so the proxy is PID 1 and gets SIGTERM directly.
# The token never goes on the command line (it would show in `ps`): the proxy reads DATAMODE_ADMIN_TOKEN.
#
# Commands (the image's CMD is `run`):
#   run [FLAGS]                  validate, then exec `datamode-proxy run` with flags from the environment;
#                                a FLAG given here wins over its variable
#   -*  (other than -h/--help/--version)   same as `run -*`
#   check [FLAGS]                exec `datamode-proxy check`, with --config DATAMODE_CONFIG unless given
#   every other datamode-proxy subcommand (mode, variants, sessions, watch, ca, conditions, budgets,
#   transparent-rules, deferred, status, schedule, help) and -h | --help | --version
#                                exec `datamode-proxy ARGS` (formats checked); a test compares this list
#                                with the binary's own (`--experimental-dump-help`)
#   datamode-proxy ARGS          the same as ARGS
#   anything else                exec'd as is (e.g. `sh`)
# DATAMODE_ENTRYPOINT_DRY_RUN=1 prints the command that would be exec'd, one shell-quoted line on stdout,
# and exits 0 (or 78 with the same messages as a real start).
# Exit status 78 (EX_CONFIG): an invalid DATAMODE_* value; the message says which and why.
set -eu

prog=datamode-entrypoint
proxy=datamode-proxy

# The image's layout. docker/Dockerfile puts the config and the state volume here (a test checks they agree).
default_config=/etc/datamode-proxy/datamode.yaml
default_listen=0.0.0.0:8877
default_admin_listen=127.0.0.1:8878
default_state_dir=/var/lib/datamode-proxy

known_variables="DATAMODE_CONFIG DATAMODE_LISTEN DATAMODE_ADMIN_LISTEN DATAMODE_MODE DATAMODE_ADMIN_TOKEN DATAMODE_STATE_DIR DATAMODE_THREADS DATAMODE_ENTRYPOINT_DRY_RUN"

fail() {
    printf '%s: error: %s\n' "$prog" "$*" >&2
    exit 78
}

note() {
    printf '%s: %s\n' "$prog" "$*" >&2
}

# Prints one argument so that a POSIX shell reads it back unchanged.
quote() {
    case $1 in
        '') printf "''" ;;
        *[!A-Za-z0-9_./:=@%+,-]*) printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")" ;;
        *) printf '%s' "$1" ;;
    esac
}

# exec "$@", or with DATAMODE_ENTRYPOINT_DRY_RUN=1 print it instead.
launch() {
    if [ "${DATAMODE_ENTRYPOINT_DRY_RUN:-0}" = 1 ]; then
        first=1
        for word in "$@"; do
            [ "$first" = 1 ] || printf ' '
            quote "$word"
            first=0
        done
        printf '\n'
        exit 0
    fi
    exec "$@"
}

# --- checks; each message names the variable ------------------------------------------------------

# An empty value means "not set": drop it so the proxy does not read an empty string either.
normalize_environment() {
    for name in $known_variables; do
        eval "value=\${$name-}"
        # shellcheck disable=SC2154 # assigned by the eval above
        if [ -z "$value" ]; then unset "$name"; fi
    done
    for name in $(env | sed -n 's/^\(DATAMODE_[A-Za-z0-9_]*\)=.*/\1/p'); do
        case " $known_variables " in
            *" $name "*) ;;
            *) note "warning: ignoring unknown variable $name (known: $known_variables)" ;;
        esac
    done
    case ${DATAMODE_ENTRYPOINT_DRY_RUN:-0} in
        0 | 1) ;;
        *) fail "DATAMODE_ENTRYPOINT_DRY_RUN='${DATAMODE_ENTRYPOINT_DRY_RUN}' must be 1 (print the command) or 0" ;;
    esac
}

check_mode() { # VARIABLE VALUE
    case $2 in
        normal | constrained | expensive | constrained-expensive | low-data | cellular) ;;
        ultra-constrained | constrained-ultra-constrained | expensive-ultra-constrained) ;;
        constrained-expensive-ultra-constrained | satellite) ;;
        *) fail "$1='$2' is not a data mode; use one of: normal, constrained, expensive, constrained-expensive, ultra-constrained, constrained-ultra-constrained, expensive-ultra-constrained, constrained-expensive-ultra-constrained, low-data (= constrained), cellular (= expensive), satellite (= all three)" ;;
    esac
}

is_decimal() { # VALUE MAX-DIGITS
    case $1 in '' | *[!0-9]*) return 1 ;; esac
    [ "${#1}" -le "$2" ]
}

is_ipv4() {
    case $1 in *.*.*.*.* | *[!0-9.]*) return 1 ;; esac
    old_ifs=$IFS
    IFS=.
    # shellcheck disable=SC2086 # split on dots on purpose
    set -- $1
    IFS=$old_ifs
    [ $# -eq 4 ] || return 1
    for octet in "$@"; do
        is_decimal "$octet" 3 && [ "$octet" -le 255 ] || return 1
    done
}

# HOST:PORT with HOST an IPv4 address, a bracketed IPv6 address or localhost, and PORT 0-65535
# (0: any free port, which the proxy logs; for tests).
check_listen() { # VARIABLE VALUE
    example="such as 0.0.0.0:8877, 127.0.0.1:8878 or [::]:8877"
    case $2 in
        *:*) ;;
        *) fail "$1='$2' is not HOST:PORT ($example)" ;;
    esac
    host=${2%:*}
    port=${2##*:}
    if ! is_decimal "$port" 5 || [ "$port" -gt 65535 ]; then
        fail "$1='$2': the port '$port' must be a number from 0 to 65535 ($example)"
    fi
    case $host in
        localhost) ;;
        \[*\])
            inner=${host#\[}
            inner=${inner%\]}
            case $inner in
                *:*) ;;
                *) fail "$1='$2': '$host' is not an IPv6 address" ;;
            esac
            case $inner in
                *[!0-9A-Fa-f:.]*) fail "$1='$2': '$host' is not an IPv6 address" ;;
            esac
            ;;
        *:*) fail "$1='$2': put an IPv6 address in brackets, as in [::]:8877" ;;
        *) is_ipv4 "$host" || fail "$1='$2': the host '$host' must be an IP address or localhost ($example)" ;;
    esac
}

is_loopback_listen() { # HOST:PORT (already checked)
    case ${1%:*} in
        localhost | 127.* | '[::1]' | '[0:0:0:0:0:0:0:1]') return 0 ;;
        *) return 1 ;;
    esac
}

check_threads() { # VARIABLE VALUE
    is_decimal "$2" 4 || fail "$1='$2' must be a whole number from 0 to 9999 (0 = one worker per core)"
}

check_token() {
    token=$DATAMODE_ADMIN_TOKEN
    case $token in
        *[[:space:][:cntrl:]]*) fail "DATAMODE_ADMIN_TOKEN contains whitespace or control characters (a trailing newline from a file?); it is sent as 'Authorization: Bearer TOKEN'" ;;
    esac
    if [ "${#token}" -lt 16 ]; then
        fail "DATAMODE_ADMIN_TOKEN is ${#token} characters long; use at least 16 (e.g. the output of: openssl rand -hex 24)"
    fi
}

check_state_dir() { # VARIABLE VALUE
    case $2 in
        /*) ;;
        *) fail "$1='$2' must be an absolute path (the image's volume is $default_state_dir)" ;;
    esac
    if [ -e "$2" ] && [ ! -d "$2" ]; then
        fail "$1='$2' is not a directory"
    fi
}

# Formats only; used before every datamode-proxy command.
check_variable_formats() {
    [ -z "${DATAMODE_MODE+set}" ] || check_mode DATAMODE_MODE "$DATAMODE_MODE"
    [ -z "${DATAMODE_LISTEN+set}" ] || check_listen DATAMODE_LISTEN "$DATAMODE_LISTEN"
    [ -z "${DATAMODE_ADMIN_LISTEN+set}" ] || check_listen DATAMODE_ADMIN_LISTEN "$DATAMODE_ADMIN_LISTEN"
    [ -z "${DATAMODE_THREADS+set}" ] || check_threads DATAMODE_THREADS "$DATAMODE_THREADS"
    [ -z "${DATAMODE_STATE_DIR+set}" ] || check_state_dir DATAMODE_STATE_DIR "$DATAMODE_STATE_DIR"
    [ -z "${DATAMODE_ADMIN_TOKEN+set}" ] || check_token
}

# A config file may carry the token itself (`admin: {token: ...}`); only then may the environment lack it.
# A rough look is enough: when it is wrong, the proxy still refuses to start (SPEC.md section 7).
config_has_token() { # FILE
    sed -En 's/^(.*[[:space:]{,])?token:[[:space:]]*([^[:space:]#,}]*).*$/\2/p' "$1" |
        grep -Evq "^(|null|Null|NULL|~|\"\"|'')\$"
}

# --- run ------------------------------------------------------------------------------------------

run_proxy() {
    check_variable_formats

    # Flags given after `run` win over their variables, so only fill in those that are missing.
    flag_config='' flag_listen='' flag_admin_listen='' flag_state_dir='' flag_mode='' flag_threads=''
    expect=''
    for arg in "$@"; do
        if [ -n "$expect" ]; then
            eval "flag_$expect=\$arg"
            expect=''
            continue
        fi
        case $arg in
            --config) expect=config ;;
            --config=*) flag_config=${arg#*=} ;;
            --listen) expect=listen ;;
            --listen=*) flag_listen=${arg#*=} ;;
            --admin-listen) expect=admin_listen ;;
            --admin-listen=*) flag_admin_listen=${arg#*=} ;;
            --state-dir) expect=state_dir ;;
            --state-dir=*) flag_state_dir=${arg#*=} ;;
            --mode) expect=mode ;;
            --mode=*) flag_mode=${arg#*=} ;;
            --threads) expect=threads ;;
            --threads=*) flag_threads=${arg#*=} ;;
        esac
    done

    config=${flag_config:-${DATAMODE_CONFIG:-$default_config}}
    listen=${DATAMODE_LISTEN:-$default_listen}
    admin_listen=${flag_admin_listen:-${DATAMODE_ADMIN_LISTEN:-$default_admin_listen}}
    state_dir=${flag_state_dir:-${DATAMODE_STATE_DIR:-$default_state_dir}}

    config_source=DATAMODE_CONFIG
    [ -z "$flag_config" ] || config_source=--config
    if [ ! -f "$config" ]; then
        if [ -n "${DATAMODE_CONFIG+set}" ] || [ -n "$flag_config" ]; then
            fail "$config_source='$config': no such file (mount the file there, or unset DATAMODE_CONFIG to use the image's $default_config)"
        fi
        fail "the default config $default_config is missing; set DATAMODE_CONFIG to your config file's path"
    fi
    [ -r "$config" ] || fail "$config_source='$config' is not readable by uid $(id -u)"

    admin_source=DATAMODE_ADMIN_LISTEN
    [ -z "$flag_admin_listen" ] || admin_source=--admin-listen
    if ! is_loopback_listen "$admin_listen" && [ -z "${DATAMODE_ADMIN_TOKEN+set}" ] && ! config_has_token "$config"; then
        fail "$admin_source='$admin_listen' is not a loopback address and no admin token is set: anyone who can reach that port could change the data mode. Set DATAMODE_ADMIN_TOKEN (e.g. to the output of: openssl rand -hex 24) or admin.token in the config file, or keep the admin API on $default_admin_listen"
    fi

    if [ -d "$state_dir" ]; then
        [ -w "$state_dir" ] || fail "DATAMODE_STATE_DIR='$state_dir' is not writable by uid $(id -u): chown a bind-mounted directory to $(id -u):$(id -g), or use a named volume"
    elif [ "${DATAMODE_ENTRYPOINT_DRY_RUN:-0}" = 1 ]; then
        note "would create DATAMODE_STATE_DIR='$state_dir'"
    else
        mkdir -p "$state_dir" 2>/dev/null || fail "DATAMODE_STATE_DIR='$state_dir' does not exist and cannot be created by uid $(id -u)"
    fi

    # Build: proxy run [--config C] [--listen L] [--admin-listen A] [--state-dir S] [--mode M] [--threads N] FLAGS...
    flags_from_env=''
    add() { flags_from_env="$flags_from_env $(quote "$1") $(quote "$2")"; }
    [ -n "$flag_config" ] || add --config "$config"
    [ -n "$flag_listen" ] || add --listen "$listen"
    [ -n "$flag_admin_listen" ] || add --admin-listen "$admin_listen"
    [ -n "$flag_state_dir" ] || add --state-dir "$state_dir"
    [ -n "$flag_mode" ] || [ -z "${DATAMODE_MODE+set}" ] || add --mode "$DATAMODE_MODE"
    [ -n "$flag_threads" ] || [ -z "${DATAMODE_THREADS+set}" ] || add --threads "$DATAMODE_THREADS"
    eval "set -- $flags_from_env \"\$@\"" # the caller's flags go last
    launch "$proxy" run "$@"
}

# --- dispatch -------------------------------------------------------------------------------------

normalize_environment
[ $# -gt 0 ] || set -- run
if [ "$1" = "$proxy" ]; then
    shift
    [ $# -gt 0 ] || set -- --help
fi
case $1 in
    run)
        shift
        run_proxy "$@"
        ;;
    check)
        check_variable_formats
        # Without --config, check the file `run` would load.
        case " $* " in
            *" --config "* | *" --config="*) launch "$proxy" "$@" ;;
            *) launch "$proxy" "$@" --config "${DATAMODE_CONFIG:-$default_config}" ;;
        esac
        ;;
    mode | variants | sessions | watch | ca | conditions | budgets | transparent-rules | deferred | status | schedule | help | -h | --help | --version)
        check_variable_formats
        launch "$proxy" "$@"
        ;;
    -*)
        run_proxy "$@"
        ;;
    *)
        launch "$@"
        ;;
esac
