//! A local fleet: processes of the real `module-manager` binary named `<fleet>-<ordinal>`, run as
//! a StatefulSet controller would (a StatefulSet object says which ordinals are desired; the
//! caller starts and stops them to match), with their logs (one file per process start), admin
//! ports, signals and resource usage. The fleet tests and the load test build on it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use module_manager::api::Manifest;
use module_manager::shard::{ShardCount, assign};
use serde_json::json;

/// The flags every replica of a local fleet gets (besides its name and admin address).
#[derive(Clone, Debug)]
pub struct ReplicaSettings {
    /// The `module-manager` binary.
    pub binary: PathBuf,
    /// `--chart-root`, also the replicas' working directory (the repository, so that
    /// `tests/fixtures/charts/…` and `loadtest/charts/…` resolve).
    pub chart_root: PathBuf,
    pub helm: PathBuf,
    pub shards: u32,
    pub concurrency: usize,
    pub lease_duration_seconds: u64,
    pub renew_interval_seconds: u64,
    pub renew_deadline_seconds: u64,
    pub restart_grace_seconds: u64,
    /// `--handover-timeout-seconds`, if not the binary's default.
    pub handover_timeout_seconds: Option<u64>,
    /// Whether the replicas are told their StatefulSet (`--statefulset`); without it a
    /// graceful shutdown always hands over (the load test's fault injection for the move
    /// checker).
    pub statefulset: bool,
    /// `--manifest-selector`: the label selector of the Manifests the fleet reconciles.
    pub manifest_selector: String,
    /// Passed to every replica after the harness's own arguments (a later flag wins).
    pub extra_args: Vec<String>,
    /// Directory for the replicas' logs (one file per process start).
    pub log_dir: PathBuf,
}

impl ReplicaSettings {
    /// The fleet tests' settings: lease 4 s, renewed every 1 s, deadline 3 s, restart grace
    /// 30 s, handover 5 s, 8 workers, `--statefulset`, `shards` shards, the Manifests labelled
    /// `fleet-test=<fleet>`, the repository as chart root, then `extra_args`.
    pub fn short(
        binary: PathBuf,
        fleet: &str,
        shards: u32,
        extra_args: Vec<String>,
        log_dir: PathBuf,
    ) -> Self {
        Self {
            binary,
            chart_root: crate::repo(),
            helm: testenv::Tools::locate().expect("tools").helm,
            shards,
            concurrency: 8,
            lease_duration_seconds: 4,
            renew_interval_seconds: 1,
            renew_deadline_seconds: 3,
            restart_grace_seconds: 30,
            handover_timeout_seconds: Some(5),
            statefulset: true,
            manifest_selector: format!("fleet-test={fleet}"),
            extra_args,
            log_dir,
        }
    }
}

/// A replica process started by the harness.
pub struct Replica {
    pub process: testenv::Proc,
    /// Port of its admin API (on 127.0.0.1).
    pub admin: u16,
}

/// The running replica processes of one fleet, and how to start more.
pub struct LocalFleet {
    /// Fleet name: replicas are `<name>-<ordinal>`; also the StatefulSet's name.
    pub name: String,
    /// Namespace of the StatefulSet object and of the fleet's Leases.
    pub namespace: String,
    kubeconfig: PathBuf,
    /// Per ordinal, a kubeconfig of its own instead (e.g. through a proxy of the harness).
    kubeconfigs: BTreeMap<u32, PathBuf>,
    settings: ReplicaSettings,
    replicas: BTreeMap<u32, Replica>,
    starts: u32,
}

/// Each shard's holder once the shard Leases match the assignment over `members` (what
/// [`shard_holders`] reads then, without the epochs).
pub fn assigned_holders(
    shards: ShardCount,
    members: &BTreeSet<String>,
) -> BTreeMap<u32, Option<String>> {
    (0..)
        .zip(assign(shards, members))
        .map(|(shard, owner)| (shard, Some(owner)))
        .collect()
}

/// A fleet a test started with [`start_short`]: a client of the control plane, the fleet's
/// namespace and name, its processes and their logs.
pub struct ShortFleet {
    pub client: Client,
    pub namespace: String,
    pub name: String,
    pub local: LocalFleet,
    /// The replicas' logs (kept when `FLEET_KEEP_LOGS` is set).
    pub logs: tempfile::TempDir,
}

