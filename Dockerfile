# syntax=docker/dockerfile:1
# The module-manager image: the operator as a static binary (musl), and the pinned helm and the
# renderer (renderer/: Helm's packages at the same version) it renders charts with, on
# distroless/static, running as the non-root user 65532. docs/deploy.md.
#
#   docker build -t <registry>/module-manager:<tag> .
#
# Versions: Rust from rust-toolchain.toml (the builder image's tag must match it), helm from
# hack/versions.env (HELM_VERSION, the one place it is pinned), built from its Go module as
# hack/build-tools.sh does.

ARG RUST_IMAGE=docker.io/library/rust:1.95.0-bookworm
ARG GO_IMAGE=docker.io/library/golang:1.26-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

# --- the operator: a static musl binary ---------------------------------------------------------
FROM ${RUST_IMAGE} AS operator
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# ring's C code is compiled by musl-gcc (cc-rs looks for <arch>-linux-musl-gcc otherwise; hack/release.sh
# sets the same variable).
# rust-toolchain.toml first: rustup installs the pinned toolchain and the musl target once.
COPY rust-toolchain.toml ./
RUN rustup target add "$(uname -m)-unknown-linux-musl"
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    target="$(uname -m)-unknown-linux-musl" \
 && export "CC_$(echo "$target" | tr - _)=musl-gcc" \
 && cargo build --release --locked --target "$target" -p module-manager --bin module-manager \
 && cp "target/$target/release/module-manager" /module-manager \
 && mkdir /charts /plugin \
 && ln -s module-manager /plugin/kubectl-module_manager

# --- helm, at the pinned version, from the Go module proxy --------------------------------------
FROM ${GO_IMAGE} AS helm
ENV CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod
COPY hack/versions.env /versions.env
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    . /versions.env \
 && major="${HELM_VERSION%%.*}" \
 && GOBIN=/out go install -trimpath \
      -ldflags "-s -w -X helm.sh/helm/v${major}/internal/version.version=v${HELM_VERSION}" \
      "helm.sh/helm/v${major}/cmd/helm@v${HELM_VERSION}" \
 && /out/helm version --short | grep -qF "v${HELM_VERSION}"

# --- the renderer: Helm's engine as a long-lived child (renderer/, docs/reconcile.md) --------------
FROM ${GO_IMAGE} AS renderer
ENV CGO_ENABLED=0 GOTOOLCHAIN=local
WORKDIR /src
COPY renderer/ ./
COPY hack/versions.env /versions.env
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    . /versions.env \
 && go build -mod=readonly -trimpath \
      -ldflags "-s -w -X helm.sh/helm/v${HELM_VERSION%%.*}/internal/version.version=v${HELM_VERSION}" \
      -o /out/module-manager-renderer . \
 && /out/module-manager-renderer --version | grep -qF "v${HELM_VERSION}"

# --- the image ----------------------------------------------------------------------------------
FROM ${RUNTIME_IMAGE}
# OCI labels. VERSION's default is Cargo.toml's version (tests/deploy.rs checks that they agree;
# hack/set-version.sh bumps both); `make release` prints the build command with both arguments.
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="module-manager" \
      org.opencontainers.image.description="A sharded Kubernetes operator that manages the lifecycle of Helm-chart modules" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=operator /module-manager /usr/local/bin/module-manager
# The kubectl plugin name (`kubectl module-manager …`, docs/cli.md): a symlink to the binary
# (COPY of a directory keeps the link; distroless has no shell to make one).
COPY --from=operator /plugin/ /usr/local/bin/
COPY --from=helm /out/helm /usr/local/bin/helm
COPY --from=renderer /out/module-manager-renderer /usr/local/bin/module-manager-renderer
# The default chart root (--chart-root=/charts): empty. Build an image FROM this one with your
# charts in /charts, or mount a volume there.
COPY --from=operator --chown=65532:65532 /charts /charts
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/module-manager"]
CMD ["--help"]
