#!/usr/bin/env bash
# Makes `gpg` (GnuPG, Debian's `gnupg` package) available for the Helm provenance tests
# (tests/chart_sources.rs make an OpenPGP key with it and export the legacy keyring
# `helm package --sign` reads) and prints its path. When it is not on PATH, installs Debian's
# `gnupg` package. Idempotent: a second run only prints the path.
set -euo pipefail

if path=$(command -v gpg); then
  echo "$path"
  exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "gpg is missing and installing it needs root or sudo" >&2; exit 1; }
  sudo=(sudo)
fi
echo "gpg not found: installing Debian's gnupg package" >&2
"${sudo[@]}" apt-get update -qq >&2
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gnupg >&2
command -v gpg
