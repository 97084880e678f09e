#!/bin/bash
# SPEC §7/§18: POST /deferred/flush "deliver now, whatever the mode". With 6 uploads queued to one origin under
# constrained mode, a flush answers {"flushing": 6} but only `deferral.concurrency` (2) are delivered; the other 4
# stay queued for as long as the mode refuses them.  Expected: all 6 delivered.
HERE=$(cd "$(dirname "$0")" && pwd); export R=${R:-/tmp/r15d}
$HERE/drig.sh stop 2>/dev/null; sleep 0.3; rm -rf $R; mkdir -p $R
$HERE/drig.sh origin; $HERE/drig.sh proxy
for i in 1 2 3 4 5 6; do
  curl -sS -x 127.0.0.1:39977 -H 'Allow-Constrained: ?0' -H 'Prefer: respond-async' --data-binary "upload $i" \
       -o /dev/null -w '%{http_code} ' http://127.0.0.1:39980/sink/$i
done; echo
curl -s -X POST http://127.0.0.1:39978/deferred/flush; echo
sleep 5
curl -s http://127.0.0.1:39978/deferred | python3 -c 'import json,sys,collections; print(collections.Counter(e["status"] for e in json.load(sys.stdin)))'
echo "origin received $(grep -c SINK $R/origin.log) of 6"
$HERE/drig.sh stop
