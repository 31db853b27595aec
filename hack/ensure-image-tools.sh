#!/usr/bin/env bash
# Makes what hack/build-image.sh needs beyond the toolchain available: musl-gcc (Debian's
# musl-tools: ring's C code in the static binary) and the x86_64-unknown-linux-musl target of
# the pinned toolchain (rust-toolchain.toml). Idempotent; prints the target.
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/apt.sh
apt_ensure musl-gcc musl-tools >/dev/null
target=x86_64-unknown-linux-musl
sysroot=$(rustc --print sysroot)
if [ ! -d "$sysroot/lib/rustlib/$target" ]; then
  rustup target add "$target" >&2
fi
echo "$target"
