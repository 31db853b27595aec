#!/usr/bin/env bash
# Sets the release version everywhere it is written down, from the one source of truth:
#
#   hack/set-version.sh 0.2.0
#
# Cargo.toml's [package] version (and Cargo.lock) first, then what repeats it for tools that
# cannot read Cargo.toml: the chart's version and appVersion (helm/module-manager/Chart.yaml),
# the kustomize image tag (deploy/base/kustomization.yaml) and the Dockerfile's VERSION default.
# `module-manager --version` and the module_manager_build_info metric read Cargo's version at
# compile time. tests/deploy.rs fails when any of them disagrees. CHANGELOG.md is written by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: hack/set-version.sh x.y.z}
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] || { echo "$version is not x.y.z[-pre]" >&2; exit 1; }

python3 - "$version" <<'PY'
import re, sys
version = sys.argv[1]

def sub(path, pattern, replacement):
    text = open(path).read()
    new, count = re.subn(pattern, replacement, text, count=1, flags=re.M)
    if count != 1:
        sys.exit(f"{path}: no match for {pattern!r}")
    open(path, "w").write(new)

# The root package's version: the first `version =` after `[package]`.
sub("Cargo.toml", r'(^\[package\]\n(?:(?!^\[).*\n)*?version = ")[^"]*(")', rf"\g<1>{version}\g<2>")
sub("helm/module-manager/Chart.yaml", r'^(version: ).*$', rf"\g<1>{version}")
sub("helm/module-manager/Chart.yaml", r'^(appVersion: ).*$', rf'\g<1>"{version}"')
sub("deploy/base/kustomization.yaml", r'^(    newTag: ).*$', rf"\g<1>{version}")
sub("Dockerfile", r'^(ARG VERSION=).*$', rf"\g<1>{version}")
PY
# Cargo.lock records the workspace's own version.
cargo metadata --format-version 1 --offline >/dev/null 2>&1 || cargo metadata --format-version 1 >/dev/null
echo "version $version set; add its section to CHANGELOG.md" >&2
