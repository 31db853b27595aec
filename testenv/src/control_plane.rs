//! Starts and stops one control plane: etcd, kube-apiserver and optionally kube-controller-manager.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::pki::Pki;
use crate::process::{Lifetime, Paused, Proc};
use crate::tools::Tools;

/// How long kube-apiserver may take to report ready (a cold start on 2 busy cores takes seconds).
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a stopping component may take before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// The node Lease kwok holds for each simulated node: 40 s, renewed every quarter of it (10 s),
/// as a kubelet does. Without Leases (kwok's default) the node lifecycle controller only sees
/// kwok's status heartbeat, which its stages write every 10 minutes, and marks the nodes
/// NotReady after every grace period (docs/development.md, "Simulated nodes").
const NODE_LEASE_DURATION_SECONDS: u32 = 40;
/// kube-controller-manager's `--node-monitor-grace-period` unless [`Options`] says otherwise:
/// how long a node's Lease may go unrenewed before the node is NotReady. 120 s (the default is
/// 50 s) lets eleven renewals in a row be late, for a machine whose two cores the fleet, the load
/// test and the control plane share (docs/development.md, "Simulated nodes").
pub const NODE_MONITOR_GRACE_PERIOD: Duration = Duration::from_secs(120);
/// Our kwok Stage that makes Pods Ready again after their node recovered.
const POD_READY_AGAIN_STAGE: &str = include_str!("../kwok/pod-ready-again.yaml");

/// What to start.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Also run kube-controller-manager (garbage collection, namespace deletion, Deployments'
    /// ReplicaSets, default ServiceAccounts).
    pub controller_manager: bool,
    /// kube-controller-manager's `--controllers` (default `*`). Tests that play the workload
    /// controllers themselves (writing Deployment status) leave those out.
    pub controllers: Option<String>,
    /// Simulated nodes: with more than zero, kube-scheduler and kwok run too, and this many
    /// fake Nodes are created, so that Pods are scheduled and reported Running and workloads
    /// really roll out (implies `controller_manager`).
    pub simulated_nodes: usize,
    /// kube-controller-manager's `--node-monitor-grace-period`; [`NODE_MONITOR_GRACE_PERIOD`]
    /// when `None`. A test that stops kwok to see its nodes go NotReady shortens it.
    pub node_monitor_grace_period: Option<Duration>,
    /// YAML files of CustomResourceDefinitions to install and wait for.
    pub crd_files: Vec<PathBuf>,
    /// Directory for certificates, data and logs; a new temporary directory when `None`.
    pub dir: Option<PathBuf>,
    /// Whether the processes outlive this one.
    pub detached: bool,
    /// Write an audit log (`audit.log` in the working directory, one JSON event per finished
    /// request, level Metadata: user, user agent, verb, resource), so that a measurement can
    /// tell the clients' requests apart ([`ControlPlane::audit_log`]). Costs the API server a
    /// little CPU per request; off by default.
    pub audit_log: bool,
    /// kube-apiserver feature gates to turn on (`--feature-gates=<gate>=true,…`), e.g.
    /// [`SHARDED_LIST_AND_WATCH`] for server-side sharded watches.
    pub feature_gates: Vec<String>,
    /// Also run a real node (containerd, kubelet, kube-proxy: [`crate::node`]): pods run for
    /// real and reach the API server through the `kubernetes` Service. Needs root and
    /// `hack/ensure-node-packages.sh`; implies the controller-manager and the scheduler. The
    /// API server then listens on the node's address ([`crate::node::NODE_IP`]), not on
    /// 127.0.0.1, and the simulated nodes, if any, are tainted `kwok.x-k8s.io/node=fake:NoSchedule`
    /// so that only pods tolerating it land there.
    pub kubelet: bool,
    /// OCI image archives to import into the real node's containerd before kubelet starts
    /// (`hack/build-image.sh`); more with [`ControlPlane::import_image`].
    pub images: Vec<PathBuf>,
}

/// The alpha feature gate of the API server's sharded list and watch (KEP-5866, Kubernetes
/// 1.36): `shardSelector` on list and watch requests.
pub const SHARDED_LIST_AND_WATCH: &str = "ShardedListAndWatch";

/// The audit policy of [`Options::audit_log`]: every request at level Metadata, logged once
/// when its response is complete (a watch when it ends).
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: Metadata
";

