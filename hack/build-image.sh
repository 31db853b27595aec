#!/usr/bin/env bash
# Builds the operator's image from this checkout without a container engine or a registry, as an
# OCI archive, and prints its path: the Dockerfile's builder stages redone here by hand (the static
# musl binary by cargo, helm and the renderer from hack/build-tools.sh's cache), the image's stage
# read from the Dockerfile itself by hack/oci-image.py (base files, LABELs, COPYs, USER,
# ENTRYPOINT, CMD). The image stage cannot drift from the Dockerfile; the builder stages can, and
# tests/image.rs pins their text: a change fails it with "update hack/build-image.sh".
# docs/development.md § The image without an engine.
#
#   hack/build-image.sh                      -> $cache/images/module-manager-<version>.tar,
#                                               named docker.io/library/module-manager:<version>
#   PROFILE=dev hack/build-image.sh          the debug build (what `make e2e` ships: minutes faster)
#   ADD="examples/charts=/charts/examples/charts" hack/build-image.sh
#                                            an image FROM it with these directories added (owned 65532)
#   REF=... OUT=... hack/build-image.sh      another name or file
#
# Import: ctr -n k8s.io images import <archive> (testenv's node does: Node::import_image).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cd "$repo"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
profile=${PROFILE:-release}
target=x86_64-unknown-linux-musl
cache=${MODULE_MANAGER_CACHE:-$HOME/.cache/module-manager}
ref=${REF:-docker.io/library/module-manager:$version}
out=${OUT:-$cache/images/module-manager-$version.tar}
log() { printf '[build-image] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

case $profile in
  release) profile_flag=(--release); profile_dir=release ;;
  dev) profile_flag=(); profile_dir=debug ;;
  *) die "PROFILE must be release or dev, not '$profile'" ;;
esac

# The operator stage: the static musl binary (as the Dockerfile builds it), the plugin link, /charts.
rustup target list --installed | grep -qx "$target" || rustup target add "$target" >&2
command -v musl-gcc >/dev/null || {
  . "$here/apt.sh"; apt_ensure musl-gcc musl-tools >/dev/null; }
log "cargo build ${profile_flag[*]} --target $target (static)"
CC_x86_64_unknown_linux_musl=musl-gcc cargo build "${profile_flag[@]}" --locked --target "$target" \
  -p module-manager --bin module-manager >&2
binary=${CARGO_TARGET_DIR:-$repo/target}/$target/$profile_dir/module-manager
if readelf -l "$binary" | grep -q 'program interpreter' || readelf -d "$binary" | grep -q '(NEEDED)'; then
  die "$binary is not static"
fi

tools=$cache/tools
. "$here/versions.env"
helm="$tools/helm-v$HELM_VERSION/helm"
renderer=$("$here/build-tools.sh" renderer-path)
[ -x "$helm" ] && [ -x "$renderer" ] || die "helm or the renderer is missing: run hack/build-tools.sh"

stages=$(mktemp -d)
trap 'rm -rf "$stages"' EXIT
mkdir -p "$stages/operator/plugin" "$stages/operator/charts" "$stages/helm/out" "$stages/renderer/out"
cp "$binary" "$stages/operator/module-manager"
ln -s module-manager "$stages/operator/plugin/kubectl-module_manager"
cp "$helm" "$stages/helm/out/helm"
cp "$renderer" "$stages/renderer/out/module-manager-renderer"

adds=()
for add in ${ADD:-}; do adds+=(--add "$add"); done
mkdir -p "$(dirname "$out")"
digest=$(SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)} \
  "$here/oci-image.py" dockerfile --dockerfile Dockerfile --ref "$ref" \
  --build-arg "VERSION=$version" --build-arg "REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
  --stage "operator=$stages/operator" --stage "helm=$stages/helm" --stage "renderer=$stages/renderer" \
  "${adds[@]}" --out "$out")
log "$ref ($digest): $out"
echo "$out"
