#!/usr/bin/env bash
# Submits a bertjax run to a GKE cluster of Cloud TPU slices as an XPK workload
# (a JobSet that GKE restarts on its own after a preemption).
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "$0")/lib.sh"

usage() {
  cat <<HELP
Usage: launch/xpk.sh --cluster=CLUSTER --tpu-type=TYPE --image=IMAGE --config=FILE[:ARG] \\
    --workdir=gs://BUCKET/RUN [flags] [-- MAIN_FLAGS...]

Runs python3 -m bertjax.main in the image (launch/Dockerfile) on every host of
--num-slices slices of TYPE, through \`xpk workload create\` (pip install xpk, in a
virtual environment of its own: its pins are strict). The workload restarts
after a failure that a rerun can mend (a preemption's SIGTERM, after which the
run has saved a checkpoint and exits 143; a killed host), up to --max-restarts
times, and every restart resumes from the workdir's checkpoints; an error to
mend (exit 2) or a bug (exit 1) ends it. docs/tpu.md has the whole route.

  --cluster CLUSTER       BERTJAX_XPK_CLUSTER       the GKE cluster (xpk cluster create)
  --tpu-type TYPE         BERTJAX_ACCELERATOR_TYPE  v4-32, v5litepod-16, v5p-64, v6e-16, ...
  --num-slices N          slices joined over the data-center network (default 1); the mesh's
                          data axis spans them (bertjax.tools.compile --num_slices=N compiles
                          the same)
  --image IMAGE           BERTJAX_IMAGE             the container (launch/Dockerfile), e.g.
                                                    us-docker.pkg.dev/PROJECT/REPO/bertjax:TAG
  --config FILE[:ARG]     the config, e.g. configs/base_pretrain.py (in the image's /app)
  --workdir gs://...      where checkpoints, metrics and the resolved config go
  --workload NAME         the workload's name (default: bertjax- and the UTC time)
  --max-restarts N        restarts of the whole workload after a failure (default 10)
  --grace-seconds N       how long a preempted host may take to save its checkpoint after
                          SIGTERM (default 300)
  --spot | --reservation R | --on-demand
                          the capacity (default: the cluster's)
  --manifest FILE         also write the JobSet xpk applies to FILE
  --project ID            BERTJAX_PROJECT           Google Cloud project
  --zone ZONE             BERTJAX_ZONE              the cluster's zone
  --dry-run                                         xpk's own dry run: what it would build and
                                                    apply, nothing submitted
  --help                                            this text
  -- MAIN_FLAGS...        passed on to bertjax.main, e.g. --config.train.batch_size=512
HELP
}

VALUE_FLAGS+=(--cluster --tpu-type --num-slices --image --config --workdir --workload
              --max-restarts --grace-seconds --reservation --manifest)
normalize_flags "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
CLUSTER="${BERTJAX_XPK_CLUSTER:-}" IMAGE="${BERTJAX_IMAGE:-}" SLICES=1 CONFIG="" WORKDIR=""
WORKLOAD="" MAX_RESTARTS=10 GRACE=300 CAPACITY=() MANIFEST="" EXTRA=()
while (( $# )); do
  case "$1" in
    --help) usage; exit 0 ;;
    --cluster=*) CLUSTER="${1#*=}" ;;
    --tpu-type=*) ACCELERATOR="${1#*=}" ;;
    --num-slices=*) SLICES="${1#*=}" ;;
    --image=*) IMAGE="${1#*=}" ;;
    --config=*) CONFIG="${1#*=}" ;;
    --workdir=*) WORKDIR="${1#*=}" ;;
    --workload=*) WORKLOAD="${1#*=}" ;;
    --max-restarts=*) MAX_RESTARTS="${1#*=}" ;;
    --grace-seconds=*) GRACE="${1#*=}" ;;
    --spot | --on-demand) CAPACITY+=("$1") ;;
    --reservation=*) CAPACITY+=("$1") ;;
    --manifest=*) MANIFEST="${1#*=}" ;;
    --) shift; EXTRA=("$@"); break ;;
    *) parse_common_flag "$1" || die "unknown flag $1 (see --help)" ;;
  esac
  shift
done
require "$PROJECT" "--project (or BERTJAX_PROJECT)"
require "$ZONE" "--zone (or BERTJAX_ZONE)"
require "$CLUSTER" "--cluster (or BERTJAX_XPK_CLUSTER)"
require "$ACCELERATOR" "--tpu-type (or BERTJAX_ACCELERATOR_TYPE)"
require "$IMAGE" "--image (or BERTJAX_IMAGE)"
require "$CONFIG" "--config"
require "$WORKDIR" "--workdir"
[[ "$WORKDIR" == gs://* ]] || die "--workdir must be a gs:// path that every host can reach"
require_number "$SLICES" --num-slices
(( SLICES >= 1 )) || die "--num-slices must be 1 or more"
require_number "$MAX_RESTARTS" --max-restarts
require_number "$GRACE" --grace-seconds
(( ${#CAPACITY[@]} <= 1 )) || die "choose one of --spot, --reservation and --on-demand"
WORKLOAD="${WORKLOAD:-bertjax-$(date -u +%Y%m%d-%H%M%S)}"
# A Kubernetes name: lower-case letters, digits and '-', starting with a letter.
[[ "$WORKLOAD" =~ ^[a-z][a-z0-9-]{0,39}$ ]] || die "--workload takes lower-case letters," \
  "digits and '-' (at most 40, a letter first), got $WORKLOAD"

COMMAND="python3 -m bertjax.main$(printf ' %q' "--config=$CONFIG" "--workdir=$WORKDIR" \
  ${EXTRA[@]+"${EXTRA[@]}"})"
XPK=(workload create --cluster="$CLUSTER" --workload="$WORKLOAD" --tpu-type="$ACCELERATOR"
     --num-slices="$SLICES" --docker-image="$IMAGE" --command="$COMMAND"
     --max-restarts="$MAX_RESTARTS" --termination-grace-period-seconds="$GRACE"
     --project="$PROJECT" --zone="$ZONE" ${CAPACITY[@]+"${CAPACITY[@]}"})
[[ -z "$MANIFEST" ]] || XPK+=(--output-manifest-file="$MANIFEST")
if (( DRY_RUN )); then
  XPK+=(--dry-run)
  printf '%q ' "${BERTJAX_XPK:-xpk}" "${XPK[@]}" | sed 's/ $//'
  echo
fi
command -v "${BERTJAX_XPK:-xpk}" > /dev/null || die "no xpk here: pip install xpk (in a" \
  "virtual environment of its own), or set BERTJAX_XPK to its path"
"${BERTJAX_XPK:-xpk}" "${XPK[@]}"
(( DRY_RUN )) || echo "xpk.sh: workload $WORKLOAD submitted to $CLUSTER: xpk workload list" \
  "--cluster=$CLUSTER shows it; its hosts' logs are in Cloud Logging (the link above), its" \
  "metrics in $WORKDIR/metrics.jsonl"
