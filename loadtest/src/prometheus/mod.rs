//! The dashboards and alerts seen working: a real Prometheus ([`server`]) scrapes every replica
//! of a local fleet during the run ([`targets`] follows restarts) and evaluates the alert rules
//! of `deploy/monitoring/prometheusrule.yaml`; afterwards every panel query of every dashboard
//! in `deploy/monitoring/dashboards/` is evaluated over the run's window as Grafana would
//! ([`dashboard`], [`grafana`], [`evaluate`]), and the alerts' states are read back
//! ([`alerts`] says what each may do). The checkers ([`verdict`]) judge the figures; the
//! report draws the panels.

pub mod alerts;
pub mod api;
pub mod dashboard;
pub mod evaluate;
pub mod grafana;
pub mod server;
pub mod targets;
pub mod units;
pub mod verdict;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use crate::fleet::Probe;
use crate::results::{AlertFigures, Monitoring};

/// A Prometheus watching a fleet.
pub struct Monitor {
    server: server::Server,
    /// Stops following the fleet when dropped.
    follower: targets::Follower,
    alerts: Vec<String>,
    scrape: Duration,
    start: f64,
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `deploy/monitoring/` of the repository.
fn monitoring_dir(repo: &Path) -> PathBuf {
    repo.join("deploy/monitoring")
}

impl Monitor {
    /// Starts Prometheus with the repository's alert rules, scraping `probe`'s replicas (as
    /// pods of `namespace`) every `scrape`.
    pub async fn start(
        repo: &Path,
        probe: &Probe,
        namespace: &str,
        scrape: Duration,
    ) -> anyhow::Result<Self> {
        let binary = server::locate()?;
        let rules_path = monitoring_dir(repo).join("prometheusrule.yaml");
        let rules = std::fs::read_to_string(&rules_path)
            .with_context(|| format!("read {}", rules_path.display()))?;
        let (server, alerts) = server::Server::start(&binary, &rules, scrape)
            .await
            .context("start Prometheus")?;
        let follower = targets::follow(probe.clone(), namespace.to_owned(), server.targets_file());
        Ok(Self {
            server,
            follower,
            alerts,
            scrape,
            start: unix_now(),
        })
    }

    /// Evaluates every dashboard of the repository and reads the alerts over the window from
    /// the start until now, then stops Prometheus. `faults`: the run injected faults.
    pub async fn finish(self, repo: &Path, faults: bool) -> anyhow::Result<Monitoring> {
        // The last scrapes and rule evaluations of the window.
        tokio::time::sleep(self.scrape * 2).await;
        let end = unix_now();
        let window = evaluate::Window {
            start: self.start,
            end,
            scrape_ms: self.scrape.as_millis() as u64,
        };
        let api = self.server.api;
        let mut dashboards = Vec::new();
        for (file, dashboard) in read_dashboards(&monitoring_dir(repo).join("dashboards"))? {
            dashboards.push(evaluate::dashboard(&api, &file, &dashboard, window).await);
        }
        let alerts = read_alerts(&api, &self.alerts, window, faults).await?;
        let figures = Monitoring {
            prometheus: self.server.version.clone(),
            scrape_interval_seconds: self.scrape.as_secs_f64(),
            window_seconds: end - self.start,
            faults,
            dashboards,
            alerts,
        };
        drop(self.follower);
        self.server.stop();
        Ok(figures)
    }
}

/// Every `*.json` of `dir`, parsed, by file name.
fn read_dashboards(dir: &Path) -> anyhow::Result<Vec<(String, dashboard::Dashboard)>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|path| {
            let name = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("read {}", path.display()))?;
            let json = serde_json::from_str(&text).with_context(|| format!("{name}: not JSON"))?;
            Ok((name.clone(), dashboard::Dashboard::parse(&name, &json)?))
        })
        .collect()
}

/// Each alert's health and the seconds it was pending and firing in the window.
async fn read_alerts(
    api: &api::Api,
    names: &[String],
    window: evaluate::Window,
    faults: bool,
) -> anyhow::Result<Vec<AlertFigures>> {
    let rules = api.rules().await.context("read the rules' state")?;
    let seconds = (window.end - window.start).ceil().max(1.0);
    let states = api
        .query(
            &format!("sum by (alertname, alertstate) (count_over_time(ALERTS[{seconds}s]))"),
            window.end,
        )
        .await
        .context("read ALERTS")?;
    let evaluation = window.scrape_ms as f64 / 1000.0;
    let time_in = |name: &str, state: &str| {
        states
            .iter()
            .filter(|s| s.labels.get("alertname").is_some_and(|a| a == name))
            .filter(|s| s.labels.get("alertstate").is_some_and(|a| a == state))
            .flat_map(|s| s.points.iter().map(|p| p.1))
            // An empty sum is -0.0.
            .fold(0.0, |total, n| total + n)
            * evaluation
    };
    Ok(names
        .iter()
        .map(|name| {
            let rule = rules.iter().find(|r| &r.name == name);
            AlertFigures {
                name: name.clone(),
                group: rule.map(|r| r.group.clone()).unwrap_or_default(),
                health: rule.map_or_else(|| "not loaded".to_owned(), |r| r.health.clone()),
                last_error: rule.map(|r| r.last_error.clone()).unwrap_or_default(),
                pending_seconds: time_in(name, "pending"),
                firing_seconds: time_in(name, "firing"),
                expected: alerts::expect(name, faults).name().to_owned(),
            }
        })
        .collect())
}
