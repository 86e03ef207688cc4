#!/usr/bin/env bash
# Creates a Cloud TPU VM or pod slice (directly, or as a queued resource).
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "$0")/lib.sh"

usage() {
  cat <<HELP
Usage: launch/create.sh [flags]

Creates the TPU VM or pod slice NAME (every host of a slice is a worker).

  --accelerator-type=TYPE BERTJAX_ACCELERATOR_TYPE  v4-8, v4-32, v5litepod-16, v5p-64, ...
  --runtime-version=V     BERTJAX_RUNTIME_VERSION   TPU software, e.g. tpu-ubuntu2204-base
  --queued                request it as a queued resource (waits for capacity)
  --spot                  spot capacity (cheaper; can be preempted at any time)
  --preemptible           preemptible capacity (direct creation only)
$COMMON_HELP
HELP
}

QUEUED=0
CAPACITY=()
for arg in "$@"; do
  case "$arg" in
    --help) usage; exit 0 ;;
    --queued) QUEUED=1 ;;
    --spot) CAPACITY+=(--spot) ;;
    --preemptible) CAPACITY+=(--preemptible) ;;
    *) parse_common_flag "$arg" || die "unknown flag $arg (see --help)" ;;
  esac
done
require_common
require "$ACCELERATOR" "--accelerator-type (or BERTJAX_ACCELERATOR_TYPE)"
require "$RUNTIME" "--runtime-version (or BERTJAX_RUNTIME_VERSION)"
(( ${#CAPACITY[@]} <= 1 )) || die "choose one of --spot and --preemptible"

if (( QUEUED )); then
  [[ "${CAPACITY[*]:-}" != "--preemptible" ]] || die "queued resources take --spot, not --preemptible"
  tpu queued-resources create "$NAME" --node-id="$NAME" --accelerator-type="$ACCELERATOR" \
    --runtime-version="$RUNTIME" ${CAPACITY[@]+"${CAPACITY[@]}"}
else
  tpu tpu-vm create "$NAME" --accelerator-type="$ACCELERATOR" --version="$RUNTIME" \
    ${CAPACITY[@]+"${CAPACITY[@]}"}
fi
