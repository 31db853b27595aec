//! A phase of a run: a fleet started on the cluster ([`Cluster`]) with its load and observers
//! ([`Phase`], checked and measured by [`Phase::finish`]), and the steps the scenarios share:
//! waits for the assignment and for idle, a shard move, a timed burst, the API server's figures,
//! the paths without a fleet ([`BaselinePaths`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use module_manager::shard::ShardCount;
use serde_json::{Value, json};
use test_support::fleet::ReplicaSettings;
use test_support::log_check;

use crate::fleet::{ClusterSettings, Fleet, LocalSettings, Probe};
use crate::load::{Load, ManifestShape, Op, Rates};
use crate::measure::{self, PromSample};
use crate::observe::{Holders, Observed, Sampler, read_leases};
use crate::options::Options;
use crate::progress::Progress;
use crate::results::{
    ApiServerFigures, Burst, Latencies, MoveStep, ReadyTiming, ReplicaFigures, RunResult,
    Throughput, Violation,
};
use crate::{baseline, checks};

/// Where the fleet runs.
pub enum Cluster<'a> {
    /// A control plane the harness started: the harness starts the replicas too.
    Local(&'a testenv::ControlPlane),
    /// A deployed fleet in the cluster of this kubeconfig. The namespaces the run creates carry
    /// the label `loadtest-run=<run>` and are deleted at the end (the fleet then deletes the
    /// Manifests' objects).
    Deployed {
        client: Client,
        kubeconfig: PathBuf,
        run: String,
    },
}

impl Cluster<'_> {
    pub async fn client(&self) -> anyhow::Result<Client> {
        match self {
            Cluster::Local(cp) => harness_client(cp.kubeconfig()).await,
            Cluster::Deployed { client, .. } => Ok(client.clone()),
        }
    }

    pub fn kubeconfig(&self) -> PathBuf {
        match self {
            Cluster::Local(cp) => cp.kubeconfig().to_owned(),
            Cluster::Deployed { kubeconfig, .. } => kubeconfig.clone(),
        }
    }
}

/// A client of `kubeconfig` whose requests carry the harness's user agent
/// ([`crate::audit::HARNESS_AGENT`]), so that the audit log tells them from the fleet's.
pub async fn harness_client(kubeconfig: &Path) -> anyhow::Result<Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("read {}", kubeconfig.display()))?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .with_context(|| format!("load {}", kubeconfig.display()))?;
    module_manager::telemetry::requests::with_user_agent(&mut config, crate::audit::HARNESS_AGENT);
    Ok(Client::try_from(config)?)
}

/// The repository (chart root of local replicas): `--repo`, else the workspace this program
/// was built in, else the working directory.
pub fn repo(options: &Options) -> PathBuf {
    if let Some(repo) = &options.repo {
        return repo.clone();
    }
    let built_in = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if built_in.join("crds/manifest.yaml").exists() {
        return built_in.canonicalize().unwrap_or(built_in);
    }
    std::env::current_dir().unwrap_or_default()
}

/// The module-manager binary: `--binary`, else next to this program.
pub fn binary(options: &Options) -> anyhow::Result<PathBuf> {
    if let Some(binary) = &options.binary {
        return Ok(binary.clone());
    }
    let exe = std::env::current_exe()?;
    let mut dir = exe
        .parent()
        .context("no directory of this program")?
        .to_owned();
    // Test binaries live in target/<profile>/deps.
    if dir.ends_with("deps") {
        dir.pop();
    }
    let binary = dir.join("module-manager");
    anyhow::ensure!(
        binary.exists(),
        "{} not found: build it (`cargo build --release --bin module-manager`) or pass --binary",
        binary.display()
    );
    Ok(binary)
}

pub fn now_ts() -> Timestamp {
    Timestamp::try_from(SystemTime::now()).unwrap_or_default()
}

/// The processes of a local control plane (etcd, kube-apiserver, kube-controller-manager), for
/// their CPU.
pub fn control_plane_pids(control_plane: &testenv::ControlPlane) -> Vec<u32> {
    ["etcd", "kube-apiserver", "kube-controller-manager"]
        .iter()
        .filter_map(|p| control_plane.pid(p))
        .collect()
}

