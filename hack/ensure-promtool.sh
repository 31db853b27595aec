#!/usr/bin/env bash
# Makes `promtool` available for tests/monitoring.rs (`promtool check metrics`, `check rules`,
# `test rules`) and prints its path. When it is not on PATH, installs Debian's `prometheus`
# package, which ships it (2.42 on bookworm). Idempotent: a second run only prints the path.
#
# The package also installs a Prometheus server with a SysV init script and a systemd unit; on a
# machine without systemd (containers, CI) nothing starts it: invoke-rc.d finds no runlevel, and
# Docker images forbid service starts in /usr/sbin/policy-rc.d. Where systemd runs, the server
# starts and listens on port 9090, which nothing of module-manager uses.
set -euo pipefail

. "$(dirname "$0")/apt.sh"
apt_ensure promtool prometheus
