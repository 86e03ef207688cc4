#!/usr/bin/env bash
# The cloud identity of bertjax's GKE workloads (launch/xpk.sh): a Google
# service account that the pods act as, what it may touch, and the image
# repository.
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "$0")/lib.sh"

usage() {
  cat <<HELP
Usage: launch/gke_setup.sh --project=ID --zone=ZONE --cluster=CLUSTER --bucket=gs://BUCKET [flags]

Gives bertjax's XPK workloads an identity, once per project and cluster:
  1. enables the APIs (Artifact Registry, GKE, IAM and its credentials, Storage, TPU);
  2. creates the Docker repository REPO in Artifact Registry, unless it exists;
  3. creates the Google service account SA, unless it exists (or names one: an e-mail);
  4. grants SA roles/storage.objectAdmin on the bucket (checkpoints, metrics, logs) and
     roles/artifactregistry.reader on REPO, and the same reader role to the nodes' service
     account, which pulls the image (xpk's node pools run as the Compute Engine default
     service account, PROJECT_NUMBER-compute@developer.gserviceaccount.com);
  5. lets the pods' Kubernetes service account act as SA through Workload Identity
     (roles/iam.workloadIdentityUser for PROJECT.svc.id.goog[NAMESPACE/KSA], and the KSA's
     iam.gke.io/gcp-service-account annotation); xpk's pods run as the namespace's
     "default" KSA (their serviceAccountName is empty unless xpk mounts storage, when it is
     xpk-sa). The cluster needs Workload Identity: xpk cluster create
     --enable-workload-identity;
  6. lets you (the active gcloud account, or --impersonator) act as SA, for
     launch/xpk.sh --check (roles/iam.serviceAccountTokenCreator);
  7. lets docker push to the repository: gcloud auth configure-docker REGION-docker.pkg.dev.

  --bucket gs://BUCKET    the bucket of the runs' workdirs (a path in it is fine)
  --cluster CLUSTER       BERTJAX_XPK_CLUSTER       the GKE cluster (xpk cluster create)
  --cluster-location L    the cluster's location (default: the region of --zone, where xpk
                          cluster create makes it)
  --region REGION         the repository's location (default: the region of --zone)
  --repository REPO       the Docker repository (default bertjax): images are
                          REGION-docker.pkg.dev/PROJECT/REPO/NAME:TAG
  --service-account SA    BERTJAX_SERVICE_ACCOUNT   a name to create (default bertjax-workload), or
                                                    the e-mail of an account that exists
  --ksa NAMESPACE/NAME    the pods' Kubernetes service account (default default/default;
                          default/xpk-sa for workloads that mount xpk storage)
  --node-service-account EMAIL
                          the nodes' service account (default: the Compute Engine default one)
  --project-number N      the project's number (default: read from gcloud; with --dry-run the
                          commands show PROJECT_NUMBER without it)
  --impersonator MEMBER   who may act as SA for xpk.sh --check, e.g. user:you@example.com
                          (default: the active gcloud account; none: nobody)
  --project ID            BERTJAX_PROJECT           Google Cloud project
  --zone ZONE             BERTJAX_ZONE              the cluster's zone, e.g. us-west4-a
  --dry-run                                         print the commands, run nothing
  --help                                            this text
HELP
}

VALUE_FLAGS+=(--bucket --cluster --cluster-location --region --repository --service-account --ksa
              --node-service-account --project-number --impersonator)
normalize_flags "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
BUCKET="" CLUSTER_LOCATION="" REGION="" REPOSITORY=bertjax
SERVICE_ACCOUNT="${BERTJAX_SERVICE_ACCOUNT:-bertjax-workload}" KSA=default/default
NODE_SERVICE_ACCOUNT="" PROJECT_NUMBER="" IMPERSONATOR=""
while (( $# )); do
  case "$1" in
    --help) usage; exit 0 ;;
    --bucket=*) BUCKET="${1#*=}" ;;
    --cluster=*) CLUSTER="${1#*=}" ;;
    --cluster-location=*) CLUSTER_LOCATION="${1#*=}" ;;
    --region=*) REGION="${1#*=}" ;;
    --repository=*) REPOSITORY="${1#*=}" ;;
    --service-account=*) SERVICE_ACCOUNT="${1#*=}" ;;
    --ksa=*) KSA="${1#*=}" ;;
    --node-service-account=*) NODE_SERVICE_ACCOUNT="${1#*=}" ;;
    --project-number=*) PROJECT_NUMBER="${1#*=}" ;;
    --impersonator=*) IMPERSONATOR="${1#*=}" ;;
    *) parse_common_flag "$1" || die "unknown flag $1 (see --help)" ;;
  esac
  shift
