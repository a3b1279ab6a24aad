"""The ``runpodctl`` stand-in a fresh local pod's directory holds
(docs/architecture.md#pod-providers).

Stdlib only: the provider writes these files when it lays out a pod.
"""

from __future__ import annotations

import shlex
from pathlib import Path

__all__ = ["POD_FAULTS_ENV", "X509_ERROR", "runpodctl_script"]

X509_ERROR = (
    'Error: Post "https://api.runpod.io/graphql?api_key=XXX": x509: certificate signed by '
    "unknown authority"
)
"""What runpodctl prints in an image without CA certificates (runpod/runpodctl#149)."""

POD_FAULTS_ENV = "PREFECT_RUNPOD_POD_FAULTS"
"""Faults inside a pod, for tests: ``runpodctl:x509`` makes the ``runpodctl`` stand-in
fail as in an image without CA certificates."""


def runpodctl_script(pod_id: str, pid_file: Path, bin_dir: Path, ending: Path) -> str:
    """The pod's ``runpodctl`` stand-in. ``pod delete <id>`` (runpodctl 2.x) and the
    deprecated ``remove pod <id>`` end the pod, ``stop pod <id>`` too (a local pod cannot
    be stopped without ending it): it writes who asked into ``ending.json``
    (``$PREFECT_RUNPOD_ENDED_BY``, the dead-man sets it) and signals the pod's daemon."""
    return f"""#!/bin/sh
# runpodctl for local pod {pod_id}: `runpodctl pod delete <id>` (or the deprecated
# `runpodctl remove pod <id>`) asks the pod's daemon to end the pod; the daemon then ends
# every process of the pod, this one included.
POD_ID={shlex.quote(pod_id)}
PID_FILE={shlex.quote(str(pid_file))}
BIN_DIR={shlex.quote(str(bin_dir))}
ENDING={shlex.quote(str(ending))}
case ",$PREFECT_RUNPOD_POD_FAULTS," in
  *,runpodctl:x509,*) echo {shlex.quote(X509_ERROR)} >&2; exit 1 ;;
esac
verb=""
case "$1 $2" in
  "pod delete"|"pod remove"|"pod rm") verb="pod $2"; id="$3" ;;
  "remove pod"|"remove pods"|"stop pod"|"stop pods") verb="$1 pod"; id="$3" ;;
esac
if [ -n "$verb" ]; then
  [ "$1" = remove ] && echo "Warning: 'runpodctl remove pod' is deprecated, use 'runpodctl pod delete'" >&2
  id="${{id:-$RUNPOD_POD_ID}}"
  if [ "$id" != "$POD_ID" ]; then
    echo "Error: pod \"$id\" not found (this is local pod $POD_ID)" >&2; exit 1
  fi
  pid=$(cat "$PID_FILE" 2>/dev/null)
  if [ -z "$pid" ]; then echo "Error: pod $POD_ID has no daemon" >&2; exit 1; fi
  printf '{{"by": "%s", "layer": "runpodctl %s"}}\n' "${{PREFECT_RUNPOD_ENDED_BY:-pod}}" "$verb" > "$ENDING"
  echo "pod \"$POD_ID\" $verb requested"
  kill -TERM "$pid" || exit 1
  sleep 60
  exit 0
fi
# Anything else (send, receive, ...) goes to a real runpodctl further down PATH.
IFS=:
for dir in $PATH; do
  if [ "$dir" != "$BIN_DIR" ] && [ -x "$dir/runpodctl" ]; then exec "$dir/runpodctl" "$@"; fi
done
echo "Error: runpodctl $1 is not available on local pod $POD_ID; supported: pod delete <id>, remove pod <id>, stop pod <id>" >&2
exit 1
"""