/// A fleet, the load on it, and the observers, in one namespace.
pub struct Phase {
    pub fleet: Fleet,
    pub probe: Probe,
    pub load: Load,
    pub sampler: Sampler,
    pub namespace: String,
    pub replicas: u32,
    watch: tokio::task::JoinHandle<()>,
    apiserver_before: Vec<PromSample>,
    /// The replicas' own proxies to the API server, by ordinal (`chaos`'s `partition` and
    /// `slow`; [`crate::network`]).
    pub network: Option<crate::proxy::Proxy>,
    /// Moves the progress bar.
    ticker: tokio::task::JoinHandle<()>,
    /// Per replica, when the scenario had it stopped (SIGSTOP): the overlap checker does not
    /// count a pass as running then.
    pub pauses: BTreeMap<String, Vec<(Timestamp, Timestamp)>>,
    /// Per replica, when the scenario had it partitioned from the API server (`partition`):
    /// the overlap checker leaves out its passes from the cut to the heal, whenever they
    /// started, and those the heal's reset ends within a second ([`log_check::check_with_outages`]).
    pub partitions: BTreeMap<String, Vec<(Timestamp, Timestamp)>>,
    started: Instant,
    pub started_ts: Timestamp,
    pub progress: Progress,
}

impl Phase {
    /// Starts a fleet of `replicas` named `name` and the load's watch and the sampler.
    pub async fn start(
        cluster: &Cluster<'_>,
        options: &Options,
        name: &str,
        replicas: u32,
        progress: Progress,
    ) -> anyhow::Result<Self> {
        let client = cluster.client().await?;
        let namespace = new_namespace(cluster, &client, &format!("loadtest-{name}")).await?;
        progress.say(format!(
            "starting {replicas} replicas ({name}) in namespace {namespace}"
        ));
        let mut network = None;
        let fleet = match cluster {
            Cluster::Local(cp) => {
                let repo = repo(options);
                let replica = ReplicaSettings {
                    binary: binary(options)?,
                    chart_root: repo.clone(),
                    helm: testenv::Tools::locate()?.helm,
                    shards: options.shards,
                    concurrency: options.concurrency,
                    lease_duration_seconds: options.lease_duration_seconds,
                    renew_interval_seconds: options.renew_interval_seconds,
                    renew_deadline_seconds: options.renew_deadline_seconds,
                    restart_grace_seconds: options.restart_grace_seconds,
                    handover_timeout_seconds: None,
                    statefulset: !options.without_statefulset,
                    // Set by `Fleet::local` (the fleet's label).
                    manifest_selector: String::new(),
                    extra_args: options.replica_args.clone(),
                    log_dir: log_dir(&namespace),
                };
                let mut kubeconfigs = BTreeMap::new();
                if crate::network::wanted(&options.faults) {
                    let dir = log_dir(&namespace).join("kubeconfigs");
                    let (proxy, files) =
                        crate::network::proxies(cp.kubeconfig(), replicas, &dir).await?;
                    network = Some(proxy);
                    kubeconfigs = files;
                }
                let settings = LocalSettings {
                    replica,
                    cpu_limit: options.cpu_per_replica,
                    kubeconfigs,
                };
                Fleet::local(
                    client.clone(),
                    cp.kubeconfig(),
                    &namespace,
                    name,
                    replicas,
                    settings,
                )
                .await?
            }
            Cluster::Deployed { .. } => {
                let mut fleet = Fleet::cluster(
                    client.clone(),
                    ClusterSettings {
                        namespace: options.fleet_namespace.clone(),
                        statefulset: options.statefulset.clone(),
                        fleet: "module-manager".into(),
                        admin_port: options.admin_port,
                    },
                )
                .await?;
                if fleet.ordinals().await?.len() as u32 != replicas {
                    fleet.scale(replicas).await?;
                }
                fleet
            }
        };
        fleet.wait_ready(Duration::from_secs(180)).await?;
        let probe = fleet.probe();
        wait_assignment(&probe, fleet.shards, replicas, Duration::from_secs(180)).await?;
        let mut labels = fleet.manifest_labels.clone();
        labels.insert("loadtest-run".into(), namespace.clone());
        let chart = chart_spec(options)?;
        let load = Load::new(
            client.clone(),
            &namespace,
            "m",
            ManifestShape {
                chart,
                interval: options.drift_interval.clone(),
                labels,
                remote: None,
            },
        );
        let watch = load.spawn_watch();
        let sampler = Sampler::spawn(
            probe.clone(),
            load.clone(),
            Duration::from_secs_f64(options.sample_seconds.max(0.1)),
            fleet.lease_duration,
        );
        let apiserver_before = apiserver_metrics(&client).await.unwrap_or_default();
        let ticker = spawn_ticker(&load, &sampler, &progress);
        Ok(Self {
            fleet,
            probe,
            load,
            sampler,
            namespace,
            replicas,
            watch,
            apiserver_before,
            network,
            ticker,
            pauses: BTreeMap::new(),
            partitions: BTreeMap::new(),
            started: Instant::now(),
            started_ts: now_ts(),
            progress,
        })
    }

