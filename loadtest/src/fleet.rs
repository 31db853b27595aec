//! The fleet under test, and what the scenarios do to it: start, scale, kill, pause, restart,
//! scrape, read logs and resource usage. Two kinds:
//!
//! - [`Fleet::local`]: the harness starts the control plane (etcd, kube-apiserver,
//!   kube-controller-manager) and N processes of the real `module-manager` binary, as a
//!   StatefulSet controller would ([`test_support::fleet::LocalFleet`]): a StatefulSet object
//!   says which ordinals are desired, the harness starts and stops `<fleet>-<ordinal>` to match.
//!   On top of it here: optional per-replica CPU limits through cgroup v1/v2 CPU quotas, and
//!   paused replicas.
//! - [`Fleet::cluster`]: a fleet already deployed as a StatefulSet, reached through a
//!   kubeconfig: replicas are its pods, their admin API is read through the API server's pod
//!   proxy, kills are pod deletions with grace period 0, restarts pod deletions, scaling the
//!   StatefulSet's `spec.replicas`. A pause (SIGSTOP) has no API equivalent there.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, LogParams};
use kube::{Client, ResourceExt};
use test_support::fleet::{LocalFleet, ReplicaSettings, http_get, signal, stop_all};

use crate::cgroup::CpuLimit;

pub use test_support::fleet::{cpu_seconds_from_stat, proc_usage};

/// Settings of a local fleet's replicas.
#[derive(Clone, Debug)]
pub struct LocalSettings {
    /// Their flags (the manifest selector is the fleet's: `loadtest-fleet=<name>`).
    pub replica: ReplicaSettings,
    /// Cores per replica (cgroup CPU quota), if any.
    pub cpu_limit: Option<f64>,
    /// Per ordinal, a kubeconfig of its own (`chaos`'s network faults: the replica's own proxy
    /// to the API server); the others use the control plane's.
    pub kubeconfigs: BTreeMap<u32, std::path::PathBuf>,
}

/// How to reach a deployed fleet.
#[derive(Clone, Debug)]
pub struct ClusterSettings {
    /// Namespace of the StatefulSet (and of the fleet's Leases).
    pub namespace: String,
    pub statefulset: String,
    /// Fleet name (`--fleet` of the replicas; names the Leases).
    pub fleet: String,
    /// Port of the admin API in the pods.
    pub admin_port: u16,
}

/// How to reach the replicas without holding the [`Fleet`]: cheap to clone, shared with the
/// sampler, kept current by the fleet as replicas start and stop.
#[derive(Clone)]
pub struct Probe {
    pub client: Client,
    /// Fleet name (names the Leases).
    pub name: String,
    /// Replicas are `<statefulset>-<ordinal>`.
    pub statefulset: String,
    pub lease_namespace: String,
    reach: Reach,
}

#[derive(Clone)]
enum Reach {
    /// Ordinal → (admin port, pid) of the running local processes.
    Local(Arc<Mutex<BTreeMap<u32, (u16, u32)>>>),
    Cluster(ClusterSettings),
}

#[expect(clippy::large_enum_variant, reason = "one value per fleet")]
enum Kind {
    Local {
        fleet: LocalFleet,
        cpu: Option<CpuLimit>,
        /// Paused ordinals (SIGSTOP).
        paused: Vec<u32>,
    },
    Cluster {
        settings: ClusterSettings,
    },
}

/// The fleet under test.
pub struct Fleet {
    pub client: Client,
    /// Fleet name: replicas are `<name>-<ordinal>`, Leases `<name>-shard-<k>`, `<name>-member-…`.
    pub name: String,
    /// Namespace of the StatefulSet and the Leases.
    pub lease_namespace: String,
    pub shards: u32,
    pub lease_duration: Duration,
    /// Label selector the replicas reconcile (local fleets: `loadtest-fleet=<name>`); the load
    /// generator labels its Manifests with it.
    pub manifest_labels: BTreeMap<String, String>,
    probe: Probe,
    kind: Kind,
}