/// A fleet with the fleet tests' settings ([`ReplicaSettings::short`]) in a fresh namespace
/// `name` of `control_plane`, its StatefulSet object created and `replicas` replicas started,
/// their logs in a temporary directory `<log_prefix>-<name>-*` (kept when `FLEET_KEEP_LOGS`
/// is set).
pub async fn start_short(
    control_plane: &testenv::ControlPlane,
    binary: PathBuf,
    (log_prefix, name): (&str, &str),
    (replicas, shards): (u32, u32),
    extra_args: Vec<String>,
) -> ShortFleet {
    let logs = tempfile::Builder::new()
        .prefix(&format!("{log_prefix}-{name}-"))
        .disable_cleanup(std::env::var_os("FLEET_KEEP_LOGS").is_some())
        .tempdir()
        .expect("a log directory");
    let client = control_plane.client().await.unwrap();
    let namespace = control_plane.namespace(&client, name).await.unwrap();
    let log_dir = logs.path().to_owned();
    let settings = ReplicaSettings::short(binary, name, shards, extra_args, log_dir);
    let kubeconfig = control_plane.kubeconfig();
    let mut local = LocalFleet::create(&client, kubeconfig, &namespace, name, replicas, settings)
        .await
        .unwrap();
    for ordinal in 0..replicas {
        local.start(ordinal).unwrap();
    }
    let name = name.to_owned();
    ShortFleet {
        client,
        namespace,
        name,
        local,
        logs,
    }
}