done
require_cluster
require "$BUCKET" "--bucket"
[[ "$BUCKET" == gs://?* ]] || die "--bucket takes gs://BUCKET, got $BUCKET"
BUCKET="gs://$(cut -d/ -f3 <<< "$BUCKET")"
[[ "$KSA" =~ ^[a-z0-9-]+/[a-z0-9.-]+$ ]] || die "--ksa takes NAMESPACE/NAME, got $KSA"
[[ -z "$PROJECT_NUMBER" ]] || require_number "$PROJECT_NUMBER" --project-number
[[ -z "$IMPERSONATOR" || "$IMPERSONATOR" == none || "$IMPERSONATOR" == *:*@* ]] \
  || die "--impersonator takes user:EMAIL, serviceAccount:EMAIL, group:EMAIL or none"
REGION="${REGION:-${ZONE%-*}}"
CLUSTER_LOCATION="${CLUSTER_LOCATION:-${ZONE%-*}}"
SCOPE=(--project="$PROJECT")

# exists COMMAND...: whether a describe finds its resource (1 on NOT_FOUND); any
# other failure ends the script, saying what failed. Under --dry-run, nothing
# is read and nothing exists.
exists() {
  local errors
  (( ! DRY_RUN )) || return 1
  errors="$(mktemp)"
  if "$@" > /dev/null 2> "$errors"; then
    rm -f "$errors"
    return 0
  elif grep -q NOT_FOUND "$errors"; then
    rm -f "$errors"
    return 1
  fi
  fail "$1 $2 $3 $4 failed: $(first_error "$errors")"
}

# value VARIABLE PLACEHOLDER COMMAND...: what a command prints, into VARIABLE;
# PLACEHOLDER under --dry-run.
value() {
  local name="$1" placeholder="$2" result
  shift 2
  if (( DRY_RUN )); then
    result="$placeholder"
  else
    result="$("$@")" || fail "$* failed"
  fi
  printf -v "$name" '%s' "$result"
}

# Runs a grant (its policy, which gcloud prints, goes), again after a while if
# it fails: a service account just created takes a moment to be known everywhere.
grant() {
  local tries=0
  if (( DRY_RUN )); then
    run "$@"
    return
  fi
  until "$@" > /dev/null; do
    tries=$((tries + 1))
    (( tries < DESCRIBE_TRIES )) || fail "$1 $2 $3 $4 failed $tries times (above)"
    echo "gke_setup.sh: trying again (an account just made takes a moment to be known)" >&2
    pause $((1 << (tries - 1)))
  done
}

run gcloud services enable artifactregistry.googleapis.com container.googleapis.com \
  iam.googleapis.com iamcredentials.googleapis.com storage.googleapis.com tpu.googleapis.com \
  "${SCOPE[@]}"

if ! exists gcloud artifacts repositories describe "$REPOSITORY" --location="$REGION" \
    "${SCOPE[@]}"; then
  run gcloud artifacts repositories create "$REPOSITORY" --repository-format=docker \
    --location="$REGION" --description="bertjax images" "${SCOPE[@]}"
fi

if [[ "$SERVICE_ACCOUNT" == *@* ]]; then
  EMAIL="$SERVICE_ACCOUNT"
  (( DRY_RUN )) || exists gcloud iam service-accounts describe "$EMAIL" "${SCOPE[@]}" \
    || fail "there is no service account $EMAIL; give a name to create one (--service-account)"
else
  EMAIL="$SERVICE_ACCOUNT@$PROJECT.iam.gserviceaccount.com"
  if ! exists gcloud iam service-accounts describe "$EMAIL" "${SCOPE[@]}"; then
    run gcloud iam service-accounts create "$SERVICE_ACCOUNT" --display-name="bertjax workloads" \
      "${SCOPE[@]}"
  fi
fi

grant gcloud storage buckets add-iam-policy-binding "$BUCKET" --member="serviceAccount:$EMAIL" \
  --role=roles/storage.objectAdmin
REPOSITORY_SCOPE=(--location="$REGION" "${SCOPE[@]}")
grant gcloud artifacts repositories add-iam-policy-binding "$REPOSITORY" \
  "${REPOSITORY_SCOPE[@]}" --member="serviceAccount:$EMAIL" --role=roles/artifactregistry.reader
if [[ -z "$NODE_SERVICE_ACCOUNT" ]]; then
  [[ -n "$PROJECT_NUMBER" ]] || value PROJECT_NUMBER PROJECT_NUMBER \
    gcloud projects describe "$PROJECT" --format='value(projectNumber)'
  [[ "$PROJECT_NUMBER" =~ ^[0-9]+$ || "$PROJECT_NUMBER" == PROJECT_NUMBER ]] \
    || fail "gcloud gave no number for project $PROJECT: give --project-number"
  NODE_SERVICE_ACCOUNT="$PROJECT_NUMBER-compute@developer.gserviceaccount.com"
fi
grant gcloud artifacts repositories add-iam-policy-binding "$REPOSITORY" \
  "${REPOSITORY_SCOPE[@]}" --member="serviceAccount:$NODE_SERVICE_ACCOUNT" \
  --role=roles/artifactregistry.reader

# Workload Identity: the pods' Kubernetes service account acts as EMAIL.
value POOL "$PROJECT.svc.id.goog" gcloud container clusters describe "$CLUSTER" \
  --location="$CLUSTER_LOCATION" "${SCOPE[@]}" --format='value(workloadIdentityConfig.workloadPool)'
[[ "$POOL" == "$PROJECT.svc.id.goog" ]] || fail "cluster $CLUSTER has no Workload Identity:" \
  "xpk cluster create --enable-workload-identity (with the cluster's other flags) turns it on"
grant gcloud iam service-accounts add-iam-policy-binding "$EMAIL" "${SCOPE[@]}" \
  --role=roles/iam.workloadIdentityUser --member="serviceAccount:$PROJECT.svc.id.goog[$KSA]"
run gcloud container clusters get-credentials "$CLUSTER" --location="$CLUSTER_LOCATION" \
  "${SCOPE[@]}"
KSA_NAMESPACE="${KSA%/*}" KSA_NAME="${KSA#*/}"
# Every namespace has its "default"; another (xpk-sa) may not exist yet.
if [[ "$KSA_NAME" != default ]]; then
  if (( DRY_RUN )) || ! kubectl get serviceaccount "$KSA_NAME" --namespace="$KSA_NAMESPACE" \
      > /dev/null 2>&1; then
    run kubectl create serviceaccount "$KSA_NAME" --namespace="$KSA_NAMESPACE"
  fi
fi
run kubectl annotate serviceaccount "$KSA_NAME" --namespace="$KSA_NAMESPACE" \
  "iam.gke.io/gcp-service-account=$EMAIL" --overwrite

# Who may act as EMAIL for xpk.sh --check.
if [[ -z "$IMPERSONATOR" ]]; then
  value IMPERSONATOR ACCOUNT gcloud config get-value account
  [[ -n "$IMPERSONATOR" ]] || fail "no active gcloud account (gcloud auth login); or give" \
    "--impersonator=MEMBER, or --impersonator=none"
  if [[ "$IMPERSONATOR" == *.gserviceaccount.com ]]; then
    IMPERSONATOR="serviceAccount:$IMPERSONATOR"
  else
    IMPERSONATOR="user:$IMPERSONATOR"
  fi
fi
[[ "$IMPERSONATOR" == none ]] || grant gcloud iam service-accounts add-iam-policy-binding \
  "$EMAIL" "${SCOPE[@]}" --role=roles/iam.serviceAccountTokenCreator --member="$IMPERSONATOR"

run gcloud auth configure-docker "$REGION-docker.pkg.dev" --quiet
(( DRY_RUN )) || echo "gke_setup.sh: the pods of $CLUSTER ($KSA) act as $EMAIL, which writes" \
  "in $BUCKET and reads $REGION-docker.pkg.dev/$PROJECT/$REPOSITORY; check a run with" \
  "launch/xpk.sh ... --check"
