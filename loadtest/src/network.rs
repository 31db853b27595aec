//! The replicas' own way to the API server for `chaos`'s network faults (`partition`, `slow`):
//! each local replica gets a kubeconfig naming its own endpoint of a [`Proxy`] (loopback,
//! 127.1.0.<ordinal>), which forwards to the control plane's kube-apiserver below TLS and can
//! blackhole the replica or delay every byte. The harness's own clients go straight.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use kube::config::Kubeconfig;

use crate::proxy::Proxy;

/// Whether `faults` (the `--faults` names) needs the proxies: those of `Fault::on_network`
/// (named here, not asked: `faults` uses this module).
pub fn wanted(faults: &[String]) -> bool {
    faults.iter().any(|f| f == "partition" || f == "slow")
}

/// A proxy endpoint per ordinal `0..replicas` to the API server of `kubeconfig`, and a
/// kubeconfig per ordinal naming it (written into `dir`).
pub async fn proxies(
    kubeconfig: &Path,
    replicas: u32,
    dir: &Path,
) -> anyhow::Result<(Proxy, BTreeMap<u32, PathBuf>)> {
    let config = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("read {}", kubeconfig.display()))?;
    let upstream = server_address(&config)?;
    let upstreams = vec![upstream; replicas as usize];
    let proxy = Proxy::start(&upstreams, Duration::ZERO).await?;
    std::fs::create_dir_all(dir)?;
    let mut files = BTreeMap::new();
    for (ordinal, address) in (0..).zip(&proxy.addresses) {
        let path = dir.join(format!("replica-{ordinal}.kubeconfig"));
        let own = through(config.clone(), *address);
        std::fs::write(&path, serde_json::to_string(&own)?)
            .with_context(|| format!("write {}", path.display()))?;
        files.insert(ordinal, path);
    }
    Ok((proxy, files))
}

/// The API server's address in `config`'s first cluster (`https://127.0.0.1:<port>`).
fn server_address(config: &Kubeconfig) -> anyhow::Result<SocketAddr> {
    let server = config
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.server.as_deref())
        .context("the kubeconfig names no server")?;
    https_address(server)
}

/// The address of an API server named `https://<address>:<port>` (a trailing `/` allowed):
/// what a proxy forwards to (here and [`crate::remote::testbed`]).
pub fn https_address(server: &str) -> anyhow::Result<SocketAddr> {
    let address = server
        .strip_prefix("https://")
        .with_context(|| format!("the API server {server:?} is not https://address:port"))?;
    address
        .trim_end_matches('/')
        .parse()
        .with_context(|| format!("the API server {server:?} is not https://address:port"))
}

/// `config` with every cluster reached at `address`, its certificate still checked for the
/// name `localhost` (the API server's serving certificate names it; the address is the
/// proxy's).
fn through(mut config: Kubeconfig, address: SocketAddr) -> Kubeconfig {
    for named in &mut config.clusters {
        if let Some(cluster) = named.cluster.as_mut() {
            cluster.server = Some(format!("https://{address}"));
            cluster.tls_server_name = Some("localhost".to_owned());
        }
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_kubeconfig_names_its_proxy_and_checks_the_server_as_localhost() {
        let config = Kubeconfig::from_yaml(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n",
        )
        .unwrap();
        assert_eq!(
            server_address(&config).unwrap(),
            "127.0.0.1:6443".parse().unwrap()
        );
        let own = through(config, "127.1.0.2:4000".parse().unwrap());
        let cluster = own.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.1.0.2:4000"));
        assert_eq!(cluster.tls_server_name.as_deref(), Some("localhost"));
        assert!(https_address("127.0.0.1:6443").is_err(), "not https://");
        assert!(wanted(&["kill".into(), "slow".into()]));
        assert!(!wanted(&["kill".into(), "apiserver".into()]));
    }
}