impl Fleet {
    /// A local fleet of `replicas` processes in `namespace` (its StatefulSet object is created
    /// there). The control plane is the caller's.
    pub async fn local(
        client: Client,
        kubeconfig: &Path,
        namespace: &str,
        name: &str,
        replicas: u32,
        settings: LocalSettings,
    ) -> anyhow::Result<Self> {
        let mut replica = settings.replica;
        replica.manifest_selector = format!("loadtest-fleet={name}");
        let shards = replica.shards;
        let lease_duration = Duration::from_secs(replica.lease_duration_seconds);
        let mut local =
            LocalFleet::create(&client, kubeconfig, namespace, name, replicas, replica).await?;
        for (ordinal, own) in settings.kubeconfigs {
            local.set_kubeconfig(ordinal, own);
        }
        let cpu = match settings.cpu_limit {
            Some(cores) => Some(CpuLimit::create(name, cores)?),
            None => None,
        };
        let probe = Probe {
            client: client.clone(),
            name: name.to_owned(),
            statefulset: name.to_owned(),
            lease_namespace: namespace.to_owned(),
            reach: Reach::Local(Arc::default()),
        };
        let mut fleet = Self {
            client,
            probe,
            name: name.to_owned(),
            lease_namespace: namespace.to_owned(),
            shards,
            lease_duration,
            manifest_labels: BTreeMap::from([("loadtest-fleet".to_owned(), name.to_owned())]),
            kind: Kind::Local {
                fleet: local,
                cpu,
                paused: Vec::new(),
            },
        };
        for ordinal in 0..replicas {
            fleet.start(ordinal)?;
        }
        Ok(fleet)
    }