/// Where a running control plane is and what it runs; written as `state.json` for `testenv down`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Endpoints {
    /// Admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// `https://127.0.0.1:<port>`.
    pub server: String,
    /// Working directory (certificates, etcd data, logs).
    pub dir: PathBuf,
    /// Processes by program name, in start order: those running when the value was taken
    /// ([`ControlPlane::endpoints`], [`ControlPlane::detach`]: a process started again by
    /// [`ControlPlane::start_process`] under its new pid, one stopped left out).
    pub pids: Vec<(String, u32)>,
    /// Time from starting etcd to kube-apiserver's `/readyz` answering `ok`.
    pub apiserver_ready_after_ms: u128,
    /// The real node, when it runs one (`testenv down` tears it down).
    #[serde(default)]
    pub node: Option<crate::node::NodeState>,
}

/// A running control plane. Dropping it stops its processes (unless detached) and removes its
/// temporary directory.
pub struct ControlPlane {
    endpoints: Endpoints,
    /// Its certificates, to issue client certificates ([`ControlPlane::client_certificate`]).
    pki: Pki,
    // Behind mutexes so that the shared control plane (a `static`) can be stopped at exit.
    procs: Mutex<Vec<Proc>>,
    /// The real node's processes ([`Options::kubelet`]), stopped before the control plane's.
    node: Mutex<Option<crate::node::Node>>,
    /// How to start etcd and kube-apiserver again, on their ports and data
    /// ([`ControlPlane::stop_process`], [`ControlPlane::start_process`]).
    restartable: Vec<(&'static str, Spec)>,
    /// etcd's client port, for its `/health` after a restart.
    etcd_port: u16,
    tempdir: Mutex<Option<tempfile::TempDir>>,
}

/// How [`ControlPlane::stop_process`] stops a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// SIGKILL: a crash (open connections reset, no request finished).
    Kill,
    /// SIGTERM and up to 30 s for the process's own shutdown (kube-apiserver stops listening
    /// at once, then finishes the requests in flight), then SIGKILL, as a kubelet does with a
    /// static pod's default grace period.
    Graceful,
}

/// How long a graceful stop may take before SIGKILL: a pod's default
/// `terminationGracePeriodSeconds`. Measured (2026-12-07): with a fleet's watches open,
/// kube-apiserver 1.36 stopped listening at once and had not exited 60 s after SIGTERM.
const GRACEFUL_STOP: Duration = Duration::from_secs(30);

/// A program and its arguments, to start it again as it was started.
#[derive(Clone, Debug)]
struct Spec {
    program: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    lifetime: Lifetime,
}

