#!/usr/bin/env bash
# Installs the pinned cargo-deny and cargo-cyclonedx (hack/versions.env) from crates.io with
# `cargo install --locked` into the tool cache, and prints the directory of their binaries:
#
#   ~/.cache/module-manager/tools/cargo-tools/<name>-v<version>/bin/<name>
#
# (`$MODULE_MANAGER_CACHE` overrides the root.) Idempotent: a tool whose binary is present and
# reports the pinned version is not rebuilt; a cold install compiles both (minutes: see
# docs/development.md). The build runs in its own target directory under the cache's build/, which
# is removed after a successful install.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
# shellcheck source=versions.env
. "$here/versions.env"

cache=${MODULE_MANAGER_CACHE:-$HOME/.cache/module-manager}
tools="$cache/tools/cargo-tools"
bin="$tools/bin"
mkdir -p "$bin"

log() { printf '[ensure-cargo-tools] %s\n' "$*" >&2; }

# install NAME VERSION: cargo install NAME@VERSION unless its binary reports VERSION; links the
# binary into $bin (the one directory callers put on PATH).
install() {
  local name=$1 version=$2 root="$tools/$1-v$2" out
  if [ -x "$root/bin/$name" ] && out=$("$root/bin/$name" "${name#cargo-}" --version 2>/dev/null) \
      && grep -qF "$version" <<<"$out"; then
    log "$name v$version: cached"
  else
    log "$name v$version: building (cargo install --locked)"
    local start; start=$(date +%s)
    local target="$cache/build/cargo-install-$name-v$version"
    cargo install --locked --quiet --version "$version" --root "$root" --target-dir "$target" "$name" >&2
    rm -rf "$target"
    log "$name v$version: built in $(( $(date +%s) - start ))s"
  fi
  ln -sfn "$root/bin/$name" "$bin/$name"
}

install cargo-deny "$CARGO_DENY_VERSION"
install cargo-cyclonedx "$CARGO_CYCLONEDX_VERSION"
echo "$bin"
