#!/usr/bin/env bash
# Copies this checkout to every worker and installs bertjax with the [tpu]
# extra into a virtual environment with its own Python.
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "$0")/lib.sh"

usage() {
  cat <<HELP
Usage: launch/setup.sh [flags]

Packs the committed files of the checkout (git archive HEAD) and copies them to
~/bertjax on every worker. There it installs uv (if the worker has none), lets
uv create ~/bertjax-venv with a Python it downloads (the TPU images ship
Python 3.10; jax, flax, orbax and grain need 3.11 or later), and installs
bertjax into it: uv pip install -e '~/bertjax[tpu]'. run.sh runs that Python.

The workers download uv's Python (python-build-standalone, from Astral's
mirror) and the packages from PyPI: workers created with --internal-ips need
Cloud NAT for that. Workers that reach only Cloud Storage (Private Google
Access) install with --wheelhouse from a bucket that launch/wheelhouse.sh filled.

  --source DIR            the checkout to copy (default: this repository)
  --python VERSION        the Python version for ~/bertjax-venv (default 3.11)
  --wheelhouse gs://...   install from this wheelhouse (launch/wheelhouse.sh) alone, with no
                          internet: uv, the Python build and every wheel come from it (gcloud
                          storage rsync to ~/bertjax-wheelhouse on each worker)
$COMMON_HELP
HELP
}

VALUE_FLAGS+=(--source --python --wheelhouse)
normalize_flags "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
SOURCE="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="" WHEELHOUSE=""
for arg in "$@"; do
  case "$arg" in
    --help) usage; exit 0 ;;
    --source=*) SOURCE="${arg#*=}" ;;
    --python=*) PYTHON="${arg#*=}" ;;
    --wheelhouse=*) WHEELHOUSE="${arg#*=}" ;;
    *) parse_common_flag "$arg" || die "unknown flag $arg (see --help)" ;;
  esac
done
require_common
if [[ -n "$WHEELHOUSE" ]]; then
  [[ "$WHEELHOUSE" == gs://* ]] || die "--wheelhouse takes a gs:// path (launch/wheelhouse.sh" \
    "--to=gs://... makes one)"
  [[ -z "$PYTHON" ]] || die "--python: a wheelhouse has its own Python (wheelhouse.sh --python)"
fi
PYTHON="${PYTHON:-3.11}"
[[ "$PYTHON" =~ ^3\.[0-9]+$ ]] || die "--python takes a version such as 3.11, got $PYTHON"

# On the worker: unpack; uv from pip (the image's Python 3.10 runs it fine) or,
# without pip, from uv's installer; a fresh environment with uv's own Python
# (only-managed: not whatever python3.X the image may have); bertjax into it.
INSTALL="rm -rf ~/bertjax && mkdir ~/bertjax && tar -xzf ~/bertjax.tar.gz -C ~/bertjax \
&& export PATH=\"\$HOME/.local/bin:\$PATH\" \
&& { command -v uv > /dev/null || python3 -m pip install -q --user uv \
|| curl -LsSf https://astral.sh/uv/install.sh | sh; } \
&& rm -rf ~/bertjax-venv \
&& uv venv -q --python-preference=only-managed --python=$PYTHON ~/bertjax-venv \
&& uv pip install -q --python=\$HOME/bertjax-venv/bin/python -e \"\$HOME/bertjax[tpu]\" \
&& echo \"\$(hostname): \$(~/bertjax-venv/bin/python --version) in ~/bertjax-venv\""
# With --wheelhouse: the wheelhouse to ~/bertjax-wheelhouse (from Cloud Storage,
# the one thing the workers reach), uv taken out of its wheel (no pip needed),
# the Python build from it (uv's --python-downloads-json-url, its entry pointed
# at this worker's copy) and every package from it (--no-index).
if [[ -n "$WHEELHOUSE" ]]; then
  INSTALL="rm -rf ~/bertjax && mkdir ~/bertjax && tar -xzf ~/bertjax.tar.gz -C ~/bertjax \
&& W=\$HOME/bertjax-wheelhouse && rm -rf \$W && mkdir -p \$W \
&& gcloud storage rsync --recursive ${WHEELHOUSE%/} \$W \
&& { test -e \$W/complete || { echo \"\$(hostname): $WHEELHOUSE is not a whole wheelhouse \
(no 'complete' marker): run launch/wheelhouse.sh --to=$WHEELHOUSE again\" >&2; false; }; } \
&& python3 -c 'import glob, os, sys, zipfile; w = zipfile.ZipFile(glob.glob(sys.argv[1] + \"/uv-*.whl\")[0]); m = next(n for n in w.namelist() if n.endswith(\".data/scripts/uv\")); open(sys.argv[1] + \"/uv\", \"wb\").write(w.read(m)); os.chmod(sys.argv[1] + \"/uv\", 0o755)' \$W \
&& sed \"s|@WHEELHOUSE@|\$W|g\" \$W/python-downloads.json > \$W/python-downloads.here.json \
&& rm -rf ~/bertjax-venv \
&& UV_PYTHON_DOWNLOADS_JSON_URL=file://\$W/python-downloads.here.json \$W/uv venv -q \
--python-preference=only-managed --python=\$(cat \$W/python-version) ~/bertjax-venv \
&& \$W/uv pip install -q --no-index --find-links=\$W --python=\$HOME/bertjax-venv/bin/python \
-e \"\$HOME/bertjax[tpu]\" \
&& echo \"\$(hostname): \$(~/bertjax-venv/bin/python --version) in ~/bertjax-venv, from \
$WHEELHOUSE\""
fi

# Setting up replaces ~/bertjax and ~/bertjax-venv: never under a run that
# still goes (its Python and code would change under it). Asked with the
# workers' own worker.sh, which says "HOST: running" for a live run (and
# fails, as on a fresh worker, when there is none).
LIVE="if bash ~/bertjax/launch/worker.sh state latest 2> /dev/null | grep -q ': running\$'; then \
echo \"\$(hostname): run \$(cat ~/bertjax-logs/latest) is still going\"; fi"
if (( DRY_RUN )); then
  tpu tpu-vm ssh "$NAME" --worker=all --command="$LIVE"
else
  live="$(tpu tpu-vm ssh "$NAME" --worker=all --command="$LIVE")" \
    || fail "could not ask the workers of $NAME whether a run is going"
  [[ -z "$live" ]] || die "$(head -n 1 <<< "$live"): setup would replace its code and Python;" \
    "stop it first (launch/stop.sh) or wait for it to end (launch/logs.sh --follow)"
fi

ARCHIVE="${TMPDIR:-/tmp}/bertjax-$NAME.tar.gz"
run git -C "$SOURCE" archive --format=tar.gz --output="$ARCHIVE" HEAD
tpu tpu-vm scp "$ARCHIVE" "$NAME:bertjax.tar.gz" --worker=all
if ! tpu tpu-vm ssh "$NAME" --worker=all --command="$INSTALL"; then
  if [[ -n "$WHEELHOUSE" ]]; then
    fail "installing on the workers of $NAME from $WHEELHOUSE failed (see above): the workers" \
      "need to read it (Private Google Access on their subnet, and their service account" \
      "allowed to read the bucket), and it must be whole (launch/wheelhouse.sh fills it)"
  fi
  fail "installing on the workers of $NAME failed (see above). They download uv, a Python" \
    "build and PyPI's packages: workers with internal IPs need Cloud NAT, or install from" \
    "a wheelhouse in Cloud Storage (launch/wheelhouse.sh, then setup.sh --wheelhouse)"
fi
