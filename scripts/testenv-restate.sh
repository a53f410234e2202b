#!/usr/bin/env bash
# Installs the Restate server, its CLI and restatectl (cluster administration,
# used by deploy/check to provision a cluster) from the npm registry into a
# cache outside the checkout, once per version.
set -euo pipefail
RESTATE_VERSION=${RESTATE_VERSION:-1.7.12}
CACHE=${KRANE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/krane}
DIR=$CACHE/tools/restate-$RESTATE_VERSION
SERVER=$DIR/node_modules/@restatedev/restate-server-linux-x64/bin/restate-server
RESTATECTL=$DIR/node_modules/@restatedev/restatectl-linux-x64/bin/restatectl
if [ -x "$SERVER" ] && [ -x "$RESTATECTL" ]; then echo "==> restate-server $RESTATE_VERSION: cached in $DIR" >&2; exit 0; fi
command -v npm >/dev/null || { echo "testenv: 'npm' not found; install Node.js and npm (Debian: apt-get install nodejs npm) to fetch the Restate server" >&2; exit 1; }
echo "==> installing @restatedev/restate-server@$RESTATE_VERSION from the npm registry" >&2
mkdir -p "$DIR"
npm install --prefix "$DIR" --no-audit --no-fund --ignore-scripts --loglevel=error \
  "@restatedev/restate-server@$RESTATE_VERSION" "@restatedev/restate@$RESTATE_VERSION" \
  "@restatedev/restatectl@$RESTATE_VERSION" >&2
for b in "$SERVER" "$RESTATECTL"; do
  [ -x "$b" ] || { echo "testenv: npm finished but $b is missing (is this linux-x64?)" >&2; exit 1; }
done
echo "==> restate-server ready: $SERVER" >&2
