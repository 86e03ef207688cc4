#!/usr/bin/env bash
# Stops the bertjax run on every worker: it saves a checkpoint and exits.
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "$0")/lib.sh"

usage() {
  cat <<HELP
Usage: launch/stop.sh [flags]

Sends SIGTERM to python -m bertjax.main on every worker, as a preemption
notice does: a pre-training run saves a checkpoint at a step all hosts agree
on and exits (code 143, recorded beside its log: see logs.sh), so run.sh
resumes it later. Waits until the processes have gone. Leaves a marker
(~/bertjax.stop) so that a run.sh --restarts watching the run does not start
it again. The TPU stays up (delete.sh removes it).

  --timeout SECONDS       how long to wait for the processes to exit (default 600)
  --kill                  SIGKILL instead: no checkpoint, the run resumes from the last one
$COMMON_HELP
HELP
}

VALUE_FLAGS+=(--timeout)
normalize_flags "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
TIMEOUT=600 SIGNAL=TERM
for arg in "$@"; do
  case "$arg" in
    --help) usage; exit 0 ;;
    --timeout=*) TIMEOUT="${arg#*=}" ;;
    --kill) SIGNAL=KILL ;;
    *) parse_common_flag "$arg" || die "unknown flag $arg (see --help)" ;;
  esac
done
require_common
require_number "$TIMEOUT" --timeout

# The run's Python (~/bertjax-venv/bin/python, or a python3 started by hand);
# not worker.sh's shell around it, which records the exit status. The
# brackets keep the pattern from matching the remote shell running it.
PATTERN="python[0-9.]* -m [b]ertjax[.]main"
tpu tpu-vm ssh "$NAME" --worker=all --command="touch $STOP_MARKER; \
if ! pkill -$SIGNAL -f '$PATTERN'; then echo \"\$(hostname): no bertjax run\"; exit 0; fi; \
for _ in \$(seq $TIMEOUT); do \
if ! pgrep -f '$PATTERN' > /dev/null; then echo \"\$(hostname): stopped\"; exit 0; fi; \
sleep 1; done; echo \"\$(hostname): still running after ${TIMEOUT}s\" >&2; exit 1"