    /// Rates of the basic load.
    pub fn rates(options: &Options) -> Rates {
        Rates {
            create: options.create_rate,
            delete: options.delete_rate,
            update_period: (options.update_period_seconds > 0)
                .then(|| Duration::from_secs(options.update_period_seconds)),
        }
    }

    /// Waits for the last effects, checks and measures; fills `result` (everything but the
    /// scenario's own parts).
    pub async fn finish(
        self,
        options: &Options,
        result: &mut RunResult,
        extra_violations: Vec<Violation>,
    ) -> anyhow::Result<Fleet> {
        let load_seconds = self.started.elapsed().as_secs_f64();
        self.load.stop();
        let apiserver_after = apiserver_metrics(&self.fleet.client)
            .await
            .unwrap_or_default();
        let apiserver_seconds = self.started.elapsed().as_secs_f64();
        self.ticker.abort();
        self.progress
            .say("load stopped; waiting for the last operations' effects");
        let settle = Duration::from_secs(options.settle_seconds);
        let outstanding = self.load.settle(settle).await;
        let observed = self.sampler.stop();
        self.watch.abort();
        let not_ready = self.load.not_ready().await?;
        let uids = self.load.uids().await?;
        let logs = self.fleet.logs().await?;
        if self.fleet.is_local() {
            if options.keep_logs {
                self.progress.say(format!(
                    "replica logs kept in {}",
                    log_dir(&self.namespace).display()
                ));
            } else {
                let _ = std::fs::remove_dir_all(log_dir(&self.namespace));
            }
        }
        let renew_deadline = Duration::from_secs(options.renew_deadline_seconds);
        let report = log_check::check_with_outages(
            &logs,
            &uids,
            &self.pauses,
            &self.partitions,
            renew_deadline,
        );
        if !report.overlaps.is_empty() {
            // What the overlapping passes logged, for whoever reads a failed run (CI prints
            // stderr; the logs themselves are gone).
            eprintln!("{}", overlap_lines(&logs, &report, &self.pauses));
        }

        let mut violations = checks::overlaps(&report);
        violations.extend(checks::not_converged(
            &outstanding,
            &not_ready,
            &report.unreconciled,
            settle,
        ));
        violations.extend(checks::unowned(
            &observed.ownership.longest_unowned,
            self.fleet.lease_duration,
        ));
        violations.extend(extra_violations);

        let tracker = self.load.tracker.lock().unwrap();
        let of = |op: Op| -> Vec<f64> {
            tracker
                .done
                .iter()
                .filter(|d| d.op == op)
                .map(|d| d.seconds)
                .collect()
        };
        let operations: u64 = tracker.sent.values().sum();
        let converged = tracker.done.iter().filter(|d| d.op != Op::Delete).count() as u64;
        result.throughput = Throughput {
            operations,
            operations_per_second: operations as f64 / load_seconds,
            converged,
            converged_per_second: converged as f64 / load_seconds,
            reconcile_passes: report.passes as u64,
            manifests_at_end: uids.len() as u64,
            failed_requests: tracker.failed,
            superseded: tracker.superseded,
        };
        result.latency = Latencies {
            create_to_ready_seconds: measure::quantiles(&of(Op::Create)),
            update_to_ready_seconds: measure::quantiles(&of(Op::Update)),
            delete_to_gone_seconds: measure::quantiles(&of(Op::Delete)),
            queue_wait_seconds: measure::histogram_quantiles(&histogram_over_replicas(
                &observed,
                "module_manager_queue_wait_seconds",
            )),
        };
        if tracker.failed > 0 {
            self.progress.say(format!(
                "{} requests of the load generator failed, e.g. {:?}",
                tracker.failed, tracker.failures
            ));
        }
        drop(tracker);
        result.replicas = replica_figures(&observed, load_seconds);
        result.apiserver =
            apiserver_figures(&self.apiserver_before, &apiserver_after, apiserver_seconds);
        result.fleet.handover_gap_seconds = measure::histogram_quantiles(&histogram_over_replicas(
            &observed,
            "module_manager_fleet_handover_gap_seconds",
        ));
        result.fleet.max_unowned_seconds = observed
            .ownership
            .longest_unowned
            .values()
            .copied()
            .fold(0.0, f64::max);
        result.timeline = observed.timeline;
        result.duration_seconds = load_seconds;
        result.violations.extend(violations);
        Ok(self.fleet)
    }
}

