//! The Prometheus server of a run: Debian's `prometheus` (the package `hack/ensure-promtool.sh`
//! installs for promtool), listening on 127.0.0.1 only, its configuration, rules and data in a
//! temporary directory of the run, stopped (and the directory removed) when dropped.
//!
//! Its configuration (pure, [`config`]) scrapes one job, `module-manager`, from a file of
//! targets the harness rewrites as replicas start and stop ([`super::targets`]), every
//! `scrape` seconds, and evaluates the alert rules of `deploy/monitoring/prometheusrule.yaml`
//! ([`rules_file`]: the PrometheusRule's `spec`, a plain rules file) as often.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;
use serde_yaml_ng::Value as Yaml;

use super::api::Api;

/// The job every replica is scraped as (the alerts' `up{job=~".*module-manager.*"}`).
pub const JOB: &str = "module-manager";

/// Environment variable naming the server binary (default: `prometheus` on `PATH`).
pub const PROMETHEUS_ENV: &str = "PROMETHEUS";

/// What to do when the server is missing.
const INSTALL_HINT: &str = "run hack/ensure-promtool.sh (`make setup` does) to install Debian's \
                            prometheus package, name the binary in PROMETHEUS, or pass \
                            --no-prometheus to run without the dashboards and alerts";

/// A running server.
pub struct Server {
    process: testenv::Proc,
    pub api: Api,
    pub version: String,
    /// Holds the configuration, rules, targets file, data and log.
    dir: tempfile::TempDir,
}

/// The files of a server's directory.
pub struct Files {
    pub config: PathBuf,
    pub rules: PathBuf,
    pub targets: PathBuf,
}

impl Files {
    fn in_dir(dir: &Path) -> Self {
        Self {
            config: dir.join("prometheus.yml"),
            rules: dir.join("rules.yaml"),
            targets: dir.join("targets.json"),
        }
    }
}

/// The server binary: [`PROMETHEUS_ENV`], else `prometheus` on `PATH`.
pub fn locate() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(PROMETHEUS_ENV) {
        let path = PathBuf::from(path);
        anyhow::ensure!(
            path.is_file(),
            "{PROMETHEUS_ENV}={} is not a file: {INSTALL_HINT}",
            path.display()
        );
        return Ok(path);
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join("prometheus"))
        .find(|candidate| candidate.is_file())
        .with_context(|| format!("the prometheus server is not on PATH: {INSTALL_HINT}"))
}

/// The rules file of a PrometheusRule object (its `spec`), and the names of its alerts.
pub fn rules_file(prometheus_rule: &str) -> anyhow::Result<(String, Vec<String>)> {
    let object: Yaml = serde_yaml_ng::from_str(prometheus_rule).context("not YAML")?;
    anyhow::ensure!(
        object["kind"].as_str() == Some("PrometheusRule"),
        "not a PrometheusRule (kind {:?})",
        object["kind"]
    );
    let spec = &object["spec"];
    let groups = spec["groups"]
        .as_sequence()
        .filter(|g| !g.is_empty())
        .context("the PrometheusRule has no spec.groups")?;
    let alerts = groups
        .iter()
        .flat_map(|g| g["rules"].as_sequence().into_iter().flatten())
        .filter_map(|r| r["alert"].as_str().map(str::to_owned))
        .collect();
    Ok((serde_yaml_ng::to_string(spec)?, alerts))
}

/// The server's configuration (JSON, which YAML reads as it is).
pub fn config(files: &Files, scrape: Duration) -> String {
    let every = format!("{}ms", scrape.as_millis());
    let config = json!({
        "global": {
            "scrape_interval": every,
            "scrape_timeout": every,
            "evaluation_interval": every,
        },
        "rule_files": [files.rules],
        "scrape_configs": [{
            "job_name": JOB,
            "file_sd_configs": [{"files": [files.targets], "refresh_interval": every}],
        }],
    });
    serde_json::to_string_pretty(&config).unwrap_or_default()
}

