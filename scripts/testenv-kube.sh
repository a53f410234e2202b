#!/usr/bin/env bash
# Builds the binaries of a real Kubernetes control plane (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler) and kwok through the Go module proxy,
# once per version, into a cache outside the checkout. Safe to re-run: binaries
# that exist are kept.
#
# k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces every staging
# module with ./staging/... . We build it from a throwaway module that requires
# it and replaces each staging module with its published v0.X.Y tag.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.36.3}
ETCD_VERSION=${ETCD_VERSION:-3.6.6}
KWOK_VERSION=${KWOK_VERSION:-0.7.0}
CACHE=${KRANE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/krane}
BIN=${KRANE_KUBE_BIN_DIR:-$CACHE/testenv/k8s-v$K8S_VERSION/bin}
WORK=$CACHE/testenv/build
export GOFLAGS=-mod=mod GOWORK=off CGO_ENABLED=0

step() { printf '==> %s\n' "$*" >&2; }
need() { [ -x "$BIN/$1" ] && { step "$1: cached in $BIN"; return 1; }; return 0; }
mkdir -p "$BIN" "$WORK"
command -v go >/dev/null || { echo "testenv: 'go' not found in PATH; install Go 1.26+" >&2; exit 1; }

staging_minor=${K8S_VERSION#1.}   # 1.36.3 -> 36.3
kube_bins=(kube-apiserver kube-controller-manager kube-scheduler)
missing=()
for b in "${kube_bins[@]}"; do need "$b" && missing+=("$b"); done
if [ ${#missing[@]} -gt 0 ]; then
  mod=$WORK/kubernetes-v$K8S_VERSION
  mkdir -p "$mod"
  if [ ! -f "$mod/go.mod" ] || ! grep -q "k8s.io/kubernetes v$K8S_VERSION" "$mod/go.mod"; then
    step "resolving k8s.io/kubernetes v$K8S_VERSION and its staging modules"
    gomod=$(cd "$WORK" && go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    [ -f "$gomod" ] || { echo "testenv: could not download k8s.io/kubernetes@v$K8S_VERSION from the Go module proxy" >&2; exit 1; }
    {
      echo "module krane.local/kubebuild"
      echo
      echo "go 1.26"
      echo
      echo "require k8s.io/kubernetes v$K8S_VERSION"
      echo
      grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging' "$gomod" | awk -v v="v0.$staging_minor" '{print "replace " $1 " => " $1 " " v}'
    } >"$mod/go.mod"
    printf 'package main\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-apiserver/app"\n\t_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"\n\t_ "k8s.io/kubernetes/cmd/kube-scheduler/app"\n)\n\nfunc main() {}\n' >"$mod/deps.go"
    step "go mod tidy (first run downloads a few hundred modules)"
    (cd "$mod" && go mod tidy)
  fi
  for b in "${missing[@]}"; do
    step "building $b v$K8S_VERSION (first build takes minutes on 2 cores)"
    (cd "$mod" && go build -trimpath -o "$BIN/$b.tmp" "k8s.io/kubernetes/cmd/$b") && mv "$BIN/$b.tmp" "$BIN/$b"
  done
fi

if need etcd; then
  mod=$WORK/etcd-v$ETCD_VERSION
  mkdir -p "$mod"
  if [ ! -f "$mod/go.sum" ]; then
    printf 'module krane.local/etcdbuild\n\ngo 1.26\n\nrequire go.etcd.io/etcd/server/v3 v%s\n' "$ETCD_VERSION" >"$mod/go.mod"
    printf 'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n' >"$mod/main.go"
    step "go mod tidy for etcd v$ETCD_VERSION"
    (cd "$mod" && go mod tidy)
  fi
  step "building etcd v$ETCD_VERSION"
  (cd "$mod" && go build -trimpath -o "$BIN/etcd.tmp" .) && mv "$BIN/etcd.tmp" "$BIN/etcd"
fi

if need kwok; then
  step "building kwok v$KWOK_VERSION"
  GOBIN=$BIN go install "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION"
fi

step "kube test binaries ready in $BIN"