impl Spec {
    /// Starts it, its output to its log (appended to when `again`).
    fn spawn(&self, name: &'static str, again: bool) -> Result<Proc, Error> {
        let mut command = Command::new(&self.program);
        command.args(&self.args);
        if again {
            Proc::spawn_appending(name, command, &self.log, self.lifetime)
        } else {
            Proc::spawn(name, command, &self.log, self.lifetime)
        }
    }
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver (and kube-controller-manager if asked), waits for
    /// `/readyz`, and installs the CRDs.
    pub async fn start(options: Options) -> Result<Self, Error> {
        let tools = Tools::locate_control_plane()?;
        // Ports are picked by binding :0 and releasing; another process may take one in between.
        // That shows up as "address already in use" and is worth another attempt.
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::start_once(&tools, &options).await {
                Err(e) if attempt < 3 && e.to_string().contains("address already in use") => {
                    tracing::warn!(attempt, "control plane port taken, retrying: {e}");
                }
                result => return result,
            }
        }
    }

    async fn start_once(tools: &Tools, options: &Options) -> Result<Self, Error> {
        let (tempdir, dir) = match &options.dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
                (None, dir.clone())
            }
            None => {
                let base = std::env::temp_dir().join("module-manager-testenv");
                std::fs::create_dir_all(&base).map_err(|e| Error::io("create temp dir", e))?;
                remove_stale_dirs(&base);
                let t = tempfile::Builder::new()
                    .prefix(&format!("{}-", std::process::id()))
                    .tempdir_in(&base)
                    .map_err(|e| Error::io("create temp dir", e))?;
                let path = t.path().to_owned();
                (Some(t), path)
            }
        };
        let lifetime = if options.detached {
            Lifetime::Detached
        } else {
            Lifetime::TiedToThisProcess
        };
        // Dropped on any error below (before `tempdir`, declared earlier): the machine is left
        // as it was, and the node's mounts are gone before the run directory is removed.
        let mut host_guard = if options.kubelet {
            Some(crate::node::prepare_host(&dir)?)
        } else {
            None
        };
        let host = if options.kubelet {
            crate::node::NODE_IP.to_string()
        } else {
            "127.0.0.1".to_owned()
        };
        let pki = if options.kubelet {
            Pki::generate_with(
                &[crate::node::NODE_IP, crate::node::KUBERNETES_SERVICE_IP],
                &[
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                ],
            )?
        } else {
            Pki::generate()?
        };
        let files = write_pki(&dir, &pki)?;
        let [
            etcd_client,
            etcd_peer,
            apiserver_port,
            kcm_port,
            scheduler_port,
            kwok_port,
        ] = free_ports()?;

        let started = Instant::now();
        let mut procs = Vec::new();
        let etcd = Spec {
            program: tools.etcd.clone(),
            args: etcd_args(&dir, etcd_client, etcd_peer),
            log: dir.join("etcd.log"),
            lifetime,
        };
        procs.push(etcd.spawn("etcd", false)?);
        let apiserver = Spec {
            program: tools.kube_apiserver.clone(),
            args: apiserver_args(
                options,
                (&dir, &files, &pki),
                &host,
                (etcd_client, apiserver_port),
            )?,
            log: dir.join("kube-apiserver.log"),
            lifetime,
        };
        procs.push(apiserver.spawn("kube-apiserver", false)?);

        let kubeconfig = dir.join("admin.kubeconfig");
        let server = format!("https://{host}:{apiserver_port}");
        write(
            &kubeconfig,
            &pki.kubeconfig(
                &server,
                "testenv-admin",
                &pki.admin_cert_pem,
                &pki.admin_key_pem,
            ),
        )?;
        let client = client_for(&kubeconfig).await?;
        let procs = Mutex::new(procs);
        wait_ready(&client, &procs, "kube-apiserver /readyz").await?;
        let mut procs = procs.into_inner().unwrap_or_else(|e| e.into_inner());
        let apiserver_ready_after_ms = started.elapsed().as_millis();

        if options.controller_manager || options.simulated_nodes > 0 || options.kubelet {
            let mut kcm = Command::new(&tools.kube_controller_manager);
            kcm.args([
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--authentication-kubeconfig={}", kubeconfig.display()),
                format!("--authorization-kubeconfig={}", kubeconfig.display()),
                "--leader-elect=false".to_owned(),
                // The default client limit (20 requests/s) makes the Deployment controller, not
                // the operator under test, the bottleneck of a load test (the thesis ran it at
                // 2000/s for the same reason).
                "--kube-api-qps=1000".to_owned(),
                "--kube-api-burst=2000".to_owned(),
                format!(
                    "--controllers={}",
                    options.controllers.as_deref().unwrap_or("*")
                ),
                "--use-service-account-credentials=false".to_owned(),
                format!("--root-ca-file={}", files.serving_ca.display()),
                format!(
                    "--service-account-private-key-file={}",
                    files.service_account_key.display()
                ),
                "--bind-address=127.0.0.1".to_owned(),
                format!("--secure-port={kcm_port}"),
                format!("--cert-dir={}", dir.join("kcm").display()),
                format!(
                    "--node-monitor-grace-period={}s",
                    options
                        .node_monitor_grace_period
                        .unwrap_or(NODE_MONITOR_GRACE_PERIOD)
                        .as_secs()
                ),
            ]);
            procs.push(Proc::spawn(
                "kube-controller-manager",
                kcm,
                &dir.join("kube-controller-manager.log"),
                lifetime,
            )?);
            wait_controller_manager(&client, &mut procs).await?;
        }

        if options.simulated_nodes > 0 || options.kubelet {
            let mut scheduler = Command::new(&tools.kube_scheduler);
            scheduler.args([
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--authentication-kubeconfig={}", kubeconfig.display()),
                format!("--authorization-kubeconfig={}", kubeconfig.display()),
                "--leader-elect=false".to_owned(),
                "--bind-address=127.0.0.1".to_owned(),
                format!("--secure-port={scheduler_port}"),
            ]);
            procs.push(Proc::spawn(
                "kube-scheduler",
                scheduler,
                &dir.join("kube-scheduler.log"),
                lifetime,
            )?);
        }
        if options.simulated_nodes > 0 {
            procs.push(start_kwok(tools, &dir, &kubeconfig, kwok_port, lifetime)?);
            create_simulated_nodes(&client, options.simulated_nodes, options.kubelet).await?;
        }
        let node = match host_guard.take() {
            Some(guard) => Some(
                start_node(
                    tools, options, &pki, &server, &dir, &files, &client, lifetime, guard,
                )
                .await?,
            ),
            None => None,
        };

        for file in &options.crd_files {
            install_crds(&client, file).await?;
        }

        let endpoints = Endpoints {
            kubeconfig,
            server,
            dir: dir.clone(),
            pids: procs
                .iter()
                .chain(node.iter().flat_map(|n| n.procs.iter()))
                .map(|p| (p.name().to_owned(), p.pid()))
                .collect(),
            apiserver_ready_after_ms,
            node: node.as_ref().map(|n| n.state().clone()),
        };
        tracing::info!(server = %endpoints.server, ready_ms = apiserver_ready_after_ms, "control plane ready");
        Ok(Self {
            endpoints,
            pki,
            procs: Mutex::new(procs),
            node: Mutex::new(node),
            restartable: vec![("etcd", etcd), ("kube-apiserver", apiserver)],
            etcd_port: etcd_client,
            tempdir: Mutex::new(tempdir),
        })
    }

    /// A client certificate (PEM) and its key for `user` (in `group`, if any) that this API
    /// server accepts while now is within `valid` — a range that may have begun long ago.
    pub fn client_certificate(
        &self,
        user: &str,
        group: Option<&str>,
        valid: std::ops::Range<std::time::SystemTime>,
    ) -> Result<(String, String), Error> {
        self.pki.client_certificate(user, group, valid)
    }

    /// Where it runs, with the processes running now.
    pub fn endpoints(&self) -> Endpoints {
        Endpoints {
            pids: self.running_pids(),
            ..self.endpoints.clone()
        }
    }

    /// The control plane's running processes, then the real node's.
    fn running_pids(&self) -> Vec<(String, u32)> {
        let procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        let node = self.node.lock().unwrap_or_else(|e| e.into_inner());
        procs
            .iter()
            .filter(|p| !p.is_stopped())
            .chain(node.iter().flat_map(|n| n.procs.iter()))
            .map(|p| (p.name().to_owned(), p.pid()))
            .collect()
    }

    /// The pid of the running `program` (`"kwok"`, `"kube-controller-manager"`, …): none
    /// while it is stopped ([`ControlPlane::stop_process`]).
    pub fn pid(&self, program: &str) -> Option<u32> {
        self.procs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|p| p.name() == program && !p.is_stopped())
            .map(Proc::pid)
    }

    /// Stops `program` (`"etcd"` or `"kube-apiserver"`), killed or gracefully, leaving its
    /// port and data for [`ControlPlane::start_process`]. What else runs (the other of the
    /// two, kube-controller-manager, kwok, the caller's clients) sees it gone. Waits until it
    /// exited (a graceful stop up to 30 s, on a blocking thread, the processes' lock not
    /// held); returns whether SIGKILL was needed (a kill: always).
    pub async fn stop_process(&self, program: &str, how: Stop) -> Result<bool, Error> {
        let (pid, child) = {
            let mut procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
            let proc = procs
                .iter_mut()
                .find(|p| p.name() == program && !p.is_stopped())
                .filter(|_| self.spec(program).is_some())
                .ok_or_else(|| Error::NoSuchProcess(program.to_owned()))?;
            (proc.pid(), proc.take_child())
        };
        let Some(mut child) = child else {
            return Ok(false);
        };
        let killed = tokio::task::spawn_blocking(move || {
            let killed = match how {
                Stop::Kill => {
                    let _ = child.kill();
                    true
                }
                Stop::Graceful => {
                    crate::process::terminate_pid(pid, GRACEFUL_STOP).unwrap_or(false)
                }
            };
            let _ = child.wait();
            killed
        })
        .await
        .map_err(|e| Error::io(format!("stop {program}"), std::io::Error::other(e)))?;
        Ok(killed)
    }

    /// Starts a stopped `program` again with its arguments (the same port, data directory,
    /// certificates; its log appended to) and waits until it is ready: etcd's own `/health`
    /// first when it is etcd, then kube-apiserver's `/readyz` (which checks etcd too).
    pub async fn start_process(&self, program: &str) -> Result<(), Error> {
        let spec = self
            .spec(program)
            .ok_or_else(|| Error::NoSuchProcess(program.to_owned()))?;
        {
            let mut procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
            let slot = procs
                .iter_mut()
                .find(|p| p.name() == program && p.is_stopped())
                .ok_or_else(|| Error::NoSuchProcess(format!("stopped {program}")))?;
            *slot = spec.spawn(slot.name(), true)?;
        }
        if program == "etcd" {
            self.wait_etcd_health().await?;
        }
        let client = self.client().await?;
        wait_ready(
            &client,
            &self.procs,
            "kube-apiserver /readyz after a restart",
        )
        .await
    }

    fn spec(&self, program: &str) -> Option<&Spec> {
        self.restartable
            .iter()
            .find(|(name, _)| *name == program)
            .map(|(_, spec)| spec)
    }

    /// Waits until etcd's `/health` answers `"health":"true"` (its member serves).
    async fn wait_etcd_health(&self) -> Result<(), Error> {
        let deadline = Instant::now() + READY_TIMEOUT;
        while !etcd_healthy(self.etcd_port).await {
            if Instant::now() > deadline {
                let procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
                return Err(Error::NotReady {
                    what: "etcd /health after a restart",
                    log_tail: procs
                        .iter()
                        .filter(|p| p.name() == "etcd")
                        .map(Proc::log_tail)
                        .collect(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// Freezes `program` with SIGSTOP until the answer is resumed or dropped: what a hung
    /// kubelet looks like to the control plane when `program` is kwok.
    pub fn pause(&self, program: &str) -> Result<Paused, Error> {
        let pid = self
            .pid(program)
            .ok_or_else(|| Error::NoSuchProcess(program.to_owned()))?;
        Paused::pause(program, pid)
    }

    /// The API server's audit log, when it writes one ([`Options::audit_log`]).
    pub fn audit_log(&self) -> Option<PathBuf> {
        Some(self.endpoints.dir.join("audit.log")).filter(|p| p.exists())
    }

    /// Path of the admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.endpoints.kubeconfig
    }

    /// A new admin client. Each async runtime (each `#[tokio::test]`) needs its own.
    pub async fn client(&self) -> Result<Client, Error> {
        client_for(&self.endpoints.kubeconfig).await
    }

    /// The admin client's configuration, for a client of the caller's own.
    pub async fn config(&self) -> Result<kube::Config, Error> {
        config_for(&self.endpoints.kubeconfig).await
    }

    /// Creates a namespace with a unique name starting with `prefix`, for one test.
    pub async fn namespace(&self, client: &Client, prefix: &str) -> Result<String, Error> {
        let ns = Namespace {
            metadata: ObjectMeta {
                generate_name: Some(format!("{prefix}-")),
                ..Default::default()
            },
            ..Default::default()
        };
        let created = Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        Ok(created
            .metadata
            .name
            .expect("the API server names generated namespaces"))
    }

    /// Imports an OCI image archive into the real node's containerd ([`Options::kubelet`]).
    pub fn import_image(&self, archive: &Path) -> Result<(), Error> {
        let node = self.endpoints.node.as_ref().ok_or_else(|| {
            Error::Node("this control plane runs no real node (Options::kubelet)".to_owned())
        })?;
        crate::node::import_image(&node.socket, archive)
    }

    /// Stops every process (the real node's first, then the control plane's, last started
    /// first) and removes the temporary directory — unless the node's teardown left something
    /// (mounts may remain under it: the directory is kept and named in the log).
    pub fn stop(&self) {
        let mut clean = true;
        if let Some(mut node) = self.node.lock().unwrap_or_else(|e| e.into_inner()).take() {
            clean = node.stop(STOP_GRACE);
        }
        let mut procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(mut p) = procs.pop() {
            p.stop(STOP_GRACE);
        }
        let tempdir = self
            .tempdir
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(t) = tempdir
            && !clean
        {
            tracing::warn!(dir = %t.path().display(), "the real node left something behind: its directory is kept");
            let _ = t.keep();
        }
    }

    /// Lets the processes run on after this value is gone (`testenv up`).
    pub fn detach(self) -> Endpoints {
        let endpoints = self.endpoints();
        if let Some(node) = self.node.lock().unwrap_or_else(|e| e.into_inner()).take() {
            node.detach();
        }
        for p in self
            .procs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            p.leak();
        }
        if let Some(t) = self
            .tempdir
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let _ = t.keep();
        }
        endpoints
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// etcd's arguments: its data in `dir/etcd`, serving clients on `client` (loopback).
fn etcd_args(dir: &Path, client: u16, peer: u16) -> Vec<String> {
    vec![
        "--name=testenv".to_owned(),
        format!("--data-dir={}", dir.join("etcd").display()),
        format!("--listen-client-urls=http://127.0.0.1:{client}"),
        format!("--advertise-client-urls=http://127.0.0.1:{client}"),
        format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
        format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
        format!("--initial-cluster=testenv=http://127.0.0.1:{peer}"),
        "--unsafe-no-fsync=true".to_owned(),
        "--log-level=warn".to_owned(),
    ]
}

/// kube-apiserver's arguments: serving on `port` (loopback) from the etcd on `etcd`, with the
/// feature gates and the audit log of `options` (its policy written into `dir`).
fn apiserver_args(
    options: &Options,
    (dir, files, pki): (&Path, &PkiFiles, &Pki),
    host: &str,
    (etcd, port): (u16, u16),
) -> Result<Vec<String>, Error> {
    let mut args = vec![
        format!("--etcd-servers=http://127.0.0.1:{etcd}"),
        format!("--cert-dir={}", dir.display()),
        format!("--tls-cert-file={}", files.serving_cert.display()),
        format!("--tls-private-key-file={}", files.serving_key.display()),
        format!("--client-ca-file={}", files.client_ca.display()),
        format!("--secure-port={port}"),
        format!("--bind-address={host}"),
        format!("--advertise-address={host}"),
        // 65,534 Service addresses: the load test creates a Service per Manifest (a /24 is
        // full after 253).
        format!("--service-cluster-ip-range={}", crate::node::SERVICE_RANGE),
        "--allow-privileged=true".to_owned(),
        "--authorization-mode=Node,RBAC".to_owned(),
        format!("--service-account-issuer=https://127.0.0.1:{port}/"),
        format!(
            "--service-account-key-file={}",
            files.service_account_pub.display()
        ),
        format!(
            "--service-account-signing-key-file={}",
            files.service_account_key.display()
        ),
    ];
    if options.kubelet {
        // Pods get their ServiceAccount's token; the node may only touch its own objects;
        // the API server authenticates to kubelet (logs, exec) with a client certificate.
        let (cert, key) = pki.client_certificate(
            "kube-apiserver-kubelet-client",
            Some("system:masters"),
            validity(),
        )?;
        write(&dir.join("kubelet-client.crt"), &cert)?;
        write(&dir.join("kubelet-client.key"), &key)?;
        args.extend([
            "--enable-admission-plugins=NodeRestriction".to_owned(),
            format!(
                "--kubelet-client-certificate={}",
                dir.join("kubelet-client.crt").display()
            ),
            format!(
                "--kubelet-client-key={}",
                dir.join("kubelet-client.key").display()
            ),
            "--kubelet-preferred-address-types=InternalIP".to_owned(),
        ]);
    } else {
        // No kubelet and (without the controller-manager) no default ServiceAccount.
        args.push("--disable-admission-plugins=ServiceAccount".to_owned());
    }
    if !options.feature_gates.is_empty() {
        let gates: Vec<String> = options
            .feature_gates
            .iter()
            .map(|gate| format!("{gate}=true"))
            .collect();
        args.push(format!("--feature-gates={}", gates.join(",")));
    }
    if options.audit_log {
        let policy = dir.join("audit-policy.yaml");
        write(&policy, AUDIT_POLICY)?;
        args.extend([
            format!("--audit-policy-file={}", policy.display()),
            format!("--audit-log-path={}", dir.join("audit.log").display()),
            "--audit-log-format=json".to_owned(),
            // Batched: the request does not wait for the log write; a batch is written
            // within a second (a reader waits that long after its window).
            "--audit-log-mode=batch".to_owned(),
            "--audit-log-batch-max-size=100".to_owned(),
            "--audit-log-batch-max-wait=1s".to_owned(),
            "--audit-log-maxsize=0".to_owned(),
        ]);
    }
    Ok(args)
}

/// Starts kwok for the nodes annotated [`SIMULATED_NODE_ANNOTATION`], with node Leases and kwok's
/// stages plus ours ([`POD_READY_AGAIN_STAGE`], written into `dir`).
fn start_kwok(
    tools: &Tools,
    dir: &Path,
    kubeconfig: &Path,
    port: u16,
    lifetime: Lifetime,
) -> Result<Proc, Error> {
    let our_stages = dir.join("kwok-pod-ready-again.yaml");
    write(&our_stages, POD_READY_AGAIN_STAGE)?;
    let mut kwok = Command::new(&tools.kwok);
    kwok.args([
        format!("--kubeconfig={}", kubeconfig.display()),
        "--manage-all-nodes=false".to_owned(),
        format!("--manage-nodes-with-annotation-selector={SIMULATED_NODE_ANNOTATION}=fake"),
        format!("--server-address=127.0.0.1:{port}"),
        format!("--node-lease-duration-seconds={NODE_LEASE_DURATION_SECONDS}"),
        format!("--config={}", tools.kwok_stages.display()),
        format!("--config={}", our_stages.display()),
    ]);
    Proc::spawn("kwok", kwok, &dir.join("kwok.log"), lifetime)
}

/// The annotation kwok manages nodes by.
const SIMULATED_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";

/// The taint of the simulated nodes when a real node runs too: pods land on them only when they
/// tolerate it.
pub const SIMULATED_NODE_TAINT: &str = "kwok.x-k8s.io/node";

/// Creates `count` Nodes for kwok to run (`kwok-node-0`, …), roomy enough for a load test;
/// `tainted` beside a real node.
async fn create_simulated_nodes(client: &Client, count: usize, tainted: bool) -> Result<(), Error> {
    let taints = if tainted {
        serde_json::json!([{"key": SIMULATED_NODE_TAINT, "value": "fake", "effect": "NoSchedule"}])
    } else {
        serde_json::json!([])
    };
    let nodes = Api::<Node>::all(client.clone());
    for i in 0..count {
        let node: Node = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": format!("kwok-node-{i}"),
                "annotations": {SIMULATED_NODE_ANNOTATION: "fake"},
                "labels": {"kubernetes.io/hostname": format!("kwok-node-{i}"), "type": "kwok"},
            },
            "spec": {"taints": taints},
            "status": {
                "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "1000"},
                "capacity": {"cpu": "64", "memory": "256Gi", "pods": "1000"},
            },
        }))
        .expect("a static Node is valid");
        nodes.create(&PostParams::default(), &node).await?;
    }
    Ok(())
}

