#!/usr/bin/env bash
# Lint the wire contracts with a pinned buf, installed from npm into .tools/
# (git-ignored) on first use, then check for breaking changes against the
# protos committed on main (v1 only grows: no renumbering, no reuse). Extra
# arguments replace both, e.g.
#   bash scripts/buf.sh breaking proto --against '.git#branch=main,subdir=proto'
set -euo pipefail
cd "$(dirname "$0")/.."
BUF_VERSION=1.75.0
BUF=.tools/node_modules/.bin/buf

if [ ! -x "$BUF" ] || [ "$("$BUF" --version 2>/dev/null)" != "$BUF_VERSION" ]; then
  command -v npm >/dev/null || { echo "buf.sh: npm is required to install buf" >&2; exit 1; }
  npm install --silent --no-audit --no-fund --save-exact --prefix .tools "@bufbuild/buf@$BUF_VERSION" >&2
fi
if [ "$#" -gt 0 ]; then
  exec "$BUF" "$@"
fi
"$BUF" lint
# A clone without a local main branch (e.g. a shallow CI checkout of a tag) has nothing to
# compare against; say so rather than pass silently.
if git rev-parse --verify --quiet main >/dev/null; then
  "$BUF" breaking proto --against '.git#branch=main,subdir=proto'
else
  echo "buf.sh: no local main branch; breaking-change check skipped" >&2
fi
