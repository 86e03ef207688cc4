#!/usr/bin/env bash
# Follows or fetches the logs that a run keeps on every worker.
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "$0")/lib.sh"

usage() {
  cat <<HELP
Usage: launch/logs.sh (--follow | --fetch DIR) [flags]
       launch/logs.sh --workdir gs://BUCKET/RUN (--ended | --fetch DIR) [--run-id ID]

Every worker keeps a run's output in ~/bertjax-logs/RUN_ID.log and, once the
run has ended, its exit status in RUN_ID.status (run.sh starts the run so).
Each worker also copies its log into the run's workdir as it is written, with
how the run ended (WORKDIR/logs/RUN_ID/HOST.log, HOST.json): --workdir reads
them there, when the slice is gone (preempted, recreated or deleted).

  --follow                print every worker's log, each line prefixed with the worker's host
                          name, until the run ends; exit with the run's status (the first
                          worker's that is not 0)
  --lines N               with --follow, start N lines before the end (default: the start)
  --fetch DIR             copy every worker's log to DIR/WORKER.log (0.log, 1.log, ...)
  --run-id ID             the run (default: the one run.sh started last; with --workdir, the
                          last one there)
  --workdir gs://...      read the logs from the run's workdir instead of the workers
  --ended                 with --workdir: how the run ended on every worker (exit status,
                          last step, why)
$COMMON_HELP
HELP
}

VALUE_FLAGS+=(--fetch --lines --run-id --workdir)
normalize_flags "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
FOLLOW=0 FETCH="" LINES="" RUN_ID=latest WORKDIR="" ENDED=0
for arg in "$@"; do
  case "$arg" in
    --help) usage; exit 0 ;;
    --follow) FOLLOW=1 ;;
    --fetch=*) FETCH="${arg#*=}" ;;
    --lines=*) LINES="${arg#*=}" ;;
    --run-id=*) RUN_ID="${arg#*=}" ;;
    --workdir=*) WORKDIR="${arg#*=}" ;;
    --ended) ENDED=1 ;;
    *) parse_common_flag "$arg" || die "unknown flag $arg (see --help)" ;;
  esac
done
[[ "$RUN_ID" =~ ^[A-Za-z0-9._-]+$ ]] || die "--run-id takes letters, digits, '.', '_' and '-'"

if [[ -n "$WORKDIR" ]]; then
  # From the workdir: no TPU needed.
  [[ "$WORKDIR" == gs://* ]] || die "--workdir must be a gs:// path"
  (( ! FOLLOW )) || die "--follow reads the workers; with --workdir give --ended or --fetch DIR"
  (( ENDED )) || [[ -n "$FETCH" ]] || die "with --workdir give --ended or --fetch DIR"
  LOGS_URL="${WORKDIR%/}/logs"
  if [[ "$RUN_ID" == latest ]]; then
    if (( DRY_RUN )); then
      run gcloud storage ls "$LOGS_URL/"
    else
      RUN_ID="$(gcloud storage ls "$LOGS_URL/" | sed -n 's|.*/logs/\([^/]*\)/$|\1|p' \
        | sort | tail -n 1)"
      [[ -n "$RUN_ID" ]] || fail "no run's logs in $LOGS_URL"
    fi
  fi
  if (( ENDED )); then
    run gcloud storage cat "$LOGS_URL/$RUN_ID/*.json"
  else
    run mkdir -p "$FETCH"
    run gcloud storage cp "$LOGS_URL/$RUN_ID/*" "$FETCH/"
  fi
  exit 0
fi
(( ! ENDED )) || die "--ended reads a workdir: give --workdir"
require_common
(( FOLLOW )) || [[ -n "$FETCH" ]] || die "give --follow or --fetch DIR"
(( ! FOLLOW )) || [[ -z "$FETCH" ]] || die "give one of --follow and --fetch"
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
