#!/usr/bin/env bash
# Builds a release into $DIST (default dist/): everything a platform team pins, verifies and
# installs (docs/development.md, "Cutting a release"):
#
#   module-manager-<V>-linux-amd64          the operator, a static binary (musl), reproducible
#   kubectl-module_manager-<V>-linux-amd64  the same binary under the kubectl plugin's name
#   <extra>-<V>-linux-amd64                 EXTRA_BINARIES below, each when present
#   module-manager-<V>-crd.yaml             the Manifest CRD (`module-manager crd`)
#   module-manager-<V>-install.yaml         deploy/base rendered by the pinned kustomize
#   module-manager-<V>-install-monitoring.yaml   deploy/ (with ServiceMonitor, rules, dashboards)
#   module-manager-<V>.tgz                  the Helm chart (`helm package`, chart version = V)
#   module-manager-<V>.cdx.json             SBOM of the Rust dependencies (CycloneDX, JSON)
#   SHA256SUMS                              `sha256sum` of every file above
#
# Every manifest runs the image $IMAGE:<V>.
#
#   VERSION=0.1.0 hack/release.sh                 (what `make release VERSION=0.1.0` runs)
#   VERSION=0.1.0 IMAGE=registry.example.com/module-manager DIST=/tmp/d hack/release.sh
#
# VERSION must be the version in Cargo.toml (the one source of truth; hack/set-version.sh bumps
# it everywhere). A release build refuses a dirty work tree (ALLOW_DIRTY=1 overrides).
# RELEASE_BINARY=<path> stages a release around an already built binary instead of building one
# (tests/deploy.rs does, with the debug binary: the same script, without a release compile).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cd "$repo"
# shellcheck source=versions.env
. "$here/versions.env"

# Binaries shipped beside the operator, each looked up where hack/build-tools.sh caches it
# (extra_path), then on PATH. The renderer (renderer/, Helm's engine as a long-lived child) is
# cached under a key of its source: `hack/build-tools.sh renderer-path` says where.
EXTRA_BINARIES=(module-manager-renderer)
extra_path() {
  case $1 in
    module-manager-renderer) "$here/build-tools.sh" renderer-path ;;
    *) echo "$tools/$1" ;;
  esac
}

cache=${MODULE_MANAGER_CACHE:-$HOME/.cache/module-manager}
tools="$cache/tools"
IMAGE=${IMAGE:-module-manager}
DIST=${DIST:-$repo/dist}
TARGET=${TARGET:-x86_64-unknown-linux-musl}

log() { printf '[release] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# --- the version --------------------------------------------------------------------------------
cargo_version=$(python3 -c 'import tomllib; print(tomllib.load(open("Cargo.toml", "rb"))["package"]["version"])')
[ -n "${VERSION:-}" ] || die "VERSION is not set (Cargo.toml says $cargo_version): make release VERSION=$cargo_version"
[[ $VERSION =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] || die "VERSION $VERSION is not a semantic version x.y.z[-pre]"
[ "$VERSION" = "$cargo_version" ] \
  || die "VERSION $VERSION is not Cargo.toml's version $cargo_version: run hack/set-version.sh $VERSION and commit first"
if [ -z "${RELEASE_BINARY:-}" ] && [ "${ALLOW_DIRTY:-0}" != 1 ] && [ -n "$(git status --porcelain)" ]; then
  die "the work tree has uncommitted changes (a release is built from a commit; ALLOW_DIRTY=1 overrides)"
fi
# Every timestamp a tool writes (the SBOM; tar headers where a tool honours it) is the commit's.
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)
export SOURCE_DATE_EPOCH

# --- the output directory: absent, empty or a previous release (never anything else) ----------
if [ -e "$DIST" ] && [ -n "$(ls -A "$DIST")" ] && [ ! -f "$DIST/SHA256SUMS" ]; then
  die "$DIST is not empty and holds no previous release (no SHA256SUMS): not removing it"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Everything is written to $out and moved to $DIST at the end: a failed run leaves no half
# release behind.
out="$work/dist"
mkdir -p "$out"
name="module-manager-$VERSION"

# --- the binary ---------------------------------------------------------------------------------
# Reproducible: paths that differ between machines or checkouts are remapped (panic messages and
# debug info embed source paths), no incremental state, the commit's time. musl links statically;
# +crt-static makes a glibc target (TARGET=x86_64-unknown-linux-gnu) static too.
# ring's C and assembly need a C compiler for the target: musl-gcc (Debian's musl-tools, as in
# the Dockerfile), installed like hack/ensure-promtool.sh installs promtool.
ensure_musl_gcc() {
  command -v musl-gcc >/dev/null && return
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "musl-gcc is missing and installing musl-tools needs root or sudo"
    sudo=(sudo)
  fi
  log "musl-gcc not found: installing Debian's musl-tools"
  "${sudo[@]}" apt-get update -qq >&2
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends musl-tools >&2
}

build_binary() {
  local target_dir=${CARGO_TARGET_DIR:-$repo/target}
  local cargo_home=${CARGO_HOME:-$HOME/.cargo}
  rustup target list --installed | grep -qx "$TARGET" || rustup target add "$TARGET" >&2
  if [[ $TARGET == *-linux-musl ]]; then
    ensure_musl_gcc
    export "CC_${TARGET//-/_}=musl-gcc"
  fi
  log "cargo build --release --target $TARGET (static, paths remapped)"
  CARGO_INCREMENTAL=0 \
  RUSTFLAGS="-C target-feature=+crt-static --remap-path-prefix=$repo=/module-manager --remap-path-prefix=$cargo_home=/cargo --remap-path-prefix=$target_dir=/target" \
    cargo build --release --locked --target "$TARGET" -p module-manager --bin module-manager >&2
  cp "$target_dir/$TARGET/release/module-manager" "$out/$name-linux-amd64"
  # Static: no program interpreter, no shared library.
  if readelf -l "$out/$name-linux-amd64" | grep -q 'program interpreter' \
     || readelf -d "$out/$name-linux-amd64" | grep -q '(NEEDED)'; then
    die "$out/$name-linux-amd64 is not static: $(readelf -d "$out/$name-linux-amd64" | grep NEEDED)"
  fi
}
if [ -n "${RELEASE_BINARY:-}" ]; then
  log "staging around $RELEASE_BINARY (no release build)"
  cp "$RELEASE_BINARY" "$out/$name-linux-amd64"
else
  build_binary
fi
binary="$out/$name-linux-amd64"
chmod 0755 "$binary"
"$binary" --version | grep -qxF "module-manager $VERSION" \
  || die "$binary --version says '$("$binary" --version)', not module-manager $VERSION"

# The kubectl plugin: the same bytes under the name kubectl looks for on PATH
# (`kubectl module-manager …`; the binary reads its argv[0]; docs/cli.md).
install -m 0755 "$binary" "$out/kubectl-module_manager-$VERSION-linux-amd64"

for extra in "${EXTRA_BINARIES[@]}"; do
  path=$(extra_path "$extra")
  [ -x "$path" ] || path=$(command -v "$extra" || true)
  if [ -n "$path" ]; then
    log "shipping $extra from $path"
    install -m 0755 "$path" "$out/$extra-$VERSION-linux-amd64"
  else
    log "$extra: not built here, not shipped"
  fi
done

# --- the CRD, the kustomize bundles, the chart ------------------------------------------------
"$binary" crd > "$out/$name-crd.yaml"
cmp -s "$out/$name-crd.yaml" deploy/base/crds/manifest.yaml \
  || die "deploy/base/crds/manifest.yaml differs from '$binary crd': run make crds"

kustomize="$tools/kustomize-v$KUSTOMIZE_VERSION/kustomize"
helm="$tools/helm-v$HELM_VERSION/helm"
[ -x "$kustomize" ] && [ -x "$helm" ] || die "kustomize or helm missing in $tools: run make tools"
# An overlay outside the repository: the released image for deploy/base and deploy/ (kustomize
# takes a directory resource as a relative path only).
for variant in install:deploy/base install-monitoring:deploy; do
  mkdir -p "$work/${variant%%:*}"
  cat > "$work/${variant%%:*}/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $(python3 -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$repo/${variant#*:}" "$work/${variant%%:*}")
