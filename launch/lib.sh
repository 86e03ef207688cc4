# shellcheck shell=bash disable=SC2034  # the variables are read by the scripts that source this
# Shared by the launch scripts (sourced, not run): settings from flags or
# BERTJAX_* environment variables, and `run`, which prints the command instead
# of running it under --dry-run.

PROJECT="${BERTJAX_PROJECT:-}"
ZONE="${BERTJAX_ZONE:-}"
NAME="${BERTJAX_TPU_NAME:-}"
ACCELERATOR="${BERTJAX_ACCELERATOR_TYPE:-}"
RUNTIME="${BERTJAX_RUNTIME_VERSION:-}"
DRY_RUN=0
# On each worker while stop.sh has stopped the run; run.sh removes it.
# shellcheck disable=SC2088  # the tilde is the worker's, expanded by its shell
STOP_MARKER="~/bertjax.stop"

COMMON_HELP="Settings (flag, or environment variable):
  --project=ID            BERTJAX_PROJECT           Google Cloud project
  --zone=ZONE             BERTJAX_ZONE              e.g. us-central2-b
  --name=NAME             BERTJAX_TPU_NAME          the TPU VM (or pod slice)
  --dry-run                                         print the gcloud commands, run nothing
  --help                                            this text"

# Consumes one common flag; returns 1 if "$1" is not one.
parse_common_flag() {
  case "$1" in
    --project=*) PROJECT="${1#*=}" ;;
    --zone=*) ZONE="${1#*=}" ;;
    --name=*) NAME="${1#*=}" ;;
    --accelerator-type=*) ACCELERATOR="${1#*=}" ;;
    --runtime-version=*) RUNTIME="${1#*=}" ;;
    --dry-run) DRY_RUN=1 ;;
    *) return 1 ;;
  esac
}

die() {
  echo "$(basename "$0"): $*" >&2
  exit 2
}

# require VALUE "what to set": a clear error when a setting is missing.
require() {
  [[ -n "$1" ]] || die "missing $2"
}

require_common() {
  require "$PROJECT" "--project (or BERTJAX_PROJECT)"
  require "$ZONE" "--zone (or BERTJAX_ZONE)"
  require "$NAME" "--name (or BERTJAX_TPU_NAME)"
}

# Runs a command, or prints it (shell-quoted, one line) under --dry-run.
run() {
  if (( DRY_RUN )); then
    printf '%q ' "$@" | sed 's/ $//'
    echo
  else
    "$@"
  fi
}

# The gcloud TPU command group with this TPU's zone and project.
tpu() {
  local group="$1" verb="$2"
  shift 2
  run gcloud compute tpus "$group" "$verb" "$@" --zone="$ZONE" --project="$PROJECT"
}
