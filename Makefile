# module-manager development tasks. `make help` lists them.
SHELL := /bin/bash
CARGO ?= cargo
BIN := target/debug/module-manager
TESTENV := $(CARGO) run --quiet -p testenv --bin testenv --

.DEFAULT_GOAL := help

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

setup: tools ## Everything the tests need: the pinned Rust toolchain, the tools, promtool, docker-registry, gpg, the real node's containerd/runc/CNI/iproute2, the image's musl-tools and musl target, cargo-deny and cargo-cyclonedx
	@hack/ensure-rust.sh >/dev/null
	@hack/ensure-node-packages.sh >/dev/null
	@hack/ensure-image-tools.sh >/dev/null
	@hack/ensure-promtool.sh >/dev/null
	@hack/ensure-docker-registry.sh >/dev/null
	@hack/ensure-gnupg.sh >/dev/null
	@hack/ensure-cargo-tools.sh >/dev/null

tools: ## Build the pinned etcd, helm, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet, kube-proxy, kwok, kustomize, cosign and the renderer (cached in ~/.cache/module-manager)
	@hack/build-tools.sh >/dev/null

# Only what `make run` needs (the test-only tools are `setup`'s); each tool is announced on stderr.
demo-setup: ## What the demo needs, nothing more: the pinned Rust toolchain, etcd, the control plane, kwok, the renderer, the operator
	@hack/ensure-rust.sh >/dev/null
	@hack/build-tools.sh demo >/dev/null

build: ## Build the workspace
	$(CARGO) build --workspace --all-targets

# The generated CRD lives in deploy/base/crds/ (kustomize reads no file outside deploy/base);
# crds/manifest.yaml and the Helm chart's crds/manifest.yaml are symbolic links to it.
crds: ## Regenerate the CRD (deploy/base/crds/manifest.yaml, linked from crds/) from the Rust types
	$(CARGO) run --quiet --bin module-manager -- crd > deploy/base/crds/manifest.yaml

verify-crds: ## Fail when the CRD differs from what the Rust types generate
	@$(CARGO) run --quiet --bin module-manager -- crd | diff -u deploy/base/crds/manifest.yaml - \
		|| { echo "deploy/base/crds/manifest.yaml is stale: run 'make crds'"; exit 1; }
	@[ "$$(readlink crds/manifest.yaml)" = ../deploy/base/crds/manifest.yaml ] \
		|| { echo "crds/manifest.yaml must be a link to ../deploy/base/crds/manifest.yaml"; exit 1; }

fmt: ## Format the code
	$(CARGO) fmt --all

lint: ## Format check, module layers (no cycles), clippy with warnings as errors, supply chain (deny.toml)
	$(CARGO) fmt --all -- --check
	@hack/check-layers.py
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	@PATH="$$(hack/ensure-cargo-tools.sh):$$PATH" $(CARGO) deny --locked check --hide-inclusion-graph licenses bans sources

test: setup lint verify-crds ## Everything CI checks: format, clippy, CRD drift, unit and integration tests
	$(CARGO) test --workspace --no-fail-fast

# The test builds the image itself (tests/e2e.rs holds the one recipe) and prints its time.
e2e: setup ## End to end on a real node (root): the image without an engine, deploy/ applied, 3 pods Ready, examples Ready, a replica force-deleted (tests/e2e.rs)
	$(CARGO) test --test e2e -- --nocapture

bench: setup ## Benchmarks on the real control plane and helm (figures in docs/benchmarks.md)
	$(CARGO) bench --bench reconcile
	$(CARGO) bench --bench render

measure-fleet: setup ## Fleet figures: idle Lease writes (S=256, N=5) and memory of 1 of 4 replicas vs 1 (minutes)
	$(CARGO) test --release --test fleet -- --ignored --nocapture measure_

SCENARIO ?= all
ARGS ?=
loadtest: setup ## Load test (docs/loadtest.md): `make loadtest SCENARIO=chaos ARGS="--replicas 4"`; default every scenario
	$(CARGO) build --release -p module-manager -p loadtest --bins
	@if [ "$(SCENARIO)" = all ]; then \
		for s in basic rolling-update rebalance chaos scale-out mttp remote hostile; do \
			$${CARGO_TARGET_DIR:-target}/release/loadtest $$s $(ARGS) || exit $$?; done; \
	else $${CARGO_TARGET_DIR:-target}/release/loadtest $(SCENARIO) $(ARGS); fi

VERSION ?=
IMAGE ?= module-manager
release: setup ## Build a release into dist/: `make release VERSION=x.y.z [IMAGE=registry/module-manager]` (docs/development.md)
	@VERSION="$(VERSION)" IMAGE="$(IMAGE)" hack/release.sh

cluster-up: demo-setup ## Start a local control plane with the CRDs installed; prints the kubeconfig path
	@$(TESTENV) up --crds crds/manifest.yaml

cluster-down: ## Stop the operator started by `make run` and the local control plane
	@for pid in $${MODULE_MANAGER_CACHE:-$$HOME/.cache/module-manager}/cluster/operator*.pid; do \
		if [ -f $$pid ]; then kill $$(cat $$pid) 2>/dev/null || true; rm -f $$pid; fi; done
	@$(TESTENV) down

run: cluster-up ## The demo: control plane, CRDs, the operator and the example Manifests
	@hack/demo.sh

.PHONY: help setup tools demo-setup build crds verify-crds fmt lint test e2e bench measure-fleet loadtest release cluster-up cluster-down run
