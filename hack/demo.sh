#!/usr/bin/env bash
# The demo behind `make run`: a local control plane with the CRDs (started by `make cluster-up`),
# the operator running in the background, the example Manifests applied, and a table of their
# states until they settle.
set -euo pipefail
cd "$(dirname "$0")/.."

# What the demo runs (`make run` has built it already: its announcements are shown only on failure).
if ! out=$(hack/build-tools.sh demo 2>&1 >/dev/null); then
  printf '%s\n' "$out" >&2; exit 1
fi
state_dir=${MODULE_MANAGER_CACHE:-$HOME/.cache/module-manager}/cluster
KUBECONFIG=$(cargo run --quiet -p testenv --bin testenv -- status)
export KUBECONFIG

bin=${CARGO_TARGET_DIR:-target}/debug
# A fleet of three replicas (admin APIs on 127.0.0.1:9440, :9441, :9442) splitting the shards.
# Without a StatefulSet every live member counts, and a stopped replica hands its shards over.
# DEMO_ADMIN_PORT moves the three ports (two demos on one machine, each with its own
# MODULE_MANAGER_CACHE).
replicas=3
admin_port=${DEMO_ADMIN_PORT:-9440}
for pid_file in "$state_dir"/operator-*.pid "$state_dir/operator.pid"; do
  [ -f "$pid_file" ] || continue
  if kill -0 "$(cat "$pid_file")" 2>/dev/null; then
    kill "$(cat "$pid_file")"
    while kill -0 "$(cat "$pid_file")" 2>/dev/null; do sleep 0.1; done
  fi
  rm -f "$pid_file"
done
# Local charts need neither, but a demo may point a Manifest at a repository or registry on this
# machine: loopback and plain http are allowed here (a deployment refuses both).
for i in $(seq 0 $((replicas - 1))); do
  setsid "$bin/module-manager" run \
    --replica "module-manager-$i" \
    --chart-root . \
    --renderer "$(hack/build-tools.sh renderer-path)" \
    --helm-home "$state_dir/helm-$i" \
    --admin-address "127.0.0.1:$((admin_port + i))" \
    --allow-private-chart-hosts 127.0.0.1 --allow-insecure-http \
    --log-format json > "$state_dir/operator-$i.log" 2>&1 < /dev/null &
  echo $! > "$state_dir/operator-$i.pid"
done
sleep 1
for i in $(seq 0 $((replicas - 1))); do
  if ! kill -0 "$(cat "$state_dir/operator-$i.pid")" 2>/dev/null; then
    echo "replica module-manager-$i exited at start; its log:" >&2
    cat "$state_dir/operator-$i.log" >&2
    exit 1
  fi
done
echo "fleet of $replicas replicas started; logs: $state_dir/operator-*.log"

"$bin/examples/demo"
# Members publish their load with each renewal (every 5 s): wait for one.
sleep 5
echo
echo "The fleet (module-manager admin shards, last lines):"
"$bin/module-manager" admin --url "http://127.0.0.1:$admin_port" shards | tail -n 7

cat <<MSG

The control plane and the operator keep running. Try:
  export KUBECONFIG=$KUBECONFIG
  kubectl get manifests -A -w
  kubectl describe manifest -n default catalog
  kubectl patch manifest -n default ledger --type merge \
    -p '{"spec":{"chart":{"path":"examples/charts/ledger-v2"}}}'  # its migration Job runs first
  tail -f $state_dir/operator-0.log
  cargo run -q --bin module-manager -- admin --url http://127.0.0.1:$admin_port shards               # who owns which shard
  cargo run -q --bin module-manager -- get -A                        # Ready, Status, chart version, owner
  cargo run -q --bin module-manager -- describe web -n default       # conditions, inventory, Events
  curl -s localhost:$((admin_port + 1))/metrics      # any replica's admin API: /livez /readyz /metrics /v1/...
Stop everything with: make cluster-down
MSG
