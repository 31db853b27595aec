#!/usr/bin/env bash
# The demo behind `make run`: a local control plane with the CRDs (started by `make cluster-up`),
# the operator running in the background, the example Manifests applied, and a table of their
# states until they settle.
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/versions.env

tools=$(hack/build-tools.sh 2>/dev/null)
state_dir=${MODULE_MANAGER_CACHE:-$HOME/.cache/module-manager}/cluster
KUBECONFIG=$(cargo run --quiet -p testenv --bin testenv -- status)
export KUBECONFIG

cargo build --quiet --bin module-manager --example demo
pid_file="$state_dir/operator.pid"
if [ -f "$pid_file" ] && kill -0 "$(cat "$pid_file")" 2>/dev/null; then
  kill "$(cat "$pid_file")"
  while kill -0 "$(cat "$pid_file")" 2>/dev/null; do sleep 0.1; done
fi
setsid target/debug/module-manager run \
  --replica module-manager-0 \
  --chart-root . \
  --helm "$tools/helm-v$HELM_VERSION/helm" \
  --helm-home "$state_dir/helm" \
  --admin-address 127.0.0.1:9440 \
  --log-format json > "$state_dir/operator.log" 2>&1 < /dev/null &
echo $! > "$pid_file"
sleep 1
if ! kill -0 "$(cat "$pid_file")" 2>/dev/null; then
  echo "the operator exited at start; its log:" >&2
  cat "$state_dir/operator.log" >&2
  exit 1
fi
echo "operator started (pid $(cat "$pid_file")); logs: $state_dir/operator.log"

target/debug/examples/demo

cat <<MSG

The control plane and the operator keep running. Try:
  export KUBECONFIG=$KUBECONFIG
  kubectl get manifests -A -w
  kubectl describe manifest -n default catalog
  tail -f $state_dir/operator.log
  curl -s localhost:9440/metrics      # the operator's admin API: /livez /readyz /metrics
Stop everything with: make cluster-down
MSG