impl LocalFleet {
    /// Creates the fleet's StatefulSet object (desired `replicas`) in `namespace` and returns
    /// the fleet with no process running yet. The control plane is the caller's.
    pub async fn create(
        client: &Client,
        kubeconfig: &Path,
        namespace: &str,
        name: &str,
        replicas: u32,
        settings: ReplicaSettings,
    ) -> anyhow::Result<Self> {
        let statefulset: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "serviceName": name,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "module-manager", "image": "module-manager"}]}
                }
            }
        }))?;
        // No kubelet runs the pods: if kube-controller-manager's StatefulSet controller runs,
        // it creates Pod objects that stay Pending, which nothing here reads. The replicas read
        // only `spec.replicas`.
        Api::<StatefulSet>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &statefulset)
            .await
            .context("create the fleet's StatefulSet object")?;
        std::fs::create_dir_all(&settings.log_dir)?;
        Ok(Self {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            kubeconfig: kubeconfig.to_owned(),
            kubeconfigs: BTreeMap::new(),
            settings,
            replicas: BTreeMap::new(),
            starts: 0,
        })
    }

    /// Replica name of `ordinal`.
    pub fn member(&self, ordinal: u32) -> String {
        format!("{}-{ordinal}", self.name)
    }

    pub fn settings(&self) -> &ReplicaSettings {
        &self.settings
    }

    /// Replica `ordinal` reaches the API server through `kubeconfig` from its next start on
    /// (the others through the fleet's).
    pub fn set_kubeconfig(&mut self, ordinal: u32, kubeconfig: PathBuf) {
        self.kubeconfigs.insert(ordinal, kubeconfig);
    }

    /// The running replicas by ordinal.
    pub fn replicas(&self) -> &BTreeMap<u32, Replica> {
        &self.replicas
    }

    /// Starts replica `ordinal` (a fresh log file per process).
    pub fn start(&mut self, ordinal: u32) -> anyhow::Result<&Replica> {
        let member = self.member(ordinal);
        let admin = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        self.starts += 1;
        let log = self
            .settings
            .log_dir
            .join(format!("{member}.{}.log", self.starts));
        let mut command = self.command(&member, admin);
        if let Some(kubeconfig) = self.kubeconfigs.get(&ordinal) {
            command.env("KUBECONFIG", kubeconfig);
        }
        let process = testenv::Proc::spawn(
            "module-manager",
            command,
            &log,
            testenv::Lifetime::TiedToThisProcess,
        )
        .with_context(|| format!("start {member} ({})", self.settings.binary.display()))?;
        self.replicas.insert(ordinal, Replica { process, admin });
        Ok(&self.replicas[&ordinal])
    }

    /// The command line of replica `member`.
    fn command(&self, member: &str, admin: u16) -> Command {
        let settings = &self.settings;
        let mut command = Command::new(&settings.binary);
        command
            .current_dir(&settings.chart_root)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "info,kube=warn")
            .args(["run", "--replica", member])
            .arg("--chart-root")
            .arg(&settings.chart_root)
            .arg("--helm")
            .arg(&settings.helm)
            .args(render_backend_flags())
            .args(crate::LOCAL_CHART_HOST_FLAGS)
            .args(["--shards", &settings.shards.to_string()])
            .args(["--fleet", &self.name])
            .args(["--lease-namespace", &self.namespace]);
        let seconds = [
            ("--lease-duration-seconds", settings.lease_duration_seconds),
            ("--renew-interval-seconds", settings.renew_interval_seconds),
            ("--renew-deadline-seconds", settings.renew_deadline_seconds),
            ("--restart-grace-seconds", settings.restart_grace_seconds),
        ];
        for (flag, value) in seconds {
            command.args([flag, &value.to_string()]);
        }
        if let Some(timeout) = settings.handover_timeout_seconds {
            command.args(["--handover-timeout-seconds", &timeout.to_string()]);
        }
        if settings.statefulset {
            command.args(["--statefulset", &self.name]);
        }
        command
            .args(["--manifest-selector", &settings.manifest_selector])
            .args(["--admin-address", &format!("127.0.0.1:{admin}")])
            .args(["--concurrency", &settings.concurrency.to_string()])
            .args(&settings.extra_args);
        command
    }

    /// Removes replica `ordinal` from the running ones, for the caller to stop.
    pub fn take(&mut self, ordinal: u32) -> Option<Replica> {
        self.replicas.remove(&ordinal)
    }

    /// Removes every replica, for the caller to stop.
    pub fn take_all(&mut self) -> Vec<Replica> {
        std::mem::take(&mut self.replicas).into_values().collect()
    }

    /// Sends `signal` to replica `ordinal`.
    pub fn signal(&self, ordinal: u32, signal: i32) -> anyhow::Result<()> {
        let replica = self
            .replicas
            .get(&ordinal)
            .with_context(|| format!("replica {ordinal} is not running"))?;
        self::signal(replica.process.pid(), signal)
    }

    /// GET `path` from replica `ordinal`'s admin API: (status, body).
    pub async fn get(&self, ordinal: u32, path: &str) -> anyhow::Result<(u16, String)> {
        let replica = self
            .replicas
            .get(&ordinal)
            .with_context(|| format!("replica {ordinal} is not running"))?;
        http_get(replica.admin, path).await
    }

    /// The end of every running replica's log (for error messages).
    pub fn tails(&self) -> String {
        self.replicas
            .iter()
            .map(|(o, r)| format!("--- {} ---\n{}", self.member(*o), r.process.log_tail()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Every log written so far as (file name, content), one per process start, sorted.
    pub fn logs(&self) -> anyhow::Result<Vec<(String, String)>> {
        let mut logs = Vec::new();
        for entry in std::fs::read_dir(&self.settings.log_dir)? {
            let path = entry?.path();
            if !path.is_file() {
                continue; // e.g. the harness's kubeconfigs of the replicas
            }
            logs.push((
                path.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into(),
                std::fs::read_to_string(&path)?,
            ));
        }
        logs.sort();
        Ok(logs)
    }
}

/// Sets the StatefulSet's `spec.replicas` (the desired ordinals the replicas read).
pub async fn set_desired(
    client: &Client,
    namespace: &str,
    statefulset: &str,
    replicas: u32,
) -> anyhow::Result<()> {
    Api::<StatefulSet>::namespaced(client.clone(), namespace)
        .patch(
            statefulset,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .context("scale the StatefulSet")?;
    Ok(())
}

/// Each shard's (holder, epoch) from the shard Leases of fleet `fleet` in `namespace`.
pub async fn shard_holders(
    client: &Client,
    namespace: &str,
    fleet: &str,
) -> anyhow::Result<BTreeMap<u32, (Option<String>, i32)>> {
    let prefix = format!("{fleet}-shard-");
    let labels = format!("modulemanager.io/fleet={fleet},modulemanager.io/lease=shard");
    let leases = Api::<Lease>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&labels))
        .await
        .context("list the shard Leases")?;
    Ok(leases
        .items
        .into_iter()
        .filter_map(|lease| {
            let shard = lease.name_any().strip_prefix(&prefix)?.parse().ok()?;
            let spec = lease.spec.unwrap_or_default();
            let holder = spec.holder_identity.filter(|h| !h.is_empty());
            Some((shard, (holder, spec.lease_transitions.unwrap_or(0))))
        })
        .collect())
}

/// Creates the Manifests `m<i>` for `i` in `numbers`: the `tiny` chart, labelled
/// `fleet-test=<fleet>` (what the fleet tests' `--manifest-selector` selects).
pub async fn create_tiny_manifests(
    api: &Api<Manifest>,
    fleet: &str,
    numbers: std::ops::Range<usize>,
) -> anyhow::Result<()> {
    for i in numbers {
        let manifest: Manifest = serde_json::from_value(json!({
            "apiVersion": "modulemanager.io/v1alpha1",
            "kind": "Manifest",
            "metadata": {"name": format!("m{i}"), "labels": {"fleet-test": fleet}},
            "spec": {
                "module": "tiny",
                "chart": {"path": "tests/fixtures/charts/tiny"},
                "values": {"n": 0},
                "interval": "1h"
            }
        }))?;
        api.create(&PostParams::default(), &manifest)
            .await
            .with_context(|| format!("create m{i}"))?;
    }
    Ok(())
}

/// Sets every Manifest's `spec.values.n` to `n` (a new generation each must reconcile).
pub async fn touch_all(api: &Api<Manifest>, n: u64) -> anyhow::Result<()> {
    for manifest in api.list(&ListParams::default()).await? {
        let patch = Patch::Merge(json!({"spec": {"values": {"n": n}}}));
        api.patch(&manifest.name_any(), &PatchParams::default(), &patch)
            .await
            .with_context(|| format!("change {}", manifest.name_any()))?;
    }
    Ok(())
}

/// kill(2).
pub fn signal(pid: u32, signal: i32) -> anyhow::Result<()> {
    // SAFETY: kill(2) with a positive pid has no memory effects.
    if unsafe { libc::kill(pid as libc::pid_t, signal) } != 0 {
        bail!("kill({pid}, {signal}): {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// SIGTERM every replica at once (SIGCONT first, in case it is paused) and wait for them
/// (SIGKILL after `grace`).
pub async fn stop_all(replicas: Vec<Replica>, grace: Duration) {
    let waits = replicas.into_iter().map(|mut r| {
        tokio::task::spawn_blocking(move || {
            let _ = signal(r.process.pid(), libc::SIGCONT);
            r.process.stop(grace)
        })
    });
    futures::future::join_all(waits).await;
}

/// A minimal HTTP/1.0 GET to the loopback admin API: (status, body). Bounded by 10 s.
pub async fn http_get(port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
            .await?;
        let mut answer = Vec::new();
        stream
            .take(64 * 1024 * 1024)
            .read_to_end(&mut answer)
            .await?;
        anyhow::Ok(String::from_utf8_lossy(&answer).into_owned())
    };
    let answer = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .context("admin API: timed out")??;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("admin API: no HTTP status line")?;
    Ok((status, body.to_owned()))
}

/// (CPU seconds incl. waited-for children, RSS bytes) of a process, from `/proc`.
pub fn proc_usage(pid: u32) -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let cpu = cpu_seconds_from_stat(&stat)?;
    Some((cpu, rss_bytes(pid)?))
}

/// Resident bytes of a process (`VmRSS` of `/proc/<pid>/status`); `None` when it is gone or a
/// zombie (which has no such line).
pub fn rss_bytes(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(rss_kib * 1024.0)
}

/// utime + stime + cutime + cstime of a `/proc/<pid>/stat` line, in seconds.
pub fn cpu_seconds_from_stat(stat: &str) -> Option<f64> {
    // The command name (field 2) is in parentheses and may contain anything: fields after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime..cstime are fields 14..17.
    let ticks: f64 = fields
        .get(11..15)?
        .iter()
        .map(|f| f.parse::<f64>().ok())
        .sum::<Option<f64>>()?;
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(ticks / hz)
}

/// `--render-backend` (and `--renderer`) as [`crate::render_backend`] chooses: the replicas
/// render as the in-process tests do.
fn render_backend_flags() -> Vec<std::ffi::OsString> {
    match crate::render_backend() {
        Ok(module_manager::render::Backend::Renderer(path)) => vec![
            "--render-backend".into(),
            "renderer".into(),
            "--renderer".into(),
            path.into(),
        ],
        // The harness's own `--helm` (settings.helm) renders.
        Ok(module_manager::render::Backend::Helm(_)) | Err(_) => {
            vec!["--render-backend".into(), "helm".into()]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_from_a_stat_line_with_a_hostile_command_name() {
        // SAFETY: as above.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let line = "42 (a) (b c) S 1 42 42 0 -1 4194560 100 0 0 0 30 20 7 3 20 0 1 0 100 0 0";
        assert_eq!(cpu_seconds_from_stat(line), Some(60.0 / hz));
        assert_eq!(cpu_seconds_from_stat("42 (x) S 1"), None);
    }

    #[test]
    fn own_usage_is_readable() {
        let (cpu, rss) = proc_usage(std::process::id()).unwrap();
        assert!(cpu >= 0.0);
        assert!(rss > 1024.0 * 1024.0, "{rss}");
    }
}
