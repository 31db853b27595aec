#!/usr/bin/env bash
# Makes the container runtime of the real node (`testenv up --kubelet`, `make e2e`) available from
# Debian's packages and prints the directory of the CNI plugins: containerd (1.6 on bookworm),
# runc, the CNI plugins (bridge, host-local, portmap, loopback), iptables (kube-proxy's rules) and
# conntrack. Idempotent: a second run only checks and prints.
#
# The packages install no running service here: without systemd nothing starts containerd
# (invoke-rc.d finds no runlevel; Docker-style images deny it in /usr/sbin/policy-rc.d). Where
# systemd runs, the system containerd is stopped and disabled: testenv starts its own, with its own
# socket, root and state directories, and stops it with the node (docs/development.md).
set -euo pipefail

. "$(dirname "$0")/apt.sh"
apt_ensure containerd containerd >/dev/null
apt_ensure runc runc >/dev/null
apt_ensure iptables iptables >/dev/null
apt_ensure conntrack conntrack >/dev/null
cni=/usr/lib/cni
if [ ! -x "$cni/bridge" ]; then
  if [ "$(id -u)" -ne 0 ]; then APT_SUDO=(sudo); fi
  echo "the CNI plugins are missing: installing Debian's containernetworking-plugins package" >&2
  "${APT_SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends containernetworking-plugins >&2
  APT_INSTALLED=1
fi
for plugin in bridge host-local portmap loopback; do
  [ -x "$cni/$plugin" ] || { echo "$cni/$plugin is missing after installing containernetworking-plugins" >&2; exit 1; }
done
if [ "$APT_INSTALLED" = 1 ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  "${APT_SUDO[@]}" systemctl disable --now containerd.service >&2 || true
fi
echo "$cni"
