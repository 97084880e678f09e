#!/bin/bash
# Container health check: exit 0 when the admin API answers `GET /healthz` with 200 (SPEC.md section 7).
# Used by the Dockerfile's HEALTHCHECK and by a Kubernetes exec probe (docker/README.md): an exec probe
# runs inside the pod's network namespace, so it also works when the admin API listens on 127.0.0.1 only,
# where an httpGet probe (sent to the pod IP) could not reach it.
# Bash only (its /dev/tcp), so the image needs no curl. The caller's timeout (HEALTHCHECK --timeout,
# timeoutSeconds) bounds a connect that hangs; a read waits at most 3 seconds.
set -u

address=${DATAMODE_ADMIN_LISTEN:-127.0.0.1:8878}
host=${address%:*}
port=${address##*:}
case $host in
    0.0.0.0) host=127.0.0.1 ;;      # a wildcard listener is reached on loopback
    '[::]') host=::1 ;;
    \[*\]) host=${host#\[}; host=${host%\]} ;;
esac

if ! exec 3<>"/dev/tcp/$host/$port"; then
    echo "datamode-healthcheck: cannot connect to the admin API at $host port $port" >&2
    exit 1
fi
authorization=''
if [ -n "${DATAMODE_ADMIN_TOKEN:-}" ]; then
    authorization="Authorization: Bearer $DATAMODE_ADMIN_TOKEN"$'\r\n'
fi
printf 'GET /healthz HTTP/1.1\r\nHost: %s\r\n%sConnection: close\r\n\r\n' "$address" "$authorization" >&3

status_line=''
IFS= read -r -t 3 status_line <&3
exec 3<&-
status_line=${status_line%$'\r'}
if [[ $status_line =~ ^HTTP/1\.[01]\ 200($|\ ) ]]; then
    exit 0
fi
echo "datamode-healthcheck: GET /healthz at $host port $port answered '${status_line:-nothing}'" >&2
exit 1
