#!/usr/bin/env bash
# Makes `promtool` and the `prometheus` server available and prints promtool's path: promtool for
# tests/monitoring.rs (`promtool check metrics`, `check rules`, `test rules`), the server for the
# load test, which scrapes the replicas with it and evaluates the dashboards and alerts
# (docs/loadtest.md). When either is not on PATH, installs Debian's `prometheus` package, which
# ships both (2.42 on bookworm). Idempotent: a second run only prints the path.
#
# The package also installs a Prometheus server with a SysV init script and a systemd unit; on a
# machine without systemd (containers, CI) nothing starts it: invoke-rc.d finds no runlevel, and
# Docker images forbid service starts in /usr/sbin/policy-rc.d. Where systemd runs, the server
# starts and listens on port 9090, which nothing of module-manager uses (the load test starts its
# own on a free port of 127.0.0.1).
set -euo pipefail

. "$(dirname "$0")/apt.sh"
apt_ensure prometheus prometheus >/dev/null
apt_ensure promtool prometheus
