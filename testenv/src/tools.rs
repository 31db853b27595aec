//! Locates the pinned control-plane, helm, renderer, kustomize and cosign binaries that `hack/build-tools.sh` builds.

use std::path::{Path, PathBuf};

use crate::Error;
use crate::renderer_key::pinned;

/// `hack/versions.env`, the one place the tool versions are pinned.
const VERSIONS_ENV: &str = include_str!("../../hack/versions.env");

/// Reads `KEY=value` from `hack/versions.env`.
pub fn pinned_version(key: &str) -> &'static str {
    pinned(VERSIONS_ENV, key).unwrap_or_else(|| panic!("hack/versions.env has no {key}"))
}

/// The root of module-manager's cache: `$MODULE_MANAGER_CACHE`, else `$HOME/.cache/module-manager`.
pub fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("MODULE_MANAGER_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    Path::new(&home).join(".cache/module-manager")
}

/// Paths of the pinned binaries.
#[derive(Clone, Debug)]
pub struct Tools {
    /// `kube-apiserver`.
    pub kube_apiserver: PathBuf,
    /// `kube-controller-manager`.
    pub kube_controller_manager: PathBuf,
    /// `kube-scheduler`.
    pub kube_scheduler: PathBuf,
    /// `kubelet` (the real node, [`crate::Options::kubelet`]; not required by [`Tools::locate`]).
    pub kubelet: PathBuf,
    /// `kube-proxy` (the real node's Service rules).
    pub kube_proxy: PathBuf,
    /// `kwok`: simulated nodes and kubelets.
    pub kwok: PathBuf,
    /// kwok's stage definitions (written by `hack/build-tools.sh` from kwok's module).
    pub kwok_stages: PathBuf,
    /// `etcd`.
    pub etcd: PathBuf,
    /// `helm`.
    pub helm: PathBuf,
    /// `module-manager-renderer`: Helm's engine as a long-lived child (`renderer/`), in
    /// `renderer-<key>/` (see [`renderer_key`]).
    pub renderer: PathBuf,
    /// `kustomize` (renders `deploy/`; like kwok, not required by [`Tools::locate`]: the tests
    /// that use it check it).
    pub kustomize: PathBuf,
    /// `cosign` (signs charts in the signature tests; not required by [`Tools::locate`]).
    pub cosign: PathBuf,
}

impl Tools {
    /// Finds every pinned binary the tests need in the cache (the control plane's, helm and the
    /// renderer), or says which is missing and how to build it.
    pub fn locate() -> Result<Self, Error> {
        let found = Self::paths()?;
        require(&[
            &found.kube_apiserver,
            &found.kube_controller_manager,
            &found.etcd,
            &found.helm,
            &found.renderer,
        ])?;
        Ok(found)
    }

    /// Like [`Tools::locate`], but requires only etcd, kube-apiserver and
    /// kube-controller-manager (what [`crate::ControlPlane::start`] always runs; kube-scheduler
    /// and kwok, which it runs when asked, fail at their spawn if missing). `make run` builds no
    /// helm (`hack/build-tools.sh demo`).
    pub fn locate_control_plane() -> Result<Self, Error> {
        let found = Self::paths()?;
        require(&[
            &found.kube_apiserver,
            &found.kube_controller_manager,
            &found.etcd,
        ])?;
        Ok(found)
    }

    /// Like [`Tools::locate_control_plane`], and also kubelet and kube-proxy (the real node's,
    /// `hack/build-tools.sh` without an argument builds them).
    pub fn node_binaries() -> Result<Self, Error> {
        let found = Self::locate_control_plane()?;
        require(&[&found.kubelet, &found.kube_proxy])?;
        Ok(found)
    }

    /// Where each pinned binary is in the cache, present or not.
    fn paths() -> Result<Self, Error> {
        let tools = cache_root().join("tools");
        let k8s = tools.join(format!(
            "kubernetes-v{}",
            pinned_version("KUBERNETES_VERSION")
        ));
        let kwok = tools.join(format!("kwok-v{}", pinned_version("KWOK_VERSION")));
        let found = Self {
            kube_apiserver: k8s.join("kube-apiserver"),
            kube_controller_manager: k8s.join("kube-controller-manager"),
            kube_scheduler: k8s.join("kube-scheduler"),
            kubelet: k8s.join("kubelet"),
            kube_proxy: k8s.join("kube-proxy"),
            kwok: kwok.join("kwok"),
            kwok_stages: kwok.join("stages.yaml"),
            etcd: tools
                .join(format!("etcd-v{}", pinned_version("ETCD_VERSION")))
                .join("etcd"),
            helm: tools
                .join(format!("helm-v{}", pinned_version("HELM_VERSION")))
                .join("helm"),
            renderer: tools
                .join(format!("renderer-{}", renderer_key(&renderer_source())?))
                .join("module-manager-renderer"),
            kustomize: tools
                .join(format!(
                    "kustomize-v{}",
                    pinned_version("KUSTOMIZE_VERSION")
                ))
                .join("kustomize"),
            cosign: tools
                .join(format!("cosign-v{}", pinned_version("COSIGN_VERSION")))
                .join("cosign"),
        };
        Ok(found)
    }
}

/// Fails with the first of `paths` that is not a file.
fn require(paths: &[&PathBuf]) -> Result<(), Error> {
    match paths.iter().find(|path| !path.is_file()) {
        Some(missing) => Err(Error::ToolMissing((*missing).to_path_buf())),
        None => Ok(()),
    }
}

/// `renderer/` of this repository.
pub fn renderer_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../renderer")
}

/// The renderer's cache key for the pinned helm ([`crate::renderer_key::renderer_key`]).
pub fn renderer_key(src: &Path) -> Result<String, Error> {
    crate::renderer_key::renderer_key(src, pinned_version("HELM_VERSION"))
        .map_err(Error::ToolMissing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_pinned() {
        assert!(pinned_version("KUBERNETES_VERSION").starts_with("1."));
        assert!(pinned_version("ETCD_VERSION").starts_with("3.6."));
        assert!(pinned_version("HELM_VERSION").starts_with("4."));
        assert!(pinned_version("KUSTOMIZE_VERSION").starts_with("5."));
    }
}