/// The log lines of the first few overlapping passes, with their replicas' pauses.
fn overlap_lines(
    logs: &[(String, String)],
    report: &log_check::Report,
    pauses: &BTreeMap<String, Vec<(Timestamp, Timestamp)>>,
) -> String {
    let mut out = Vec::new();
    for overlap in report.overlaps.iter().take(3) {
        out.push(format!("overlap of {}:", overlap.uid));
        for (replica, id) in [&overlap.first, &overlap.second] {
            out.push(format!(
                "  {replica} #{id}, paused {:?}",
                pauses.get(replica)
            ));
            let id_field = format!("\"reconcile_id\":{id}");
            let lines = logs.iter().flat_map(|(_, log)| log.lines()).filter(|line| {
                line.contains(&overlap.uid)
                    && line.contains(replica.as_str())
                    && line
                        .split(&id_field)
                        .nth(1)
                        .is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_digit()))
            });
            out.extend(lines.take(20).map(|l| format!("    {l}")));
        }
    }
    out.join("\n")
}

/// Where local replicas of the phase in `namespace` log (one file per process start).
fn log_dir(namespace: &str) -> PathBuf {
    std::env::temp_dir()
        .join(format!("loadtest-logs-{}", std::process::id()))
        .join(namespace)
}

/// Moves the progress bar every half second with the figures of the moment.
fn spawn_ticker(
    load: &Load,
    sampler: &Sampler,
    progress: &Progress,
) -> tokio::task::JoinHandle<()> {
    let (load, observed, progress) = (load.clone(), sampler.observed.clone(), progress.clone());
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let (sent, converged, failed) = {
                let t = load.tracker.lock().unwrap();
                let converged = t.done.iter().filter(|d| d.op != Op::Delete).count();
                (t.sent.values().sum::<u64>(), converged, t.failed)
            };
            let (depth, unowned) = {
                let o = observed.lock().unwrap();
                let depth = o.timeline.last().map_or(0.0, |s| s.queue_depth);
                (depth, o.ownership.unowned_now())
            };
            progress.update(
                load.elapsed() as u64,
                format!(
                    "{} Manifests · {sent} sent · {converged} converged · {failed} failed · due {depth:.0} · unowned shards {unowned}",
                    load.live_count()
                ),
            );
        }
    })
}

pub async fn new_namespace(
    cluster: &Cluster<'_>,
    client: &Client,
    prefix: &str,
) -> anyhow::Result<String> {
    match cluster {
        Cluster::Local(cp) => Ok(cp.namespace(client, prefix).await?),
        Cluster::Deployed { run, .. } => {
            let ns: Namespace = serde_json::from_value(json!({
                "metadata": {"generateName": format!("{prefix}-"), "labels": {"loadtest-run": run}}
            }))?;
            let created = Api::<Namespace>::all(client.clone())
                .create(&PostParams::default(), &ns)
                .await
                .context("create the load's namespace")?;
            Ok(created.name_any())
        }
    }
}

