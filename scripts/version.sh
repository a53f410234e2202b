#!/usr/bin/env bash
# The version `make` stamps into the binaries:
#   - the tag on HEAD, when it has one (vX.Y.Z);
#   - the release RELEASES records for HEAD, when the tree is clean;
#   - otherwise a development version of the next minor release after the
#     newest in RELEASES: v0.2.0-dev.N+COMMIT (N commits since that
#     release, COMMIT the short hash, ".dirty" with uncommitted changes),
#     which sorts after the release and before v0.2.0, so ctrl's skew
#     window (docs/compatibility.md) places it in the right minor line;
#   - "dev" outside a git checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
git rev-parse --git-dir >/dev/null 2>&1 || { echo dev; exit 0; }
if tag=$(git describe --tags --exact-match --match 'v[0-9]*' 2>/dev/null); then echo "$tag"; exit 0; fi
read -r ver commit _ < <(grep -v '^#' RELEASES | grep . | tail -n 1)
dirty=""
git diff --quiet HEAD -- 2>/dev/null || dirty=".dirty"
head=$(git rev-parse HEAD)
if [ "$head" = "$commit" ] && [ -z "$dirty" ]; then echo "$ver"; exit 0; fi
IFS=. read -r major minor _ <<<"${ver#v}"
n=$(git rev-list --count "$commit..HEAD" 2>/dev/null || echo 0)
echo "v${major}.$((minor + 1)).0-dev.${n}+$(git rev-parse --short=12 HEAD)${dirty}"