    /// A deployed fleet. Its lease timings are read from a member Lease.
    pub async fn cluster(client: Client, settings: ClusterSettings) -> anyhow::Result<Self> {
        let statefulset =
            read_statefulset(&client, &settings.namespace, &settings.statefulset).await?;
        let args: Vec<String> = statefulset
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|p| p.containers.first())
            .and_then(|c| c.args.clone())
            .unwrap_or_default();
        let flag = |name: &str| -> Option<String> {
            let prefix = format!("--{name}=");
            args.iter()
                .find_map(|a| a.strip_prefix(&prefix).map(str::to_owned))
        };
        let shards = flag("shards").and_then(|s| s.parse().ok()).unwrap_or(256);
        let lease = flag("lease-duration-seconds")
            .and_then(|s| s.parse().ok())
            .unwrap_or(15);
        let name = flag("fleet").unwrap_or_else(|| settings.fleet.clone());
        let probe = Probe {
            client: client.clone(),
            name: name.clone(),
            statefulset: settings.statefulset.clone(),
            lease_namespace: settings.namespace.clone(),
            reach: Reach::Cluster(settings.clone()),
        };
        Ok(Self {
            client,
            probe,
            name,
            lease_namespace: settings.namespace.clone(),
            shards,
            lease_duration: Duration::from_secs(lease),
            manifest_labels: BTreeMap::new(),
            kind: Kind::Cluster { settings },
        })
    }

    pub fn is_local(&self) -> bool {
        matches!(self.kind, Kind::Local { .. })
    }

    /// Replica name of `ordinal`.
    pub fn member(&self, ordinal: u32) -> String {
        self.probe.member(ordinal)
    }

    /// A handle to reach the replicas without holding the fleet.
    pub fn probe(&self) -> Probe {
        self.probe.clone()
    }

    pub async fn ordinals(&self) -> anyhow::Result<Vec<u32>> {
        self.probe.ordinals().await
    }

    pub async fn get(&self, ordinal: u32, path: &str) -> anyhow::Result<(u16, String)> {
        self.probe.get(ordinal, path).await
    }

    pub async fn scrape(&self, ordinal: u32) -> anyhow::Result<String> {
        self.probe.scrape(ordinal).await
    }

    /// Starts replica `ordinal` (local fleets only) in the fleet's CPU cgroup, if any.
    fn start(&mut self, ordinal: u32) -> anyhow::Result<()> {
        let Kind::Local { fleet, cpu, .. } = &mut self.kind else {
            bail!("start: only local fleets start processes");
        };
        let pid = fleet.start(ordinal)?.process.pid();
        if let Some(cpu) = cpu
            && let Err(e) = cpu.add(&fleet.member(ordinal), pid)
        {
            // Not left running outside its CPU limit: dropping the replica stops it.
            drop(fleet.take(ordinal));
            return Err(e);
        }
        self.sync_endpoints();
        Ok(())
    }

    /// Publishes the running local processes to the probe.
    fn sync_endpoints(&self) {
        if let (Kind::Local { fleet, .. }, Reach::Local(endpoints)) =
            (&self.kind, &self.probe.reach)
        {
            *endpoints.lock().unwrap() = fleet
                .replicas()
                .iter()
                .map(|(o, r)| (*o, (r.admin, r.process.pid())))
                .collect();
        }
    }

    /// Sets the StatefulSet's `spec.replicas` and, for a local fleet, starts the new ordinals
    /// and stops (SIGTERM, waiting for the exit) the ones above, all at once as
    /// `podManagementPolicy: Parallel` does.
    pub async fn scale(&mut self, replicas: u32) -> anyhow::Result<()> {
        test_support::fleet::set_desired(
            &self.client,
            &self.lease_namespace,
            self.statefulset_name(),
            replicas,
        )
        .await?;
        if !self.is_local() {
            return Ok(());
        }
        let running = self.ordinals().await?;
        for ordinal in 0..replicas {
            if !running.contains(&ordinal) {
                self.start(ordinal)?;
            }
        }
        let leaving: Vec<u32> = running.into_iter().filter(|o| *o >= replicas).collect();
        let mut stopping = Vec::new();
        if let Kind::Local { fleet, .. } = &mut self.kind {
            for ordinal in leaving {
                if let Some(replica) = fleet.take(ordinal) {
                    stopping.push(replica);
                }
            }
        }
        self.sync_endpoints();
        stop_all(stopping, Duration::from_secs(60)).await;
        Ok(())
    }

    fn statefulset_name(&self) -> &str {
        match &self.kind {
            Kind::Local { .. } => &self.name,
            Kind::Cluster { settings } => &settings.statefulset,
        }
    }

    /// SIGKILL (cluster: delete the pod with grace period 0). A local fleet restarts the
    /// replica after `restart_after`, as the StatefulSet controller would recreate the pod.
    pub async fn kill(&mut self, ordinal: u32) -> anyhow::Result<()> {
        match &mut self.kind {
            Kind::Local { fleet, paused, .. } => {
                let Some(replica) = fleet.take(ordinal) else {
                    bail!("kill: replica {ordinal} is not running");
                };
                signal(replica.process.pid(), libc::SIGKILL)?;
                paused.retain(|o| *o != ordinal);
                self.sync_endpoints();
                stop_all(vec![replica], Duration::from_secs(5)).await;
                Ok(())
            }
            Kind::Cluster { settings } => {
                let pod = format!("{}-{ordinal}", settings.statefulset);
                Api::<Pod>::namespaced(self.client.clone(), &settings.namespace)
                    .delete(&pod, &DeleteParams::default().grace_period(0))
                    .await
                    .with_context(|| format!("delete pod {pod}"))?;
                Ok(())
            }
        }
    }

    /// Starts a killed local replica again (cluster: the StatefulSet controller does it).
    pub async fn revive(&mut self, ordinal: u32) -> anyhow::Result<()> {
        if self.is_local() && !self.ordinals().await?.contains(&ordinal) {
            self.start(ordinal)?;
        }
        Ok(())
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`); local fleets only.
    pub fn pause(&mut self, ordinal: u32, stop: bool) -> anyhow::Result<()> {
        let Kind::Local { fleet, paused, .. } = &mut self.kind else {
            bail!("pausing a replica (SIGSTOP) needs a local fleet");
        };
        let replica = fleet
            .replicas()
            .get(&ordinal)
            .with_context(|| format!("pause: replica {ordinal} is not running"))?;
        signal(
            replica.process.pid(),
            if stop { libc::SIGSTOP } else { libc::SIGCONT },
        )?;
        if stop {
            paused.push(ordinal);
        } else {
            paused.retain(|o| *o != ordinal);
        }
        Ok(())
    }

    /// A graceful restart of one replica: SIGTERM, wait for the exit, start it again (cluster:
    /// delete the pod and wait for its successor to be ready).
    pub async fn restart(&mut self, ordinal: u32) -> anyhow::Result<()> {
        match &mut self.kind {
            Kind::Local { fleet, .. } => {
                let replica = fleet
                    .take(ordinal)
                    .with_context(|| format!("restart: replica {ordinal} is not running"))?;
                self.sync_endpoints();
                stop_all(vec![replica], Duration::from_secs(60)).await;
                self.start(ordinal)
            }
            Kind::Cluster { settings } => {
                let pods = Api::<Pod>::namespaced(self.client.clone(), &settings.namespace);
                let name = format!("{}-{ordinal}", settings.statefulset);
                let old_uid = pods.get(&name).await?.uid();
                pods.delete(&name, &DeleteParams::default()).await?;
                let deadline = Instant::now() + Duration::from_secs(600);
                loop {
                    if let Some(pod) = pods.get_opt(&name).await?
                        && pod.uid() != old_uid
                        && pod_ready(&pod)
                    {
                        return Ok(());
                    }
                    if Instant::now() > deadline {
                        bail!("pod {name} not back and ready within 10 minutes");
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// A cold restart of the whole fleet: every replica stopped at once (SIGTERM, waiting for
    /// the exits), then all started again (cluster: every pod deleted, the StatefulSet
    /// controller recreates them). Wait with [`Fleet::wait_ready`].
    pub async fn restart_all(&mut self) -> anyhow::Result<()> {
        let ordinals = self.ordinals().await?;
        match &mut self.kind {
            Kind::Local { fleet, .. } => {
                let all = fleet.take_all();
                self.sync_endpoints();
                stop_all(all, Duration::from_secs(60)).await;
                for ordinal in ordinals {
                    self.start(ordinal)?;
                }
                Ok(())
            }
            Kind::Cluster { settings } => {
                let pods = Api::<Pod>::namespaced(self.client.clone(), &settings.namespace);
                for ordinal in ordinals {
                    let name = format!("{}-{ordinal}", settings.statefulset);
                    pods.delete(&name, &DeleteParams::default())
                        .await
                        .with_context(|| format!("delete pod {name}"))?;
                }
                Ok(())
            }
        }
    }

    /// Waits until every running replica answers `/readyz` with 200.
    pub async fn wait_ready(&self, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let mut all = true;
            for ordinal in self.ordinals().await? {
                if !matches!(self.get(ordinal, "/readyz").await, Ok((200, _))) {
                    all = false;
                }
            }
            if all {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("replicas not ready within {limit:?}\n{}", self.tails());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The end of every local replica's log (for error messages).
    pub fn tails(&self) -> String {
        match &self.kind {
            Kind::Local { fleet, .. } => fleet.tails(),
            Kind::Cluster { .. } => String::new(),
        }
    }

    /// Every replica log so far as (name, content): local fleets one file per process start;
    /// deployed fleets the current and previous container's log of each pod.
    pub async fn logs(&self) -> anyhow::Result<Vec<(String, String)>> {
        match &self.kind {
            Kind::Local { fleet, .. } => fleet.logs(),
            Kind::Cluster { settings } => {
                let api = Api::<Pod>::namespaced(self.client.clone(), &settings.namespace);
                let mut logs = Vec::new();
                for pod in pods(&self.client, settings).await? {
                    let name = pod.name_any();
                    for previous in [true, false] {
                        let params = LogParams {
                            previous,
                            ..Default::default()
                        };
                        if let Ok(text) = api.logs(&name, &params).await {
                            logs.push((format!("{name}.{}", u8::from(!previous)), text));
                        }
                    }
                }
                Ok(logs)
            }
        }
    }

    /// Stops every local replica (SIGCONT first for paused ones) and removes the CPU cgroups.
    pub async fn shutdown(&mut self) {
        if let Kind::Local { fleet, paused, cpu } = &mut self.kind {
            for ordinal in paused.drain(..) {
                let _ = fleet.signal(ordinal, libc::SIGCONT);
            }
            let all = fleet.take_all();
            let cpu = cpu.take();
            self.sync_endpoints();
            stop_all(all, Duration::from_secs(30)).await;
            if let Some(cpu) = cpu {
                cpu.remove();
            }
        }
    }
}

impl Probe {
    /// Ordinals running now (local: processes started and not stopped; cluster: pods).
    pub async fn ordinals(&self) -> anyhow::Result<Vec<u32>> {
        match &self.reach {
            Reach::Local(endpoints) => Ok(endpoints.lock().unwrap().keys().copied().collect()),
            Reach::Cluster(settings) => Ok(pods(&self.client, settings)
                .await?
                .iter()
                .filter_map(|p| {
                    p.name_any()
                        .strip_prefix(&format!("{}-", settings.statefulset))?
                        .parse()
                        .ok()
                })
                .collect()),
        }
    }

    /// Replica name of `ordinal`.
    pub fn member(&self, ordinal: u32) -> String {
        format!("{}-{ordinal}", self.statefulset)
    }

    /// Ordinal → admin port (on 127.0.0.1) of the running local replicas; empty for a
    /// deployed fleet (its pods are reached through the API server).
    pub fn admin_ports(&self) -> BTreeMap<u32, u16> {
        match &self.reach {
            Reach::Local(endpoints) => endpoints
                .lock()
                .unwrap()
                .iter()
                .map(|(ordinal, (port, _))| (*ordinal, *port))
                .collect(),
            Reach::Cluster(_) => BTreeMap::new(),
        }
    }

    /// GET `path` from replica `ordinal`'s admin API: (status, body).
    pub async fn get(&self, ordinal: u32, path: &str) -> anyhow::Result<(u16, String)> {
        match &self.reach {
            Reach::Local(endpoints) => {
                let (port, _) = *endpoints
                    .lock()
                    .unwrap()
                    .get(&ordinal)
                    .with_context(|| format!("replica {ordinal} is not running"))?;
                http_get(port, path).await
            }
            Reach::Cluster(settings) => {
                let uri = format!(
                    "/api/v1/namespaces/{}/pods/{}-{ordinal}:{}/proxy{path}",
                    settings.namespace, settings.statefulset, settings.admin_port
                );
                let request = http::Request::get(uri).body(Vec::new())?;
                match tokio::time::timeout(
                    Duration::from_secs(10),
                    self.client.request_text(request),
                )
                .await
                {
                    Ok(Ok(body)) => Ok((200, body)),
                    Ok(Err(kube::Error::Api(status))) => Ok((status.code, status.message)),
                    Ok(Err(e)) => Err(e.into()),
                    Err(_) => bail!("admin API of replica {ordinal}: timed out"),
                }
            }
        }
    }

    /// Replica `ordinal`'s metrics (classic text format).
    pub async fn scrape(&self, ordinal: u32) -> anyhow::Result<String> {
        match self.get(ordinal, "/metrics").await? {
            (200, body) => Ok(body),
            (status, _) => bail!("/metrics of replica {ordinal}: HTTP {status}"),
        }
    }

    /// The process of local replica `ordinal` (none for deployed fleets).
    pub fn pid(&self, ordinal: u32) -> Option<u32> {
        match &self.reach {
            Reach::Local(endpoints) => endpoints.lock().unwrap().get(&ordinal).map(|e| e.1),
            Reach::Cluster(_) => None,
        }
    }

    /// CPU seconds and resident bytes of replica `ordinal`: local fleets from `/proc`, the
    /// process and its descendants (the renderer child, helm runs; [`crate::usage`]), deployed
    /// ones from the process metrics in `samples` (the replica's scrape the caller already has;
    /// none: no reading), which leave a live renderer child out.
    pub fn usage(
        &self,
        ordinal: u32,
        samples: Option<&[crate::measure::PromSample]>,
    ) -> Option<(f64, f64)> {
        match &self.reach {
            Reach::Local(endpoints) => {
                let (_, pid) = *endpoints.lock().unwrap().get(&ordinal)?;
                crate::usage::tree_usage(pid)
            }
            Reach::Cluster(_) => {
                let samples = samples?;
                let cpu = crate::measure::sum(samples, "process_cpu_seconds_total", &[])
                    + crate::measure::sum(samples, "module_manager_helm_cpu_seconds_total", &[]);
                let rss = crate::measure::sum(samples, "process_resident_memory_bytes", &[]);
                Some((cpu, rss))
            }
        }
    }
}

async fn pods(client: &Client, settings: &ClusterSettings) -> anyhow::Result<Vec<Pod>> {
    let prefix = format!("{}-", settings.statefulset);
    Ok(Api::<Pod>::namespaced(client.clone(), &settings.namespace)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.name_any()
                .strip_prefix(&prefix)
                .is_some_and(|o| o.parse::<u32>().is_ok())
        })
        .collect())
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The deployed fleet's StatefulSet `namespace/name`.
pub async fn read_statefulset(
    client: &Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<StatefulSet> {
    Api::<StatefulSet>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .with_context(|| format!("read StatefulSet {namespace}/{name}"))
}