/// The API server's own metrics.
pub async fn apiserver_metrics(client: &Client) -> anyhow::Result<Vec<PromSample>> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(request).await?;
    Ok(measure::parse_prometheus(&text))
}

/// Request rates of every client (the fleet, kube-controller-manager and the harness itself:
/// its load, watch and Lease reads) over `seconds`; a counter that went down (another API
/// server instance answered, or it restarted) counts as zero.
pub fn apiserver_figures(
    before: &[PromSample],
    after: &[PromSample],
    seconds: f64,
) -> ApiServerFigures {
    const NAME: &str = "apiserver_request_total";
    let rate = |label: &str| -> BTreeMap<String, f64> {
        let b = measure::sum_by(before, NAME, label);
        measure::sum_by(after, NAME, label)
            .into_iter()
            .map(|(k, v)| {
                let delta = v - b.get(&k).copied().unwrap_or(0.0);
                (k, delta / seconds)
            })
            .filter(|(_, r)| *r > 0.0)
            .collect()
    };
    let total =
        (measure::sum(after, NAME, &[]) - measure::sum(before, NAME, &[])).max(0.0) / seconds;
    ApiServerFigures {
        requests_per_second: total,
        by_verb: rate("verb"),
        by_resource: rate("resource"),
    }
}

/// A tracked histogram's increase over the window, summed over replicas.
pub fn histogram_over_replicas(observed: &Observed, name: &str) -> Vec<(f64, f64)> {
    let mut total: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for accumulated in observed.accumulated.values() {
        for (bound, count) in accumulated.histograms.get(name).into_iter().flatten() {
            total.entry(bound.to_bits()).or_insert((*bound, 0.0)).1 += count;
        }
    }
    let mut buckets: Vec<(f64, f64)> = total.into_values().collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
}

fn counter_increase(observed: &Observed, member: &str, name: &str) -> f64 {
    observed
        .accumulated
        .get(member)
        .and_then(|a| a.counters.get(name))
        .copied()
        .unwrap_or(0.0)
}

fn replica_figures(observed: &Observed, seconds: f64) -> Vec<ReplicaFigures> {
    let mut figures: Vec<ReplicaFigures> = observed
        .latest
        .iter()
        .map(|(member, latest)| {
            let rss = observed.rss_mib.get(member).cloned().unwrap_or_default();
            let cpu = observed.cpu_seconds.get(member).copied().unwrap_or(0.0);
            ReplicaFigures {
                name: member.clone(),
                passes: counter_increase(observed, member, "module_manager_reconcile_passes_total")
                    as u64,
                share: 0.0,
                shards_owned: measure::sum(
                    &latest.samples,
                    "module_manager_fleet_shards_owned",
                    &[],
                ) as u32,
                cpu_seconds: cpu,
                cpu_cores_mean: cpu / seconds,
                rss_mib_mean: if rss.is_empty() {
                    0.0
                } else {
                    rss.iter().sum::<f64>() / rss.len() as f64
                },
                rss_mib_max: rss.iter().copied().fold(0.0, f64::max),
            }
        })
        .collect();
    let total: u64 = figures.iter().map(|f| f.passes).sum();
    for f in &mut figures {
        f.share = if total == 0 {
            0.0
        } else {
            f.passes as f64 / total as f64
        };
    }
    figures
}

