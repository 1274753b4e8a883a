#!/usr/bin/env bash
# Lint the wire contracts with a pinned buf, installed from npm into .tools/
# (git-ignored) on first use. Extra arguments replace `lint`, e.g.
#   bash scripts/buf.sh breaking --against '.git#branch=main'
set -euo pipefail
cd "$(dirname "$0")/.."
BUF_VERSION=1.75.0
BUF=.tools/node_modules/.bin/buf

if [ ! -x "$BUF" ] || [ "$("$BUF" --version 2>/dev/null)" != "$BUF_VERSION" ]; then
  command -v npm >/dev/null || { echo "buf.sh: npm is required to install buf" >&2; exit 1; }
  npm install --silent --no-audit --no-fund --save-exact --prefix .tools "@bufbuild/buf@$BUF_VERSION" >&2
fi
if [ "$#" -eq 0 ]; then
  set -- lint
fi
exec "$BUF" "$@"