/// A validity for the node's client certificates: from an hour ago for a year.
fn validity() -> std::ops::Range<std::time::SystemTime> {
    let now = std::time::SystemTime::now();
    now - Duration::from_secs(3600)..now + Duration::from_secs(365 * 24 * 3600)
}

/// The real node: kubeconfigs for kubelet (`system:node:…`) and kube-proxy, then
/// [`crate::node::start`].
#[allow(
    clippy::too_many_arguments,
    reason = "the control plane's parts, passed once"
)]
async fn start_node(
    tools: &Tools,
    options: &Options,
    pki: &Pki,
    server: &str,
    dir: &Path,
    files: &PkiFiles,
    client: &Client,
    lifetime: Lifetime,
    guard: crate::node::HostGuard,
) -> Result<crate::node::Node, Error> {
    let tools = Tools::node_binaries().map(|found| Tools {
        kubelet: found.kubelet,
        kube_proxy: found.kube_proxy,
        ..tools.clone()
    })?;
    let node_user = format!("system:node:{}", crate::node::NODE_NAME);
    let (cert, key) = pki.client_certificate(&node_user, Some("system:nodes"), validity())?;
    let kubelet_kubeconfig = dir.join("kubelet.kubeconfig");
    write(
        &kubelet_kubeconfig,
        &pki.kubeconfig(server, &node_user, &cert, &key),
    )?;
    let (cert, key) = pki.client_certificate("system:kube-proxy", None, validity())?;
    let proxy_kubeconfig = dir.join("kube-proxy.kubeconfig");
    write(
        &proxy_kubeconfig,
        &pki.kubeconfig(server, "system:kube-proxy", &cert, &key),
    )?;
    crate::node::start(
        &tools,
        crate::node::NodeInputs {
            dir,
            client_ca: &files.client_ca,
            kubelet_kubeconfig: &kubelet_kubeconfig,
            proxy_kubeconfig: &proxy_kubeconfig,
            lifetime,
        },
        client,
        &options.images,
        guard,
    )
    .await
}