/// Waits until the shard Leases name exactly the assignment over ordinals `0..replicas`.
pub async fn wait_assignment(
    probe: &Probe,
    shards: u32,
    replicas: u32,
    limit: Duration,
) -> anyhow::Result<Duration> {
    let members: BTreeSet<String> = (0..replicas).map(|o| probe.member(o)).collect();
    let count = ShardCount::new(shards).context("shards must be a power of two")?;
    let want: Holders = test_support::fleet::assigned_holders(count, &members);
    let start = Instant::now();
    loop {
        let (_, holders) = read_leases(probe).await?;
        if holders == want {
            return Ok(start.elapsed());
        }
        if start.elapsed() > limit {
            let wrong = want
                .iter()
                .filter(|(k, h)| holders.get(k) != Some(h))
                .count();
            anyhow::bail!(
                "the shard Leases did not match the assignment over {members:?} within {limit:?} ({wrong} shards differ)"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Shards whose holder differs between two observations, and the step's figures.
pub async fn move_step(
    phase: &Phase,
    step: String,
    before: &Holders,
    after: &Holders,
    ideal_fraction: f64,
    settled: Duration,
) -> anyhow::Result<MoveStep> {
    let moved: BTreeSet<u32> = after
        .iter()
        .filter(|(k, h)| before.get(k) != Some(h))
        .map(|(k, _)| *k)
        .collect();
    let count = ShardCount::new(phase.fleet.shards).context("shards")?;
    let uids = phase.load.uids().await?;
    let manifests_moved = uids
        .iter()
        .filter(|uid| moved.contains(&count.shard_of(uid)))
        .count() as u64;
    let ideal = ideal_fraction * phase.fleet.shards as f64;
    Ok(MoveStep {
        step,
        shards_moved: moved.len() as u32,
        shards_ideal: ideal,
        manifests_moved,
        ratio: (ideal > 0.0).then(|| moved.len() as f64 / ideal),
        settled_seconds: settled.as_secs_f64(),
    })
}

/// Waits (up to 5 minutes) until no replica has started a reconcile pass for 3 s, so that a
/// burst does not compete with work left from before (a scaled-down fleet re-reads the
/// Manifests of the shards it gained).
pub async fn wait_idle(probe: &Probe, progress: &Progress) {
    let passes = || async {
        let mut total = 0.0;
        for ordinal in probe.ordinals().await.unwrap_or_default() {
            if let Ok(text) = probe.scrape(ordinal).await {
                let samples = measure::parse_prometheus(&text);
                total += measure::sum(&samples, "module_manager_reconcile_passes_total", &[])
                    + measure::sum(&samples, "module_manager_queue_in_flight", &[]);
            }
        }
        total
    };
    let start = Instant::now();
    let mut last = passes().await;
    let mut quiet_since = Instant::now();
    while start.elapsed() < Duration::from_secs(300) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = passes().await;
        if now != last {
            last = now;
            quiet_since = Instant::now();
        } else if quiet_since.elapsed() >= Duration::from_secs(3) {
            return;
        }
    }
    progress.say("the fleet did not go idle within 5 minutes; measuring anyway");
}

/// What [`timed_burst`] measured.
pub struct TimedBurst {
    pub burst: Burst,
    /// Create → Ready of each Manifest, seconds.
    pub latencies: Vec<f64>,
    /// From the first create to each Manifest's Ready, seconds, in order.
    pub ready_since_start: Vec<f64>,
    /// Where the Manifests are.
    pub namespace: String,
}

/// [`fleet_burst`] waiting up to `limit` for the last Manifest, with each Manifest's create →
/// Ready and the namespace.
pub async fn timed_burst(
    cluster: &Cluster<'_>,
    options: &Options,
    fleet: &Fleet,
    count: usize,
    prefix: &str,
    limit: Duration,
) -> anyhow::Result<TimedBurst> {
    let client = cluster.client().await?;
    let namespace = new_namespace(cluster, &client, prefix).await?;
    let load = burst_load(fleet, options, client, &namespace, None)?;
    timed_load_burst(&load, fleet, count, limit, namespace).await
}

/// A load for a burst in `namespace`, its Manifests selected by `fleet`.
pub fn burst_load(
    fleet: &Fleet,
    options: &Options,
    client: Client,
    namespace: &str,
    remote: Option<crate::load::RemoteShape>,
) -> anyhow::Result<Load> {
    let mut labels = fleet.manifest_labels.clone();
    labels.insert("loadtest-run".into(), namespace.to_owned());
    Ok(Load::new(
        client,
        namespace,
        "b",
        ManifestShape {
            chart: chart_spec(options)?,
            interval: options.drift_interval.clone(),
            labels,
            remote,
        },
    ))
}

/// `count` Manifests of `load` created at once, waited for up to `limit`: the time from the
/// first create to the last Ready, and each Manifest's create → Ready. Fails when one is not
/// Ready by then.
pub async fn timed_load_burst(
    load: &Load,
    fleet: &Fleet,
    count: usize,
    limit: Duration,
    namespace: String,
) -> anyhow::Result<TimedBurst> {
    let (timed, outstanding) =
        load_burst_beside(load, fleet, count, limit, namespace, async { Ok(()) }).await?;
    if !outstanding.is_empty() {
        let examples = load.not_ready().await.unwrap_or_default();
        anyhow::bail!(
            "{} of the burst's Manifests not Ready within {} s; for example: {}",
            outstanding.len(),
            limit.as_secs(),
            examples
                .iter()
                .take(3)
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    Ok(timed)
}

/// [`timed_load_burst`] with `beside` sent just before the creates (e.g. a Manifest not waited
/// for: it reaches the fleet's queues first), not failing when some Manifests are not Ready by
/// `limit`: the figures of those that were, and the operations still outstanding.
pub async fn load_burst_beside(
    load: &Load,
    fleet: &Fleet,
    count: usize,
    limit: Duration,
    namespace: String,
    beside: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<(TimedBurst, Vec<(String, Op, f64)>)> {
    let watch = load.spawn_watch();
    tokio::time::sleep(Duration::from_millis(500)).await; // the watch's initial list
    let start = Instant::now();
    if let Err(e) = beside.await {
        watch.abort();
        return Err(e);
    }
    load.burst(count).await;
    let outstanding = load.settle(limit).await;
    let seconds = start.elapsed().as_secs_f64();
    watch.abort();
    let (last, latencies, ready_since_start) = {
        let tracker = load.tracker.lock().unwrap();
        let first_sent = tracker.done.iter().map(|d| d.sent).fold(f64::MAX, f64::min);
        let mut ready: Vec<f64> = tracker
            .done
            .iter()
            .map(|d| d.sent + d.seconds - first_sent)
            .collect();
        ready.sort_by(f64::total_cmp);
        let last = ready.last().copied().unwrap_or(0.0);
        let latencies = tracker.done.iter().map(|d| d.seconds).collect();
        (last, latencies, ready)
    };
    let seconds = if last.is_finite() && last > 0.0 {
        last
    } else {
        seconds
    };
    let timed = TimedBurst {
        burst: Burst {
            parallelism: fleet.ordinals().await?.len() as u32,
            seconds,
            per_second: count as f64 / seconds,
        },
        latencies,
        ready_since_start,
        namespace,
    };
    Ok((timed, outstanding))
}

impl TimedBurst {
    /// How fast the burst became Ready.
    pub fn ready_timing(&self) -> ReadyTiming {
        let (first, half) = first_and_half(&self.ready_since_start);
        ReadyTiming {
            all_ready_seconds: self.burst.seconds,
            per_second: self.burst.per_second,
            create_to_ready_seconds: measure::quantiles(&self.latencies),
            first_ready_seconds: first,
            half_ready_seconds: half,
        }
    }
}

/// When the first Manifest and half of them were Ready, from the first create (`ready`: each
/// one's, in order).
pub fn first_and_half(ready: &[f64]) -> (Option<f64>, Option<f64>) {
    let half = ready.len().div_ceil(2);
    (
        ready.first().copied(),
        half.checked_sub(1).and_then(|i| ready.get(i).copied()),
    )
}

/// The paths without a fleet for one burst size: `count` releases (`r00000`…), each path
/// `replicas` × `--concurrency` releases at once (as many as the fleet's workers), each in a
/// new namespace, the chart rendered for it (in its namespace).
pub struct BaselinePaths<'a> {
    cluster: &'a Cluster<'a>,
    options: &'a Options,
    client: Client,
    helm: PathBuf,
    chart: PathBuf,
    names: Vec<String>,
    parallelism: usize,
}

impl<'a> BaselinePaths<'a> {
    pub async fn new(
        cluster: &'a Cluster<'a>,
        options: &'a Options,
        count: usize,
        replicas: usize,
    ) -> anyhow::Result<Self> {
        let client = cluster.client().await?;
        let helm = testenv::Tools::locate()?.helm;
        let chart = repo(options).join(&options.chart);
        Ok(Self {
            cluster,
            options,
            client,
            helm,
            chart,
            names: (0..count).map(|i| format!("r{i:05}")).collect(),
            parallelism: replicas * options.concurrency,
        })
    }

    /// The releases of a path: `objects` (the chart as the template release) for each name.
    fn releases<'r>(&'r self, objects: &'r [Value]) -> baseline::Releases<'r> {
        baseline::Releases {
            objects_template: objects,
            template_release: baseline::TEMPLATE_RELEASE,
            names: &self.names,
            parallelism: self.parallelism,
        }
    }

    /// The chart's objects as the template release in `namespace` (see
    /// [`baseline::for_release`]).
    async fn objects(&self, namespace: &str) -> anyhow::Result<Vec<Value>> {
        baseline::render_chart(
            &self.helm,
            &self.chart,
            baseline::TEMPLATE_RELEASE,
            namespace,
            &json!({"revision": 0}),
        )
        .await
    }

    /// A bare client server-side applying the releases' objects; and how many objects one
    /// release has.
    pub async fn bare_apply(&self, progress: &Progress) -> anyhow::Result<(Burst, u64)> {
        progress.say(format!(
            "baseline: a bare client server-side applying {} releases' objects, {} at once",
            self.names.len(),
            self.parallelism
        ));
        let namespace = new_namespace(self.cluster, &self.client, "burst-apply").await?;
        let objects = self.objects(&namespace).await?;
        let releases = self.releases(&objects);
        let burst = baseline::bare_apply(&self.client, &namespace, &releases).await?;
        Ok((burst, objects.len() as u64))
    }

    /// A bare client sending `writes` of an install per release ([`crate::manifest_writes`]).
    pub async fn manifest_writes(
        &self,
        writes: crate::manifest_writes::Writes,
        progress: &Progress,
    ) -> anyhow::Result<Burst> {
        progress.say(format!(
            "baseline: a bare client sending {writes:?} requests for {} installs, {} at once",
            self.names.len(),
            self.parallelism
        ));
        let namespace = new_namespace(self.cluster, &self.client, "burst-writes").await?;
        let chart = chart_spec(self.options)?;
        // The labels of a local fleet's bursts (no fleet selects these: the fleets are gone).
        let labels = BTreeMap::from([
            ("loadtest-fleet".to_owned(), "baseline".to_owned()),
            ("loadtest-run".to_owned(), namespace.clone()),
        ]);
        let shape = crate::manifest_writes::Shape {
            chart: &chart,
            interval: &self.options.drift_interval,
            labels: &labels,
            more_spec: None,
        };
        let objects = self.objects(&namespace).await?;
        crate::manifest_writes::bare_with_manifest_writes(
            &self.client,
            &namespace,
            &self.releases(&objects),
            &shape,
            writes,
        )
        .await
    }

    /// `helm upgrade --install` of the releases.
    pub async fn helm(&self, progress: &Progress) -> anyhow::Result<Burst> {
        progress.say(format!(
            "baseline: helm upgrade --install of {} releases, {} at once",
            self.names.len(),
            self.parallelism
        ));
        let namespace = new_namespace(self.cluster, &self.client, "burst-helm").await?;
        baseline::helm_install(
            &self.helm,
            &self.cluster.kubeconfig(),
            &self.chart,
            &namespace,
            &self.names,
            self.parallelism,
            baseline::HelmWait::HooksOnly,
        )
        .await
    }
}

/// `spec.chart` of the load's Manifests: `--chart-spec`, else `{"path": --chart}`.
pub fn chart_spec(options: &Options) -> anyhow::Result<Value> {
    match &options.chart_spec {
        Some(spec) => serde_json::from_str(spec).context("--chart-spec is not JSON"),
        None => Ok(json!({ "path": options.chart })),
    }
}
