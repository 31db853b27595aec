//! The `smoke` scenario through the `loadtest` binary, as a user runs it: its own control plane,
//! two replicas of the real `module-manager` scraped by a real Prometheus, a basic load, a
//! rolling update, small baselines; exit code 0 and the report's files, the dashboards' panels
//! and the alerts among them. Needs the `module-manager` binary built next to the test
//! (`cargo test --workspace` builds it) and Debian's `prometheus` (`hack/ensure-promtool.sh`).

mod common;

#[test]
fn the_smoke_scenario_passes_and_writes_its_report() {
    let (_out, dir, result) = common::run_short_passed(
        "smoke --duration-seconds 25 --warmup-seconds 8 --update-period-seconds 20 --burst 20",
    );
    assert!(
        dir.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("smoke-")
    );
    assert!(result["throughput"]["converged"].as_u64().unwrap() > 0);
    assert_eq!(result["fleet"]["moves"].as_array().unwrap().len(), 2);
    for path in ["fleet", "single_replica", "bare_apply", "helm"] {
        assert!(
            result["baselines"][path]["per_second"].as_f64().unwrap() > 0.0,
            "baseline {path}: {}",
            result["baselines"]
        );
    }
    let summary = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(summary.contains("PASSED"), "{summary}");
    assert!(summary.contains("## Dashboards and alerts"), "{summary}");
    dashboards_were_evaluated(&result, &dir);
    for chart in ["timeline.png", "replicas.png", "baselines.png"] {
        let bytes = std::fs::read(dir.join(chart)).unwrap();
        assert!(bytes.starts_with(b"\x89PNG"), "{chart}");
    }
}

/// Prometheus scraped both replicas through the rolling update (restarts on new ports), every
/// panel of the dashboard was queried with its variables filled, each panel not declared empty
/// drew series, and the rules were evaluated with none firing. (The run passing means the
/// checkers agreed; this says what they looked at.)
fn dashboards_were_evaluated(result: &serde_json::Value, dir: &std::path::Path) {
    let monitoring = &result["monitoring"];
    let dashboard = &monitoring["dashboards"][0];
    assert_eq!(dashboard["file"], "module-manager-overview.json");
    assert!(
        dashboard["variables"]["namespace"]
            .as_str()
            .unwrap()
            .starts_with("loadtest-mm"),
        "{}",
        dashboard["variables"]
    );
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 30, "{} panels", panels.len());
    for panel in panels {
        assert_eq!(panel["problems"], serde_json::json!([]), "{panel}");
        if panel["expected"] == "data" {
            assert!(
                !panel["series"].as_array().unwrap().is_empty(),
                "{}",
                panel["title"]
            );
        }
    }
    let replicas = panels.iter().find(|p| p["title"] == "Replicas reporting");
    let last = replicas.unwrap()["series"][0]["points"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()[1]
        .as_f64();
    assert_eq!(last, Some(2.0));
    let alerts = monitoring["alerts"].as_array().unwrap();
    assert!(alerts.len() >= 10);
    for alert in alerts {
        assert_eq!(alert["health"], "ok", "{alert}");
        assert_eq!(alert["firing_seconds"], 0.0, "{alert}");
    }
    let pngs = std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            let name = name.to_string_lossy();
            name.starts_with("dashboard-module-manager-overview-") && name.ends_with(".png")
        })
        .count();
    assert!(pngs >= 7, "{pngs} dashboard rows drawn");
}
