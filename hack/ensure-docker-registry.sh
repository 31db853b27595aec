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

. "$(dirname "$0")/apt.sh"
apt_ensure docker-registry docker-registry
if [ "$APT_INSTALLED" = 1 ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  "${APT_SUDO[@]}" systemctl disable --now docker-registry.service >&2 || true
fi
