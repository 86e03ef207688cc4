#!/usr/bin/env bash
# Gathers everything setup.sh installs on the workers into one folder (a
# wheelhouse) in Cloud Storage, for workers that reach no internet: internal
# IPs without Cloud NAT reach Cloud Storage (Private Google Access), not PyPI
# or the Python builds' downloads.
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "$0")/lib.sh"

usage() {
  cat <<HELP
Usage: launch/wheelhouse.sh --to=gs://BUCKET/PATH [flags]

Run on a machine with internet (Cloud Shell will do; python3 with pip, and
curl). It gathers into one folder, then copies to --to (gcloud storage rsync):
  - uv's wheel for Linux (setup.sh takes the uv binary out of it),
  - a standalone CPython build for x86_64 Linux, the one uv would download
    (python-build-standalone), and python-downloads.json, which points uv at it
    (uv's --python-downloads-json-url),
  - the wheels of bertjax's requirements (with --extras) for that Python on
    the TPU images' x86_64 Linux (glibc 2.35), resolved by uv pip compile and
    downloaded by pip, and setuptools and wheel to build bertjax itself.
Then "launch/setup.sh --wheelhouse=gs://BUCKET/PATH" installs from it alone.
Build it again when setup.py's requirements change.

  --to gs://...|DIR       where the wheelhouse goes (a local folder is replaced whole)
  --python VERSION        the workers' Python (default 3.11)
  --python-archive FILE   a CPython build of your own (python-build-standalone's install_only
                          layout: python/bin/python3.X, python/lib/...) instead of uv's
  --extras LIST           bertjax's extras to include (default tpu; "" for none)
  --source DIR            the checkout whose setup.py is read (default: this repository)
  --dry-run                                         print the commands, run nothing
  --help                                            this text
HELP
}

VALUE_FLAGS+=(--to --python --python-archive --extras --source)
normalize_flags "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
TO="" PYTHON=3.11 ARCHIVE="" EXTRAS=tpu SOURCE="$(cd "$(dirname "$0")/.." && pwd)"
for arg in "$@"; do
  case "$arg" in
    --help) usage; exit 0 ;;
    --to=*) TO="${arg#*=}" ;;
    --python=*) PYTHON="${arg#*=}" ;;
    --python-archive=*) ARCHIVE="${arg#*=}" ;;
    --extras=*) EXTRAS="${arg#*=}" ;;
    --source=*) SOURCE="${arg#*=}" ;;
    --dry-run) DRY_RUN=1 ;;
    *) die "unknown flag $arg (see --help)" ;;
  esac
done
require "$TO" "--to"
[[ "$PYTHON" =~ ^3\.[0-9]+$ ]] || die "--python takes a version such as 3.11, got $PYTHON"
[[ -z "$ARCHIVE" || -f "$ARCHIVE" ]] || die "--python-archive: no file $ARCHIVE"
[[ -f "$SOURCE/setup.py" ]] || die "--source: no setup.py in $SOURCE"
[[ "$EXTRAS" =~ ^[a-z0-9,]*$ ]] || die "--extras takes names such as tpu or tpu,tf, got $EXTRAS"
[[ -z "$ARCHIVE" ]] || ARCHIVE="$(cd "$(dirname "$ARCHIVE")" && pwd)/$(basename "$ARCHIVE")"

# Built in a temporary folder, then put in place whole: an interrupted build
# leaves the destination as it was (a local one), or without its "complete"
# marker, which setup.sh requires (a bucket, where the marker goes last).
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
OUT="$WORK/wheelhouse"
run mkdir -p "$OUT/python"

# uv, where this script runs (to resolve and to find the Python build), and the
# same version's wheel for the workers.
UV="$(command -v uv || true)"
if [[ -z "$UV" ]]; then
  run python3 -m venv "$WORK/tools"
  run "$WORK/tools/bin/pip" install -q uv
  UV="$WORK/tools/bin/uv"
fi
UV_VERSION=VERSION
(( DRY_RUN )) || UV_VERSION="$("$UV" --version | cut -d' ' -f2)"
# pip matches the workers' platform by these tags (manylinux 2.35 and older).
PLATFORMS=()
for minor in $(seq 35 -1 17); do PLATFORMS+=(--platform="manylinux_2_${minor}_x86_64"); done
PLATFORMS+=(--platform=manylinux2014_x86_64 --platform=linux_x86_64)
run python3 -m pip download -q --no-deps --dest="$OUT" "${PLATFORMS[@]}" "uv==$UV_VERSION"

