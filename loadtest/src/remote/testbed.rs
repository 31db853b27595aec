//! The test bed of the `remote` scenario: many clusters on one machine. `--target-apiservers`
//! real control planes (etcd, kube-apiserver, kube-controller-manager with the Deployment,
//! ReplicaSet and ServiceAccount controllers, so Deployments roll out) hold the targets; every target is a
//! namespace `t-<index>` on one of them (round robin) with a ServiceAccount of its own, allowed
//! everything in that namespace and to read Namespaces; its credential is a token of that
//! ServiceAccount (TokenRequest); its endpoint is its own address and port of the [`Proxy`].
//! So each target costs the operator what a real cluster does: its own connections, TLS
//! sessions, discovery and credential. The kubeconfig names the server by the proxy's address
//! and verifies the API server's certificate as `localhost` (`tls-server-name`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::load::target_name;
use crate::phase::harness_client;
use crate::proxy::Proxy;

/// The ServiceAccount every target's credential belongs to (in the target's namespace).
pub const SERVICE_ACCOUNT: &str = "module-manager";
/// The ClusterRole bound in every target namespace: what the operator may do there.
const TARGET_ROLE: &str = "loadtest-target";
/// The ClusterRole every ServiceAccount gets: reading Namespaces (the operator checks that the
/// target namespace exists).
const NAMESPACE_READER: &str = "loadtest-target-namespace-reader";
/// Requests at once while the targets are set up.
const SETUP_PARALLELISM: usize = 32;
/// Longest one token renewal (a TokenRequest and a Secret write) may take.
const RENEWAL_TIMEOUT: Duration = Duration::from_secs(30);

/// Keeps `error` unless an earlier one is kept.
fn keep_first(kept: &Mutex<Option<String>>, error: String) {
    kept.lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert(error);
}

/// One simulated cluster.
#[derive(Clone, Debug)]
pub struct Target {
    /// `t-<index>`: its namespace on its API server, its Secret's name on the local cluster,
    /// and the namespace its modules are installed into.
    pub name: String,
    /// Which of the test bed's API servers holds it.
    pub apiserver: usize,
    /// The user its requests are made as (`system:serviceaccount:<name>:module-manager`).
    pub user: String,
    /// Its kubeconfig (its own endpoint and token), as last renewed ([`TestBed::renew_tokens`]).
    kubeconfig: Arc<Mutex<String>>,
}

