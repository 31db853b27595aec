#!/usr/bin/env bash
# Builds the pinned tools from their Go modules, and the renderer from renderer/, into a versioned
# cache outside the repository. Idempotent: a tool whose binary is present and reports the pinned
# version is not rebuilt.
#
#   hack/build-tools.sh                 every tool the tests use: etcd, helm, kube-apiserver,
#                                       kube-controller-manager, kube-scheduler, kubectl, kubelet,
#                                       kube-proxy, kwok,
#                                       kustomize, cosign, the renderer
#   hack/build-tools.sh demo            only what `make run` needs: etcd, the three Kubernetes
#                                       binaries the demo starts, kwok, the renderer, and (cargo)
#                                       the operator, its demo client and testenv
#   hack/build-tools.sh renderer-path   where the renderer of this checkout is (or will be) cached
#   MODULE_MANAGER_CACHE=/x ...         use another cache root (default $HOME/.cache/module-manager)
#
# Each tool is announced on stderr with what it is, then "cached" or how long its build took, and
# a total at the end; stdout is the tool directory only (callers capture it).
#
# Why wrapper modules: k8s.io/kubernetes and etcd's server module carry replace directives, so
# `go install pkg@version` refuses them; a main module that requires them and replaces each
# staging module with its published version builds them (docs/development.md).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"

cache=${MODULE_MANAGER_CACHE:-$HOME/.cache/module-manager}
tools="$cache/tools"
work="$cache/build"
mkdir -p "$tools" "$work"

