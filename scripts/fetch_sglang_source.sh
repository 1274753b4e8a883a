#!/usr/bin/env bash
# Fetch SGLang's pinned source for the CPU tests of echo-sglang (echo_sglang). Never installs it.
#
#   bash scripts/fetch_sglang_source.sh [DEST]     (default DEST: .cache/sglang-src)
#
# Downloads the sglang 0.5.23 wheel (~39 MB) and the few pure-Python / small binary packages its
# speculative-decoding and kernel modules import at module level (~8 MB), with
# `pip download --no-deps`, and unpacks them into DEST/site: a directory the tests put on
# sys.path (sglang's own __init__ is bypassed: it imports the whole server). SGLang's CUDA
# requirements (torch 2.14, flashinfer, sgl-kernel) are never fetched. The multimodal and Rust
# extension subtrees, which no test reads, are skipped (~64 MB).
#
# Idempotent (DEST/site/.complete), safe to run concurrently (flock), offline-tolerant: exits
# non-zero without leaving a partial tree when the registry cannot be reached. .cache/ is kept
# out of git by a .gitignore of its own.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$ROOT/.cache/sglang-src}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"

SGLANG="sglang==0.5.23"
# Module-level imports of sglang.srt.utils / server_args / spec_info, pinned to what was tested.
DEPS=(msgspec==0.23.0 orjson==3.13.0 psutil==7.2.2 pybase64==1.5.1 pyzmq==27.3.0
  pillow==13.0.0 starlette==1.10.0)

if [ -f "$DEST/site/.complete" ]; then
  echo "sglang source present: $DEST/site"
  exit 0
fi

mkdir -p "$DEST"
case "$DEST" in
  "$ROOT/.cache/"*) [ -f "$ROOT/.cache/.gitignore" ] || echo '*' > "$ROOT/.cache/.gitignore" ;;
esac

exec 9> "$DEST/.lock"
flock 9
if [ -f "$DEST/site/.complete" ]; then
  echo "sglang source present: $DEST/site"
  exit 0
fi

TMP="$(mktemp -d "$DEST/tmp.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

constraints=()
for c in /etc/xdg/pip/constraints.txt "$ROOT/.venv/constraints.txt"; do
  [ -f "$c" ] && constraints+=("$c")
done
PIP_CONSTRAINT="${constraints[*]:-}" "$PYTHON" -m pip download --no-deps --only-binary=:all: \
  --retries 1 --timeout 20 --quiet --disable-pip-version-check \
  -d "$TMP/wheels" "$SGLANG" "${DEPS[@]}"

"$PYTHON" - "$TMP/wheels" "$TMP/site" <<'EOF'
import pathlib
import sys
import zipfile

SKIP = ("sglang/multimodal_gen/", "sglang/srt/rust_extensions/")
wheels, site = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
for wheel in sorted(wheels.glob("*.whl")):
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site, [n for n in zf.namelist() if not n.startswith(SKIP)])
EOF

touch "$TMP/site/.complete"
rm -rf "$DEST/site"
mv "$TMP/site" "$DEST/site"
echo "sglang source ready: $DEST/site"
