//! Locates the pinned control-plane, helm and kustomize binaries that `hack/build-tools.sh` builds.

use std::path::{Path, PathBuf};

use crate::Error;

/// `hack/versions.env`, the one place the tool versions are pinned.
const VERSIONS_ENV: &str = include_str!("../../hack/versions.env");

/// Reads `KEY=value` from `hack/versions.env`.
pub fn pinned_version(key: &str) -> &'static str {
    VERSIONS_ENV
        .lines()
        .filter_map(|line| line.split_once('='))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim())
        .unwrap_or_else(|| panic!("hack/versions.env has no {key}"))
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
    /// `kwok`: simulated nodes and kubelets.
    pub kwok: PathBuf,
    /// kwok's stage definitions (written by `hack/build-tools.sh` from kwok's module).
    pub kwok_stages: PathBuf,
    /// `etcd`.
    pub etcd: PathBuf,
    /// `helm`.
    pub helm: PathBuf,
    /// `kustomize` (renders `deploy/`; like kwok, not required by [`Tools::locate`]: the tests
    /// that use it check it).
    pub kustomize: PathBuf,
}

impl Tools {
    /// Finds every pinned binary in the cache, or says which is missing and how to build it.
    pub fn locate() -> Result<Self, Error> {
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
            kwok: kwok.join("kwok"),
            kwok_stages: kwok.join("stages.yaml"),
            etcd: tools
                .join(format!("etcd-v{}", pinned_version("ETCD_VERSION")))
                .join("etcd"),
            helm: tools
                .join(format!("helm-v{}", pinned_version("HELM_VERSION")))
                .join("helm"),
            kustomize: tools
                .join(format!(
                    "kustomize-v{}",
                    pinned_version("KUSTOMIZE_VERSION")
                ))
                .join("kustomize"),
        };
        for path in [
            &found.kube_apiserver,
            &found.kube_controller_manager,
            &found.etcd,
            &found.helm,
        ] {
            if !path.is_file() {
                return Err(Error::ToolMissing(path.clone()));
            }
        }
        Ok(found)
    }
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