impl Server {
    /// Starts `binary` with the rules of `prometheus_rule` (a PrometheusRule's YAML), scraping
    /// the targets of [`Server::targets_file`] every `scrape`; returns once it is ready, with
    /// the alert names it loaded.
    pub async fn start(
        binary: &Path,
        prometheus_rule: &str,
        scrape: Duration,
    ) -> anyhow::Result<(Self, Vec<String>)> {
        let (rules, alerts) = rules_file(prometheus_rule)
            .context("read the alert rules (deploy/monitoring/prometheusrule.yaml)")?;
        let dir = tempfile::Builder::new()
            .prefix("loadtest-prometheus-")
            .tempdir()
            .context("create Prometheus' directory")?;
        let files = Files::in_dir(dir.path());
        std::fs::write(&files.rules, rules)?;
        std::fs::write(&files.targets, "[]")?;
        std::fs::write(&files.config, config(&files, scrape))?;
        let version = version(binary)?;
        let port = free_port()?;
        let mut command = Command::new(binary);
        command
            .arg(format!("--config.file={}", files.config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn");
        let process = testenv::Proc::spawn(
            "prometheus",
            command,
            &dir.path().join("prometheus.log"),
            testenv::Lifetime::TiedToThisProcess,
        )
        .with_context(|| format!("start {}", binary.display()))?;
        let mut server = Self {
            process,
            api: Api { port },
            version,
            dir,
        };
        server.wait_ready(Duration::from_secs(30)).await?;
        Ok((server, alerts))
    }

    async fn wait_ready(&mut self, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            self.process
                .check_running()
                .context("Prometheus exited while starting")?;
            if self.api.ready().await {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "Prometheus not ready within {limit:?}:\n{}",
                    self.process.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The file of targets the server scrapes (`file_sd` JSON).
    pub fn targets_file(&self) -> PathBuf {
        Files::in_dir(self.dir.path()).targets
    }

    /// Stops the server (SIGTERM, then SIGKILL) and removes its directory.
    pub fn stop(mut self) {
        self.process.stop(Duration::from_secs(10));
    }
}

/// `prometheus --version`'s first line.
fn version(binary: &Path) -> anyhow::Result<String> {
    let out = Command::new(binary)
        .arg("--version")
        .output()
        .with_context(|| format!("run {} --version", binary.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(text.lines().next().unwrap_or_default().trim().to_owned())
}

fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("pick a free port")?;
    Ok(listener.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_file_is_the_prometheus_rules_spec() {
        let object = [
            "apiVersion: monitoring.coreos.com/v1",
            "kind: PrometheusRule",
            "metadata: {name: x}",
            "spec:",
            "  groups:",
            "    - name: g",
            "      rules:",
            "        - alert: A",
            "          expr: up == 0",
            "        - record: r",
            "          expr: up",
        ]
        .join("\n");
        let (file, alerts) = rules_file(&object).unwrap();
        assert_eq!(alerts, ["A"]);
        let parsed: Yaml = serde_yaml_ng::from_str(&file).unwrap();
        assert_eq!(
            parsed["groups"][0]["rules"][0]["expr"].as_str(),
            Some("up == 0")
        );
        assert!(parsed.get("kind").is_none());
        assert!(rules_file("kind: ConfigMap").is_err());
        assert!(rules_file("kind: PrometheusRule\nspec: {groups: []}").is_err());
    }

    #[test]
    fn the_repository_rules_have_alerts() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring/prometheusrule.yaml");
        let (_, alerts) = rules_file(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert!(alerts.iter().any(|a| a == "ModuleManagerUnownedShards"));
    }

    #[test]
    fn the_configuration_scrapes_the_targets_file_and_loads_the_rules() {
        let files = Files::in_dir(Path::new("/run/x"));
        let text = config(&files, Duration::from_secs(1));
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed["global"]["scrape_interval"], "1000ms");
        assert_eq!(parsed["rule_files"][0], "/run/x/rules.yaml");
        let job = &parsed["scrape_configs"][0];
        assert_eq!(job["job_name"], JOB);
        assert_eq!(job["file_sd_configs"][0]["files"][0], "/run/x/targets.json");
    }
}
