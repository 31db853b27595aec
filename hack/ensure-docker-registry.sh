#!/usr/bin/env bash
# Makes `docker-registry` (the CNCF Distribution registry, Debian's package) available for the
# OCI chart-source tests (tests/chart_sources.rs start it on a loopback port with storage in a
# temporary directory) and prints its path. When it is not on PATH, installs Debian's
# `docker-registry` package. Idempotent: a second run only prints the path.
#
# The package also installs a registry service (systemd unit and SysV init script) listening on
# port 5000. On a machine without systemd (containers, CI) nothing starts it: invoke-rc.d finds no
# runlevel, and Docker images forbid service starts in /usr/sbin/policy-rc.d. Where systemd runs,
# the service is stopped and disabled here: the tests start their own registries.
set -euo pipefail

if path=$(command -v docker-registry); then
  echo "$path"
  exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "docker-registry is missing and installing it needs root or sudo" >&2; exit 1; }
  sudo=(sudo)
fi
echo "docker-registry not found: installing Debian's docker-registry package" >&2
"${sudo[@]}" apt-get update -qq >&2
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-registry >&2
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  "${sudo[@]}" systemctl disable --now docker-registry.service >&2 || true
fi
command -v docker-registry
