#!/usr/bin/env bash
# Makes `gpg` (GnuPG, Debian's `gnupg` package) available for the Helm provenance tests
# (tests/chart_sources.rs make an OpenPGP key with it and export the legacy keyring
# `helm package --sign` reads) and prints its path. When it is not on PATH, installs Debian's
# `gnupg` package. Idempotent: a second run only prints the path.
set -euo pipefail

. "$(dirname "$0")/apt.sh"
apt_ensure gpg gnupg