impl Target {
    /// Its kubeconfig now.
    pub fn kubeconfig(&self) -> String {
        self.kubeconfig
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Tokens renewed and renewals that failed.
#[derive(Debug, Default)]
pub struct Renewals {
    pub renewed: AtomicU64,
    pub failed: AtomicU64,
}

/// The target control planes, the proxy and the targets.
pub struct TestBed {
    pub apiservers: Vec<testenv::ControlPlane>,
    /// Admin clients of the API servers.
    pub admins: Vec<Client>,
    pub proxy: Proxy,
    pub targets: Vec<Target>,
    /// The renewals of the targets' tokens ([`TestBed::renew_tokens`]).
    pub renewals: Arc<Renewals>,
    /// When the targets' first tokens were requested (at most this old).
    issued: std::time::Instant,
    renewer: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// What the test bed is made of.
#[derive(Clone, Debug)]
pub struct Shape {
    pub targets: usize,
    pub apiservers: usize,
    /// Added to every connection's round trip by the proxy.
    pub latency: Duration,
    /// Lifetime of each target's token.
    pub token_seconds: i64,
}

impl TestBed {
    /// Starts the API servers and the proxy and sets up every target.
    pub async fn start(shape: &Shape) -> anyhow::Result<Self> {
        anyhow::ensure!(
            shape.apiservers > 0,
            "--target-apiservers must be at least 1"
        );
        raise_file_limit();
        let issued = std::time::Instant::now();
        let apiservers =
            futures::future::try_join_all((0..shape.apiservers).map(|_| start_apiserver()))
                .await
                .context("start the targets' API servers")?;
        let mut admins = Vec::new();
        let mut upstreams = Vec::new();
        let mut cas = Vec::new();
        for control_plane in &apiservers {
            let admin = harness_client(control_plane.kubeconfig()).await?;
            install_roles(&admin).await?;
            admins.push(admin);
            upstreams.push(crate::network::https_address(
                &control_plane.endpoints().server,
            )?);
            cas.push(certificate_authority(control_plane.kubeconfig())?);
        }
        let of_target: Vec<usize> = (0..shape.targets).map(|i| i % shape.apiservers).collect();
        let proxy = Proxy::start(
            &of_target.iter().map(|&k| upstreams[k]).collect::<Vec<_>>(),
            shape.latency,
        )
        .await?;
        let targets = stream::iter(0..shape.targets)
            .map(|index| {
                let k = of_target[index];
                set_up_target(
                    &admins[k],
                    index,
                    k,
                    proxy.addresses[index],
                    &cas[k],
                    shape.token_seconds,
                )
            })
            .buffered(SETUP_PARALLELISM)
            .try_collect()
            .await?;
        Ok(Self {
            apiservers,
            admins,
            proxy,
            targets,
            renewals: Arc::default(),
            issued,
            renewer: Mutex::default(),
        })
    }

    /// Renews every target's token at half its life, as a renewer next to a real fleet would
    /// (docs/operations.md § Expiring target credentials): a new TokenRequest of
    /// `token_seconds`, written into the target's kubeconfig and its Secret in `namespace` of
    /// the local cluster; until [`TestBed::stop`].
    pub fn renew_tokens(&self, local: Client, namespace: String, token_seconds: i64) {
        let targets = self.targets.clone();
        let admins = self.admins.clone();
        let renewals = self.renewals.clone();
        let every = Duration::from_secs((token_seconds.max(2) / 2).unsigned_abs());
        // Half a life after the first tokens were requested, then every half life.
        let mut next = tokio::time::Instant::from_std(self.issued) + every;
        let task = tokio::spawn(async move {
            let secrets = Api::<Secret>::namespaced(local, &namespace);
            loop {
                tokio::time::sleep_until(next).await;
                next += every;
                let first_error = Mutex::new(None);
                stream::iter(&targets)
                    .for_each_concurrent(SETUP_PARALLELISM, |target| {
                        let (admin, secrets) = (&admins[target.apiserver], &secrets);
                        let (renewals, first_error) = (&renewals, &first_error);
                        async move {
                            let renewed = renew(admin, secrets, target, token_seconds);
                            let counter = match tokio::time::timeout(RENEWAL_TIMEOUT, renewed).await
                            {
                                Ok(Ok(())) => &renewals.renewed,
                                Ok(Err(e)) => {
                                    keep_first(first_error, format!("{e:#}"));
                                    &renewals.failed
                                }
                                Err(_) => {
                                    keep_first(
                                        first_error,
                                        format!("target {}: timed out", target.name),
                                    );
                                    &renewals.failed
                                }
                            };
                            counter.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                    .await;
                if let Some(error) = first_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
                    eprintln!(
                        "loadtest: renewing the targets' tokens failed (first of this round): {error}"
                    );
                }
            }
        });
        let mut renewer = self.renewer.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = renewer.replace(task) {
            old.abort();
        }
    }

    /// Writes every target's kubeconfig Secret (named as the target) into `namespace` of the
    /// local cluster.
    pub async fn put_secrets(&self, client: &Client, namespace: &str) -> anyhow::Result<()> {
        let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
        stream::iter(&self.targets)
            .map(|target| {
                let secrets = secrets.clone();
                async move {
                    let secret: Secret = serde_json::from_value(json!({
                        "metadata": {"name": target.name},
                        "stringData": {"kubeconfig": target.kubeconfig()},
                    }))?;
                    secrets
                        .create(&PostParams::default(), &secret)
                        .await
                        .with_context(|| format!("create the Secret of target {}", target.name))?;
                    anyhow::Ok(())
                }
            })
            .buffer_unordered(SETUP_PARALLELISM)
            .try_collect::<()>()
            .await
    }

    /// Stops the token renewals and the API servers.
    pub fn stop(&self) {
        if let Some(renewer) = self
            .renewer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            renewer.abort();
        }
        for control_plane in &self.apiservers {
            control_plane.stop();
        }
    }
}

async fn start_apiserver() -> anyhow::Result<testenv::ControlPlane> {
    Ok(testenv::ControlPlane::start(testenv::Options {
        controller_manager: true,
        // The ServiceAccount controller too: testenv waits for its `default` ServiceAccount.
        controllers: Some("deployment,replicaset,serviceaccount".into()),
        // Requests per target come from the audit log (the user is the target's credential).
        audit_log: true,
        ..Default::default()
    })
    .await?)
}

/// The API server's CA (base64 PEM, as kubeconfigs carry it) from its admin kubeconfig.
fn certificate_authority(kubeconfig: &std::path::Path) -> anyhow::Result<String> {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig)?;
    kubeconfig
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.certificate_authority_data.clone())
        .context("the admin kubeconfig has no certificate-authority-data")
}

/// The roles every target's ServiceAccount is bound to.
async fn install_roles(admin: &Client) -> anyhow::Result<()> {
    let roles = Api::<ClusterRole>::all(admin.clone());
    for role in [
        json!({
            "metadata": {"name": TARGET_ROLE},
            "rules": [{"apiGroups": ["", "apps"], "resources": ["*"], "verbs": ["*"]}],
        }),
        json!({
            "metadata": {"name": NAMESPACE_READER},
            "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}],
        }),
    ] {
        roles
            .create(&PostParams::default(), &serde_json::from_value(role)?)
            .await
            .context("create the targets' ClusterRoles")?;
    }
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": NAMESPACE_READER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAMESPACE_READER},
        "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "system:serviceaccounts"}],
    }))?;
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .context("bind the namespace reader")?;
    Ok(())
}

