#!/usr/bin/env bash
# Deletes the TPU VM or pod slice (and its queued resource).
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "$0")/lib.sh"

usage() {
  cat <<HELP
Usage: launch/delete.sh [flags]

  --queued                it was created as a queued resource: delete that (--force)
  --if-exists             no error if there is nothing to delete
$COMMON_HELP
HELP
}

normalize_flags "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
QUEUED=0 IF_EXISTS=0
for arg in "$@"; do
  case "$arg" in
    --help) usage; exit 0 ;;
    --queued) QUEUED=1 ;;
    --if-exists) IF_EXISTS=1 ;;
    *) parse_common_flag "$arg" || die "unknown flag $arg (see --help)" ;;
  esac
done
require_common

status=0
if (( QUEUED )); then
  tpu queued-resources delete "$NAME" --force --quiet || status=$?
else
  tpu tpu-vm delete "$NAME" --quiet || status=$?
fi
(( status == 0 || IF_EXISTS )) || exit "$status"
