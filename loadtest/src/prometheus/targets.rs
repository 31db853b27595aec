//! The replicas Prometheus scrapes: a `file_sd` file naming each running local replica's admin
//! address with the labels a ServiceMonitor would give its pod (`namespace`, `pod`; `instance`
//! is the pod too, so that a restarted replica, on a new port, continues its series). A task
//! follows the fleet: when a replica starts, stops or restarts, the file is rewritten (a new
//! file renamed over the old, as Prometheus' file discovery wants) and Prometheus, which
//! watches it, scrapes the new set.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde_json::json;

use crate::fleet::Probe;

/// How often the fleet's replicas are compared with the file.
const FOLLOW_EVERY: Duration = Duration::from_millis(200);

/// The `file_sd` JSON for `replicas` (member name → admin port on 127.0.0.1) in `namespace`.
pub fn file_sd(namespace: &str, replicas: &BTreeMap<String, u16>) -> String {
    let groups: Vec<_> = replicas
        .iter()
        .map(|(member, port)| {
            json!({
                "targets": [format!("127.0.0.1:{port}")],
                "labels": {"namespace": namespace, "pod": member, "instance": member},
            })
        })
        .collect();
    serde_json::Value::Array(groups).to_string()
}

/// Writes `contents` to `path` through a new file renamed over it.
fn replace(path: &Path, contents: &str) -> anyhow::Result<()> {
    let new = path.with_extension("json.new");
    std::fs::write(&new, contents).with_context(|| format!("write {}", new.display()))?;
    std::fs::rename(&new, path).with_context(|| format!("replace {}", path.display()))
}

/// The task keeping the file current; dropping it stops the task.
pub struct Follower(tokio::task::JoinHandle<()>);

impl Drop for Follower {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Keeps `file` naming the running replicas of `probe`'s fleet until the [`Follower`] is
/// dropped.
pub fn follow(probe: Probe, namespace: String, file: PathBuf) -> Follower {
    Follower(tokio::spawn(async move {
        let mut written: Option<BTreeMap<String, u16>> = None;
        loop {
            let now: BTreeMap<String, u16> = probe
                .admin_ports()
                .into_iter()
                .map(|(ordinal, port)| (probe.member(ordinal), port))
                .collect();
            if written.as_ref() != Some(&now) {
                match replace(&file, &file_sd(&namespace, &now)) {
                    Ok(()) => written = Some(now),
                    Err(e) => eprintln!("loadtest: Prometheus targets: {e:#}"),
                }
            }
            tokio::time::sleep(FOLLOW_EVERY).await;
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_replica_is_a_target_labelled_as_its_pod() {
        let replicas = BTreeMap::from([("mm-0".to_owned(), 4000), ("mm-1".to_owned(), 4001)]);
        let parsed: serde_json::Value =
            serde_json::from_str(&file_sd("loadtest-mm-x", &replicas)).unwrap();
        assert_eq!(parsed.as_array().unwrap().len(), 2);
        assert_eq!(parsed[1]["targets"][0], "127.0.0.1:4001");
        assert_eq!(parsed[1]["labels"]["pod"], "mm-1");
        assert_eq!(parsed[1]["labels"]["instance"], "mm-1");
        assert_eq!(parsed[1]["labels"]["namespace"], "loadtest-mm-x");
        assert_eq!(file_sd("n", &BTreeMap::new()), "[]");
    }
}
