#!/usr/bin/env bash
# Follows or fetches the logs that a run keeps on every worker.
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "$0")/lib.sh"

usage() {
  cat <<HELP
Usage: launch/logs.sh (--follow | --fetch DIR) [flags]

Every worker keeps a run's output in ~/bertjax-logs/RUN_ID.log and, once the
run has ended, its exit status in RUN_ID.status (run.sh starts the run so).

  --follow                print every worker's log, each line prefixed with the worker's host
                          name, until the run ends; exit with the run's status (the first
                          worker's that is not 0)
  --lines N               with --follow, start N lines before the end (default: the start)
  --fetch DIR             copy every worker's log to DIR/WORKER.log (0.log, 1.log, ...)
  --run-id ID             the run (default: the one run.sh started last)
$COMMON_HELP
HELP
}

VALUE_FLAGS+=(--fetch --lines --run-id)
normalize_flags "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
FOLLOW=0 FETCH="" LINES="" RUN_ID=latest
for arg in "$@"; do
  case "$arg" in
    --help) usage; exit 0 ;;
    --follow) FOLLOW=1 ;;
    --fetch=*) FETCH="${arg#*=}" ;;
    --lines=*) LINES="${arg#*=}" ;;
    --run-id=*) RUN_ID="${arg#*=}" ;;
    *) parse_common_flag "$arg" || die "unknown flag $arg (see --help)" ;;
  esac
done
require_common
(( FOLLOW )) || [[ -n "$FETCH" ]] || die "give --follow or --fetch DIR"
(( ! FOLLOW )) || [[ -z "$FETCH" ]] || die "give one of --follow and --fetch"
[[ "$RUN_ID" =~ ^[A-Za-z0-9._-]+$ ]] || die "--run-id takes letters, digits, '.', '_' and '-'"
if [[ -n "$LINES" ]]; then
  require_number "$LINES" --lines
else
  LINES=+1
fi

if (( FOLLOW )); then
  tpu tpu-vm ssh "$NAME" --worker=all --command="$WORKER follow $RUN_ID $LINES"
else
  # gcloud writes each worker's output to a file of its own there (a
  # tpu-vm scp --worker=all would copy every worker's log to the same name).
  run mkdir -p "$FETCH"
  tpu tpu-vm ssh "$NAME" --worker=all --command="$WORKER log $RUN_ID" --output-directory="$FETCH"
fi