/// Removes the directories of test processes that died without cleaning up (`<pid>-…`).
fn remove_stale_dirs(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_string_lossy()
            .split('-')
            .next()
            .and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Builds a client from a kubeconfig file.
pub async fn client_for(kubeconfig: &Path) -> Result<Client, Error> {
    Ok(Client::try_from(config_for(kubeconfig).await?)?)
}

/// The client configuration a kubeconfig file gives (its current context).
pub async fn config_for(kubeconfig: &Path) -> Result<Config, Error> {
    let kc = Kubeconfig::read_from(kubeconfig).map_err(|e| Error::Kubeconfig(e.to_string()))?;
    Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Kubeconfig(e.to_string()))
}

struct PkiFiles {
    serving_ca: PathBuf,
    serving_cert: PathBuf,
    serving_key: PathBuf,
    client_ca: PathBuf,
    service_account_key: PathBuf,
    service_account_pub: PathBuf,
}

fn write_pki(dir: &Path, pki: &Pki) -> Result<PkiFiles, Error> {
    let files = PkiFiles {
        serving_ca: dir.join("serving-ca.crt"),
        serving_cert: dir.join("apiserver.crt"),
        serving_key: dir.join("apiserver.key"),
        client_ca: dir.join("client-ca.crt"),
        service_account_key: dir.join("sa-signer.key"),
        service_account_pub: dir.join("sa-signer.pub"),
    };
    write(&files.serving_ca, &pki.serving_ca_pem)?;
    write(&files.serving_cert, &pki.serving_cert_pem)?;
    write(&files.serving_key, &pki.serving_key_pem)?;
    write(&files.client_ca, &pki.client_ca_pem)?;
    write(&files.service_account_key, &pki.service_account_key_pem)?;
    write(&files.service_account_pub, &pki.service_account_pub_pem)?;
    Ok(files)
}