export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
export GOPROXY=${GOPROXY:-https://proxy.golang.org}

log() { printf '[build-tools] %s\n' "$*" >&2; }

# has_version BINARY EXPECTED ARGS...: the binary exists and prints EXPECTED in its version output.
# (The output is captured first: `bin | grep -q` would fail under pipefail when grep exits early.)
has_version() {
  local bin=$1 want=$2 out; shift 2
  [ -x "$bin" ] || return 1
  out=$("$bin" "$@" 2>/dev/null) || return 1
  grep -qF "$want" <<<"$out"
}

# kubernetes_wrapper DIR VERSION STAGING_VERSION: a fresh main module in DIR (and cd there) that
# requires k8s.io/kubernetes and replaces each staging module with its published version.
kubernetes_wrapper() {
  local w=$1 v=$2 staging_v=$3 gomod staging goline m
  rm -rf "$w"; mkdir -p "$w"; cd "$w"
  go mod init local/k8sbuild >/dev/null 2>&1
  gomod=$(go mod download -json "k8s.io/kubernetes@v$v" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  # Staging modules are the ones k8s.io/kubernetes replaces with ./staging/src/k8s.io/<x>.
  staging=$(grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging/src/' "$gomod" | awk '{print $1}' | sort -u)
  goline=$(grep -m1 '^go ' "$gomod")
  {
    echo "module local/k8sbuild"; echo; echo "$goline"; echo
    echo "require k8s.io/kubernetes v$v"; echo; echo "replace ("
    for m in $staging; do printf '\t%s => %s %s\n' "$m" "$m" "$staging_v"; done
    echo ")"
  } > go.mod
}

# kubernetes_ldflags VERSION MINOR: the same -X flags as kubernetes' hack/lib/version.sh, so
# /version reports vVERSION (Helm's kubeVersion constraints and .Capabilities.KubeVersion read it).
kubernetes_ldflags() {
  local v=$1 minor=$2 ldf="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf="$ldf -X $p.gitVersion=v$v -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$ldf"
}

have_kubernetes() {
  local v=$KUBERNETES_VERSION dir="$tools/kubernetes-v$KUBERNETES_VERSION"
  has_version "$dir/kube-apiserver" "v$v" --version &&
    has_version "$dir/kube-controller-manager" "v$v" --version &&
    has_version "$dir/kube-scheduler" "v$v" --version
}

build_kubernetes() {
  local v=$KUBERNETES_VERSION minor staging_v dir="$tools/kubernetes-v$KUBERNETES_VERSION"
  minor=$(echo "$v" | cut -d. -f2)
  staging_v="v0.${v#1.}"
  local w="$work/kubernetes-v$v"
  kubernetes_wrapper "$w" "$v" "$staging_v"
  go get "k8s.io/kubernetes/cmd/kube-apiserver@v$v" "k8s.io/kubernetes/cmd/kube-controller-manager@v$v" \
    "k8s.io/kubernetes/cmd/kube-scheduler@v$v"
  local ldf
  ldf=$(kubernetes_ldflags "$v" "$minor")
  mkdir -p "$w/bin"
  go build -trimpath -tags selinux,notest -ldflags "$ldf" -o "$w/bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler
  mkdir -p "$dir"
  mv "$w/bin/kube-apiserver" "$w/bin/kube-controller-manager" "$w/bin/kube-scheduler" "$dir/"
  has_version "$dir/kube-apiserver" "v$v" --version || { log "kube-apiserver does not report v$v"; exit 1; }
}

# kubectl, from the same wrapper module and version (in its own build directory, so that the
# cached control-plane binaries are not rebuilt): tests run `kubectl module-manager …` (the
# plugin) and `kubectl wait` with it.
have_kubectl() { has_version "$tools/kubernetes-v$KUBERNETES_VERSION/kubectl" "v$KUBERNETES_VERSION" version --client; }

build_kubectl() {
  local v=$KUBERNETES_VERSION dir="$tools/kubernetes-v$KUBERNETES_VERSION"
  local w="$work/kubectl-v$v" ldf
  kubernetes_wrapper "$w" "$v" "v0.${v#1.}"
  go get "k8s.io/kubernetes/cmd/kubectl@v$v"
  ldf=$(kubernetes_ldflags "$v" "$(echo "$v" | cut -d. -f2)")
  go build -trimpath -ldflags "$ldf" -o "$w/kubectl" k8s.io/kubernetes/cmd/kubectl
  mkdir -p "$dir"
  mv "$w/kubectl" "$dir/kubectl"
  has_version "$dir/kubectl" "v$v" version --client || { log "kubectl does not report v$v"; exit 1; }
}

# kubelet and kube-proxy: the real node of `testenv up --kubelet` (testenv/src/node.rs), from the
# same wrapper module and version (in their own build directory, so that the cached control-plane
# binaries are not rebuilt). `all` builds them, `demo` does not (the demo runs on kwok nodes).
have_node() {
  local dir="$tools/kubernetes-v$KUBERNETES_VERSION"
  has_version "$dir/kubelet" "v$KUBERNETES_VERSION" --version &&
    has_version "$dir/kube-proxy" "v$KUBERNETES_VERSION" --version
}

build_node() {
  local v=$KUBERNETES_VERSION dir="$tools/kubernetes-v$KUBERNETES_VERSION"
  local w="$work/node-v$v" ldf
  kubernetes_wrapper "$w" "$v" "v0.${v#1.}"
  go get "k8s.io/kubernetes/cmd/kubelet@v$v" "k8s.io/kubernetes/cmd/kube-proxy@v$v"
  ldf=$(kubernetes_ldflags "$v" "$(echo "$v" | cut -d. -f2)")
  mkdir -p "$w/bin"
  go build -trimpath -tags selinux,notest -ldflags "$ldf" -o "$w/bin/" \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
  mkdir -p "$dir"
  mv "$w/bin/kubelet" "$w/bin/kube-proxy" "$dir/"
  has_version "$dir/kubelet" "v$v" --version || { log "kubelet does not report v$v"; exit 1; }
}

have_etcd() { has_version "$tools/etcd-v$ETCD_VERSION/etcd" "$ETCD_VERSION" --version; }

build_etcd() {
  local v=$ETCD_VERSION dir="$tools/etcd-v$ETCD_VERSION"
  local w="$work/etcd-v$v"
  rm -rf "$w"; mkdir -p "$w"; cd "$w"
  go mod init local/etcdbuild >/dev/null 2>&1
  go get "go.etcd.io/etcd/server/v3@v$v"
  mkdir -p "$dir"
  go build -trimpath -ldflags "-s -w" -o "$w/etcd" go.etcd.io/etcd/server/v3
  mv "$w/etcd" "$dir/etcd"
  has_version "$dir/etcd" "$v" --version || { log "etcd does not report $v"; exit 1; }
}

have_helm() { has_version "$tools/helm-v$HELM_VERSION/helm" "v$HELM_VERSION" version --short; }

build_helm() {
  local v=$HELM_VERSION dir="$tools/helm-v$HELM_VERSION"
  local major=${v%%.*}
  mkdir -p "$dir"
  GOBIN="$dir" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v$major/internal/version.version=v$v" \
    "helm.sh/helm/v$major/cmd/helm@v$v"
  has_version "$dir/helm" "v$v" version --short || { log "helm does not report v$v"; exit 1; }
}

# kwok simulates nodes and the kubelet, so that workloads roll out on a control plane without
# machines (the demo and the load test). Its stage definitions (node ready + lease heartbeat,
# pod ready/complete/delete: kwok's "fast" set) come from the same module and are written to
# stages.yaml beside the binary.
have_kwok() {
  has_version "$tools/kwok-v$KWOK_VERSION/kwok" "v$KWOK_VERSION" --version && [ -s "$tools/kwok-v$KWOK_VERSION/stages.yaml" ]
}

build_kwok() {
  local v=$KWOK_VERSION dir="$tools/kwok-v$KWOK_VERSION"
  mkdir -p "$dir"
  GOBIN="$dir" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@v$v"
  has_version "$dir/kwok" "v$v" --version || { log "kwok does not report v$v"; exit 1; }
  local stages f
  stages="$(go env GOMODCACHE)/sigs.k8s.io/kwok@v$v/kustomize/stage"
  : > "$dir/stages.yaml.tmp"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    { echo '---'; cat "$stages/$f"; } >> "$dir/stages.yaml.tmp"
  done
  mv "$dir/stages.yaml.tmp" "$dir/stages.yaml"
}

# kustomize renders the deploy/ manifests (tests/deploy.rs checks them against the API server).
# A plain `go install`: its module has no replace directives.
have_kustomize() { has_version "$tools/kustomize-v$KUSTOMIZE_VERSION/kustomize" "v$KUSTOMIZE_VERSION" version; }

build_kustomize() {
  local v=$KUSTOMIZE_VERSION dir="$tools/kustomize-v$KUSTOMIZE_VERSION"
  local major=${v%%.*}
  mkdir -p "$dir"
  GOBIN="$dir" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kustomize/kustomize/v$major@v$v"
  has_version "$dir/kustomize" "v$v" version || { log "kustomize does not report v$v"; exit 1; }
}

# cosign signs charts in the signature tests (tests/chart_sources.rs, spec.chart.verify). A plain
# `go install`: its module has no replace directives. The -X sets what `cosign version` prints.
have_cosign() { has_version "$tools/cosign-v$COSIGN_VERSION/cosign" "v$COSIGN_VERSION" version; }

build_cosign() {
  local v=$COSIGN_VERSION dir="$tools/cosign-v$COSIGN_VERSION"
  local major=${v%%.*}
  mkdir -p "$dir"
  GOBIN="$dir" go install -trimpath -ldflags "-s -w -X sigs.k8s.io/release-utils/version.gitVersion=v$v" \
    "github.com/sigstore/cosign/v$major/cmd/cosign@v$v"
  has_version "$dir/cosign" "v$v" version || { log "cosign does not report v$v"; exit 1; }
}

# The renderer (renderer/ in this repository): Helm's engine at HELM_VERSION as a long-lived child
# of each replica (docs/reconcile.md). Cached under a key over HELM_VERSION and its sources, so an
# edit rebuilds it; testenv/src/tools.rs computes the same key (renderer_key) to find it.
renderer_key() {
  local src=$1 f
  {
    echo "HELM_VERSION=$HELM_VERSION"
    for f in $(cd "$src" && ls -- *.go go.mod go.sum | LC_ALL=C sort); do
      echo "$f"; sha256sum < "$src/$f" | cut -d' ' -f1
    done
  } | sha256sum | cut -c1-16
}

renderer_dir() { echo "$tools/renderer-$(renderer_key "$here/../renderer")"; }

have_renderer() { has_version "$(renderer_dir)/module-manager-renderer" "v$HELM_VERSION" --version; }

build_renderer() {
  local src="$here/../renderer" dir want
  dir=$(renderer_dir)
  want="helm.sh/helm/v${HELM_VERSION%%.*} v$HELM_VERSION"
  grep -qF "$want" "$src/go.mod" || {
    log "renderer/go.mod does not require $want (run: cd renderer && go get helm.sh/helm/v${HELM_VERSION%%.*}@v$HELM_VERSION && go mod tidy)"; exit 1; }
  mkdir -p "$dir"
  # The same -X as build_helm: .Capabilities.HelmVersion must read the same in both backends.
  (cd "$src" && go build -mod=readonly -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v${HELM_VERSION%%.*}/internal/version.version=v$HELM_VERSION" \
    -o "$dir/module-manager-renderer.tmp" .)
  mv "$dir/module-manager-renderer.tmp" "$dir/module-manager-renderer"
  has_version "$dir/module-manager-renderer" "v$HELM_VERSION" --version || { log "the renderer does not report v$HELM_VERSION"; exit 1; }
}

# The operator, the demo's client (examples/demo.rs) and testenv's CLI, as hack/demo.sh and
# `make cluster-up` run them (debug, into $CARGO_TARGET_DIR or target/): the demo set only, so that
# its announcements and total cover the whole first-run build. Cargo decides what is stale, so
# this step has no have_operator and is neither "cached" nor counted as built; an up-to-date build
# takes about a second.
build_operator() {
  cd "$here/.."
  ${CARGO:-cargo} build --bin module-manager --example demo
  ${CARGO:-cargo} build -p testenv --bin testenv
}

# `hack/build-tools.sh renderer-path`: where the renderer of this checkout is (or will be) cached.
if [ "${1:-}" = renderer-path ]; then
  echo "$tools/renderer-$(renderer_key "$here/../renderer")/module-manager-renderer"; exit 0
fi

# human_duration SECONDS: 42s, 3m07s.
human_duration() {
  if [ "$1" -lt 60 ]; then echo "${1}s"; else printf '%dm%02ds\n' $(($1 / 60)) $(($1 % 60)); fi
}

# Each tool's name in the announcements, and what it is.
declare -A label what
label[etcd]="etcd v$ETCD_VERSION"
what[etcd]="the control plane's store"
label[helm]="helm v$HELM_VERSION"
what[helm]="the helm CLI, the reference renderer of the tests and benchmarks"
label[kubernetes]="kube-apiserver, kube-controller-manager, kube-scheduler v$KUBERNETES_VERSION"
what[kubernetes]="the local control plane"
label[kubectl]="kubectl v$KUBERNETES_VERSION"
what[kubectl]="the tests' kubectl (the plugin, kubectl wait, the docs' examples)"
label[node]="kubelet, kube-proxy v$KUBERNETES_VERSION"
what[node]="a real node for the end-to-end tests (testenv up --kubelet)"
label[kwok]="kwok v$KWOK_VERSION"
what[kwok]="simulated nodes and kubelets, so that workloads roll out"
label[kustomize]="kustomize v$KUSTOMIZE_VERSION"
what[kustomize]="renders deploy/ in tests/deploy.rs"
label[cosign]="cosign v$COSIGN_VERSION"
what[cosign]="signs the charts of the signature tests"
label[renderer]="renderer (helm v$HELM_VERSION)"
what[renderer]="the operator's chart renderer, Helm's engine (renderer/)"
label[operator]="module-manager, examples/demo.rs, testenv"
what[operator]="the operator and the demo's programs (cargo build)"

built=0 cached=0
# step NAME: announces the tool with what it is, then runs build_NAME (in a subshell, its output
# on stderr) unless have_NAME finds the tool cached, and says how long the build took.
step() {
  local name=$1 t0
  local announce="${label[$name]}: ${what[$name]}"
  if ! declare -F "have_$name" >/dev/null; then
    log "$announce (building what changed…)"
  elif "have_$name"; then
    log "$announce (cached)"; cached=$((cached + 1)); return
  else
    log "$announce (building…)"; built=$((built + 1))
  fi
  t0=$(date +%s)
  ( "build_$name" ) >&2
  log "${label[$name]}: built in $(human_duration $(( $(date +%s) - t0 )))"
}

selection=${1:-all}
case "$selection" in
  all) steps="etcd helm kubernetes kubectl node kwok kustomize cosign renderer" ;;
  demo) steps="etcd kubernetes kwok renderer operator" ;;
  *) echo "usage: hack/build-tools.sh [all | demo | renderer-path]" >&2; exit 2 ;;
esac
start=$(date +%s)
for name in $steps; do step "$name"; done
log "$selection: $built built, $cached cached, $(human_duration $(( $(date +%s) - start ))) in all"
echo "$tools"