# The Python build: uv's own choice (or --python-archive), and the entry that
# makes uv take it from the wheelhouse (@WHEELHOUSE@: where setup.sh puts it).
if (( DRY_RUN )); then
  echo "# the Python build into $OUT/python, and $OUT/python-downloads.json"
else
  python3 - "$UV" "$PYTHON" "$OUT" "$ARCHIVE" <<'PY'
import hashlib, json, os, re, shutil, subprocess, sys, tarfile, urllib.parse, urllib.request

uv, version, out, archive = sys.argv[1:]
if archive:
  name, build = os.path.basename(archive), "local"
  header = f"python/include/python{version}/patchlevel.h"
  try:
    with tarfile.open(archive) as tar:
      text = tar.extractfile(header).read()
  except (KeyError, tarfile.TarError) as e:
    sys.exit(f"wheelhouse.sh: {archive} is not a CPython {version} build in the install_only "
             f"layout (no {header}: {e})")
  patch = re.search(rb'PY_VERSION\s+"\d+\.\d+\.(\d+)', text).group(1).decode()
  shutil.copyfile(archive, os.path.join(out, "python", name))
else:
  found = json.loads(subprocess.check_output(
      [uv, "python", "list", "--only-downloads", "--show-urls", "--output-format=json",
       f"cpython-{version}-linux-x86_64-gnu"]))
  found = [d for d in found if d["variant"] == "default" and d["url"]]
  if not found:
    sys.exit(f"wheelhouse.sh: uv knows no CPython {version} build for x86_64 Linux")
  url = found[0]["url"]
  name = urllib.parse.unquote(url.rsplit("/", 1)[1])
  build = re.search(r"\+(\d+)-", name).group(1)
  patch = str(found[0]["version_parts"]["patch"])
  print(f"wheelhouse.sh: downloading {url}", file=sys.stderr)
  with urllib.request.urlopen(url) as response, open(os.path.join(out, "python", name),
                                                     "wb") as f:
    shutil.copyfileobj(response, f)
digest = hashlib.sha256()
with open(os.path.join(out, "python", name), "rb") as f:
  for block in iter(lambda: f.read(1 << 20), b""):
    digest.update(block)
sha256 = digest.hexdigest()
major, minor = version.split(".")
key = f"cpython-{version}.{patch}-linux-x86_64-gnu"
entry = {"name": "cpython", "arch": {"family": "x86_64", "variant": None}, "os": "linux",
         "libc": "gnu", "major": int(major), "minor": int(minor), "patch": int(patch),
         "prerelease": "", "url": f"file://@WHEELHOUSE@/python/{name}", "sha256": sha256,
         "variant": None, "build": build}
with open(os.path.join(out, "python-downloads.json"), "w") as f:
  json.dump({key: entry}, f, indent=2)
with open(os.path.join(out, "python-version"), "w") as f:
  f.write(version + "\n")
print(f"wheelhouse.sh: CPython {version}.{patch} ({name})", file=sys.stderr)
PY
fi

# The requirements, for the workers' Python and platform.
EXTRA_FLAGS=()
for extra in ${EXTRAS//,/ }; do EXTRA_FLAGS+=(--extra="$extra"); done
run "$UV" pip compile -q "$SOURCE/setup.py" ${EXTRA_FLAGS[@]+"${EXTRA_FLAGS[@]}"} \
  --python-version="$PYTHON" --python-platform=x86_64-manylinux_2_35 \
  --output-file="$OUT/requirements.txt"
run python3 -m pip download -q --no-deps --dest="$OUT" "${PLATFORMS[@]}" \
  --python-version="$PYTHON" --implementation=cp --requirement="$OUT/requirements.txt" \
  setuptools wheel

PACKAGES=0
(( DRY_RUN )) || PACKAGES="$(find "$OUT" -maxdepth 1 \( -name '*.whl' -o -name '*.tar.gz' \) \
  | wc -l)"
if [[ "$TO" == gs://* ]]; then
  run gcloud storage rsync --recursive --delete-unmatched-destination-objects "$OUT" "$TO"
  run touch "$WORK/complete"
  run gcloud storage cp "$WORK/complete" "${TO%/}/complete"
else
  run touch "$OUT/complete"
  run mkdir -p "$(dirname "$TO")"
  run rm -rf "$TO.partial"
  run cp -r "$OUT" "$TO.partial"
  run rm -rf "$TO"
  run mv "$TO.partial" "$TO"
fi
(( DRY_RUN )) || echo "wheelhouse.sh: $TO holds uv $UV_VERSION, CPython $PYTHON and" \
  "$PACKAGES packages; launch/setup.sh --wheelhouse=$TO installs from it" >&2