/// Creates target `index`'s namespace, ServiceAccount and RoleBinding on its API server and a
/// token; returns the target with its kubeconfig.
async fn set_up_target(
    admin: &Client,
    index: usize,
    apiserver: usize,
    endpoint: SocketAddr,
    ca: &str,
    token_seconds: i64,
) -> anyhow::Result<Target> {
    let name = target_name(index);
    let context = || format!("set up target {name}");
    let post = PostParams::default();
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    Api::<Namespace>::all(admin.clone())
        .create(&post, &namespace)
        .await
        .with_context(context)?;
    let accounts = Api::<ServiceAccount>::namespaced(admin.clone(), &name);
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": SERVICE_ACCOUNT}}))?;
    accounts
        .create(&post, &account)
        .await
        .with_context(context)?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": SERVICE_ACCOUNT},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": TARGET_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": name}],
    }))?;
    Api::<RoleBinding>::namespaced(admin.clone(), &name)
        .create(&post, &binding)
        .await
        .with_context(context)?;
    let token = request_token(admin, &name, token_seconds).await?;
    let kubeconfig = kubeconfig(&name, endpoint, ca, &token);
    Ok(Target {
        user: format!("system:serviceaccount:{name}:{SERVICE_ACCOUNT}"),
        name,
        apiserver,
        kubeconfig: Arc::new(Mutex::new(kubeconfig)),
    })
}

/// A token of target `name`'s ServiceAccount valid for `seconds` (TokenRequest).
async fn request_token(admin: &Client, name: &str, seconds: i64) -> anyhow::Result<String> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(seconds),
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(admin.clone(), name)
        .create_token_request(SERVICE_ACCOUNT, &PostParams::default(), &request)
        .await
        .with_context(|| format!("target {name}: request a token"))?
        .status
        .and_then(|s| s.token)
        .with_context(|| format!("target {name}: the TokenRequest returned no token"))
}

/// Renews `target`'s token: a new one into its kubeconfig and its Secret (a merge patch of
/// `stringData`, as `kubectl apply` of a renewer would write it).
async fn renew(
    admin: &Client,
    secrets: &Api<Secret>,
    target: &Target,
    token_seconds: i64,
) -> anyhow::Result<()> {
    let token = request_token(admin, &target.name, token_seconds).await?;
    let kubeconfig = with_token(&target.kubeconfig(), &token)?;
    let patch = json!({"stringData": {"kubeconfig": kubeconfig}});
    secrets
        .patch(&target.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("target {}: write the renewed Secret", target.name))?;
    *target.kubeconfig.lock().unwrap_or_else(|e| e.into_inner()) = kubeconfig;
    Ok(())
}

/// `kubeconfig` (as [`kubeconfig`] writes it) with `token` as its user's token.
fn with_token(kubeconfig: &str, token: &str) -> anyhow::Result<String> {
    let mut config: serde_json::Value = serde_json::from_str(kubeconfig)?;
    config["users"][0]["user"]["token"] = json!(token);
    Ok(serde_json::to_string(&config)?)
}

/// A kubeconfig for a target at `endpoint`: the API server's certificate is checked against
/// `ca` for the name `localhost` (the address is the proxy's, not the server's).
pub fn kubeconfig(name: &str, endpoint: SocketAddr, ca: &str, token: &str) -> String {
    serde_json::to_string(&json!({
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": name,
        "contexts": [{"name": name, "context": {"cluster": name, "user": SERVICE_ACCOUNT}}],
        "clusters": [{"name": name, "cluster": {
            "server": format!("https://{endpoint}"),
            "certificate-authority-data": ca,
            "tls-server-name": "localhost",
        }}],
        "users": [{"name": SERVICE_ACCOUNT, "user": {"token": token}}],
    }))
    .expect("a kubeconfig serializes")
}

/// Many targets mean many sockets (a listener per target, two descriptors per proxied
/// connection, the replicas' connections): the soft limit on open files goes up to the hard
/// one, and as root both to 1,048,576 where the kernel allows. The replicas inherit it.
fn raise_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write and read the struct passed; no other preconditions.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return;
        }
        let wanted = libc::rlimit {
            rlim_cur: 1 << 20,
            rlim_max: limit.rlim_max.max(1 << 20),
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) != 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_targets_kubeconfig_names_its_endpoint_and_verifies_as_localhost() {
        let text = kubeconfig("t-00007", "127.1.0.7:40001".parse().unwrap(), "Q0E=", "tok");
        let parsed: kube::config::Kubeconfig = serde_yaml_ng::from_str(&text).unwrap();
        let cluster = parsed.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.1.0.7:40001"));
        assert_eq!(cluster.tls_server_name.as_deref(), Some("localhost"));
        assert_eq!(parsed.current_context.as_deref(), Some("t-00007"));
        assert_eq!(target_name(7), "t-00007");
    }
}
