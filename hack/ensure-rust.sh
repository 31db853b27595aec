#!/usr/bin/env bash
# Makes the toolchain pinned in rust-toolchain.toml, with rustfmt and clippy, available without
# network access beyond the package registries: when rustup does not have the pinned version
# under its own name but the installed stable toolchain *is* that version, link it under that name.
set -euo pipefail
cd "$(dirname "$0")/.."
want=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
if ! rustup toolchain list | grep -q "^$want"; then
  stable_version=$(rustc +stable --version | awk '{print $2}')
  if [ "$stable_version" = "$want" ]; then
    rustup toolchain link "$want" "$(rustc +stable --print sysroot)"
  else
    rustup toolchain install "$want" --profile minimal --component rustfmt,clippy
  fi
fi
rustup component list --toolchain "$want" --installed | grep -q '^rustfmt' || rustup component add --toolchain "$want" rustfmt
rustup component list --toolchain "$want" --installed | grep -q '^clippy' || rustup component add --toolchain "$want" clippy
rustc --version
cargo --version
