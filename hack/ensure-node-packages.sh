#!/usr/bin/env bash
# Makes the container runtime of the real node (`testenv up --kubelet`, `make e2e`) available from
# Debian's packages and prints the directory of the CNI plugins: containerd (1.6 on bookworm),
# runc, the CNI plugins (bridge, host-local, portmap, loopback), iptables (kube-proxy's rules and
# the node's isolation rules), conntrack and iproute2. Idempotent: a second run only checks and
# prints.
#
# Each file is tested where Debian installs it (/usr/sbin is not on a non-root PATH). The
# packages' services are left alone: without systemd nothing starts them (invoke-rc.d finds no
# runlevel; Docker-style images deny it in /usr/sbin/policy-rc.d); where systemd runs, Debian's
# containerd.service may run beside testenv's own containerd, which has its own configuration,
# socket, root and state directories (docs/development.md § A real node).
set -euo pipefail

. "$(dirname "$0")/apt.sh"
missing=()
for pair in /usr/bin/containerd:containerd /usr/bin/ctr:containerd /usr/sbin/runc:runc \
  /usr/sbin/iptables:iptables /usr/sbin/conntrack:conntrack /usr/sbin/ip:iproute2 \
  /usr/lib/cni/bridge:containernetworking-plugins; do
  file=${pair%%:*} package=${pair#*:}
  [ -x "$file" ] || [ -x "${file/\/usr\/sbin\//\/usr\/bin\/}" ] || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "missing ${missing[*]}: installing needs root or sudo" >&2; exit 1; }
    APT_SUDO=(sudo)
  fi
  packages=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
  echo "the real node's packages are missing: installing Debian's $packages" >&2
  "${APT_SUDO[@]}" apt-get update -qq >&2
  # shellcheck disable=SC2086
  "${APT_SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $packages >&2
fi
cni=/usr/lib/cni
for plugin in bridge host-local portmap loopback; do
  [ -x "$cni/$plugin" ] || { echo "$cni/$plugin is missing after installing containernetworking-plugins" >&2; exit 1; }
done
for file in /usr/bin/containerd /usr/bin/ctr /usr/sbin/runc; do
  [ -x "$file" ] || { echo "$file is missing after installing its package" >&2; exit 1; }
done
echo "$cni"