fn write(path: &Path, content: &str) -> Result<(), Error> {
    std::fs::write(path, content).map_err(|e| Error::io(format!("write {}", path.display()), e))
}

pub(crate) fn free_ports<const N: usize>() -> Result<[u16; N], Error> {
    // Hold all listeners until every port is chosen so the N ports differ.
    let listeners = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::io("pick a free port", e))?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener
            .local_addr()
            .map_err(|e| Error::io("pick a free port", e))?
            .port();
    }
    Ok(ports)
}

/// Waits until kube-apiserver's `/readyz` answers `ok`, failing early when one of `procs`
/// exited; the lock is held only to look, never across a wait.
async fn wait_ready(
    client: &Client,
    procs: &Mutex<Vec<Proc>>,
    what: &'static str,
) -> Result<(), Error> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let locked = || procs.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        locked().iter_mut().try_for_each(Proc::check_running)?;
        if readyz(client).await {
            return Ok(());
        }
        if Instant::now() > deadline {
            let log_tail = locked()
                .iter()
                .map(|p| format!("--- {}\n{}", p.name(), p.log_tail()))
                .collect();
            return Err(Error::NotReady { what, log_tail });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether etcd on `port` answers `/health` with `"health":"true"` now (plain HTTP/1.0).
async fn etcd_healthy(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream
            .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    match tokio::time::timeout(Duration::from_secs(2), ask).await {
        Ok(Ok(answer)) => answer.replace(' ', "").contains(r#""health":"true""#),
        _ => false,
    }
}

/// Whether kube-apiserver's `/readyz` answers `ok` now.
async fn readyz(client: &Client) -> bool {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .expect("a static request is valid");
    matches!(client.request_text(request).await, Ok(body) if body.trim() == "ok")
}

/// kube-controller-manager is working once its service-account controller has created the
/// `default` ServiceAccount in the `default` namespace.
async fn wait_controller_manager(client: &Client, procs: &mut [Proc]) -> Result<(), Error> {
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), "default");
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        for p in procs.iter_mut() {
            p.check_running()?;
        }
        if accounts.get_opt("default").await?.is_some() {
            return Ok(());
        }
        if Instant::now() > deadline {
            let log_tail = procs.last().map(Proc::log_tail).unwrap_or_default();
            return Err(Error::NotReady {
                what: "kube-controller-manager",
                log_tail,
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Applies every CustomResourceDefinition in a YAML file and waits until each is `Established`.
pub async fn install_crds(
    client: &Client,
    file: &Path,
) -> Result<Vec<CustomResourceDefinition>, Error> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| Error::io(format!("read {}", file.display()), e))?;
    let crds = parse_crds(&text).map_err(|e| Error::Crd(format!("{}: {e}", file.display())))?;
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let params = PatchParams::apply("testenv").force();
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(crd)).await?;
    }
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let cond = kube::runtime::conditions::is_crd_established();
        tokio::time::timeout(
            READY_TIMEOUT,
            kube::runtime::wait::await_condition(api.clone(), &name, cond),
        )
        .await
        .map_err(|_| Error::Crd(format!("{name} not Established in time")))?
        .map_err(|e| Error::Crd(format!("{name}: {e}")))?;
    }
    Ok(crds)
}

/// Parses a multi-document YAML file of CustomResourceDefinitions (empty documents skipped).
pub fn parse_crds(text: &str) -> Result<Vec<CustomResourceDefinition>, serde_yaml_ng::Error> {
    let mut crds = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(text) {
        let value = serde_yaml_ng::Value::deserialize(document)?;
        if !value.is_null() {
            crds.push(serde_yaml_ng::from_value(value)?);
        }
    }
    Ok(crds)
}