images:
  - name: module-manager
    newName: $IMAGE
    newTag: "$VERSION"
EOF
  "$kustomize" build "$work/${variant%%:*}" > "$out/$name-${variant%%:*}.yaml"
done

# The chart with its links resolved (crds/, monitoring/), its image repository set; the tag is
# the appVersion.
cp -RL helm/module-manager "$work/chart"
python3 - "$work/chart/values.yaml" "$IMAGE" <<'EOF'
import sys
path, image = sys.argv[1], sys.argv[2]
text = open(path).read()
old = "image:\n  repository: module-manager\n"
if old not in text:
    sys.exit(f"{path}: no 'image.repository: module-manager' to set")
open(path, "w").write(text.replace(old, f"image:\n  repository: {image}\n", 1))
EOF
HOME="$work/helm" HELM_CACHE_HOME="$work/helm/cache" HELM_CONFIG_HOME="$work/helm/config" \
  HELM_DATA_HOME="$work/helm/data" \
  "$helm" package "$work/chart" --version "$VERSION" --app-version "$VERSION" -d "$out" >&2
[ -f "$out/$name.tgz" ] || die "helm package wrote no $name.tgz"

# --- the SBOM -------------------------------------------------------------------------------
cyclonedx="$tools/cargo-tools/bin/cargo-cyclonedx"
[ -x "$cyclonedx" ] || die "$cyclonedx is missing: run hack/ensure-cargo-tools.sh (make setup)"
# cargo-cyclonedx writes <package>.cdx.json beside the package's Cargo.toml: from a copy of the
# manifests, so that the repository stays clean.
mkdir -p "$work/sbom"
cp Cargo.toml Cargo.lock "$work/sbom/"
cp -R src benches examples tests testenv test-support loadtest "$work/sbom/"
"$cyclonedx" cyclonedx --manifest-path "$work/sbom/Cargo.toml" --format json \
  --target "$TARGET" --override-filename "$name.cdx" >&2
# The copy's temporary path names the workspace's own packages: as /module-manager, like the
# binary's remapped paths (and the same in every run).
sed "s|$work/sbom|/module-manager|g" "$work/sbom/$name.cdx.json" > "$out/$name.cdx.json"

# --- checksums ------------------------------------------------------------------------------
(cd "$out" && find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%f\n' | LC_ALL=C sort \
  | xargs sha256sum > SHA256SUMS)
rm -rf "$DIST"
mkdir -p "$(dirname "$DIST")"
mv "$out" "$DIST"
log "release $VERSION in $DIST:"
cat "$DIST/SHA256SUMS" >&2
log "the image: docker build --build-arg VERSION=$VERSION --build-arg REVISION=$(git rev-parse HEAD) -t $IMAGE:$VERSION ."
