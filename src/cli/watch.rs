//! `get -w`: after the table, a row each time a Manifest changes or is deleted, as `kubectl get
//! -w` prints them, until interrupted (Ctrl-C). A kube-runtime watcher follows the Manifests
//! (re-listing after a lost watch); [`Seen`] keeps one resourceVersion per live Manifest, so
//! that a re-list prints only what changed.

use std::collections::{HashMap, HashSet};
use std::io::Write;

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

use super::tables::{aligned, column_widths};
use super::views::{PathVersion, manifest_row, manifests_header};
use crate::api::Manifest;

/// The resourceVersion of each Manifest shown, by `namespace/name`.
#[derive(Debug, Default)]
pub struct Seen {
    versions: HashMap<String, String>,
    /// During a re-list: the Manifests listed so far.
    relisted: Option<HashSet<String>>,
}

fn key(manifest: &Manifest) -> String {
    format!(
        "{}/{}",
        manifest.namespace().unwrap_or_default(),
        manifest.name_any()
    )
}

impl Seen {
    /// The Manifests of the table already printed.
    pub fn new(shown: &[Manifest]) -> Self {
        let versions = shown
            .iter()
            .map(|m| (key(m), m.resource_version().unwrap_or_default()))
            .collect();
        Self {
            versions,
            relisted: None,
        }
    }

    /// The Manifest to print a row of for `event`: one that changed since it was last shown,
    /// or was deleted.
    pub fn row_for(&mut self, event: watcher::Event<Manifest>) -> Option<Manifest> {
        match event {
            watcher::Event::Apply(manifest) | watcher::Event::InitApply(manifest) => {
                let key = key(&manifest);
                if let Some(listed) = &mut self.relisted {
                    listed.insert(key.clone());
                }
                let version = manifest.resource_version().unwrap_or_default();
                let known = self.versions.insert(key, version.clone());
                (known.as_deref() != Some(version.as_str())).then_some(manifest)
            }
            watcher::Event::Delete(manifest) => {
                self.versions.remove(&key(&manifest));
                Some(manifest)
            }
            watcher::Event::Init => {
                self.relisted = Some(HashSet::new());
                None
            }
            watcher::Event::InitDone => {
                // Deleted while no watch ran: forgotten (no object is left to print).
                if let Some(listed) = self.relisted.take() {
                    self.versions.retain(|key, _| listed.contains(key));
                }
                None
            }
        }
    }
}

/// Follows the Manifests of `api` (only `name` when given) after `shown` was printed as a table,
/// writing a row to `out` per change, aligned with that table (its header first when it was
/// empty). Returns only when the output cannot be written; a watch error is reported on stderr
/// and retried with backoff.
pub async fn follow(
    api: Api<Manifest>,
    name: Option<&str>,
    shown: &[Manifest],
    all_namespaces: bool,
    path_version: PathVersion<'_>,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let now = Timestamp::now();
    let mut rows = vec![manifests_header(all_namespaces)];
    rows.extend(
        shown
            .iter()
            .map(|m| manifest_row(m, all_namespaces, now, path_version)),
    );
    let widths = column_widths(&rows);
    let mut header_due = shown.is_empty();
    let mut seen = Seen::new(shown);
    let mut config = watcher::Config::default();
    if let Some(name) = name {
        config = config.fields(&format!("metadata.name={name}"));
    }
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    // Until the watch has listed once, an error ends the command (no `watch` permission, no
    // CRD: retrying would print the same error forever, where `kubectl get -w` exits 1).
    let mut listed = false;
    while let Some(event) = events.next().await {
        let manifest = match event {
            Ok(event) => {
                listed |= matches!(event, watcher::Event::InitDone);
                seen.row_for(event)
            }
            Err(error) if !listed => anyhow::bail!("watch the Manifests: {error}"),
            Err(error) => {
                eprintln!("error: watch the Manifests (retrying): {error}");
                None
            }
        };
        let Some(manifest) = manifest else { continue };
        if std::mem::take(&mut header_due) {
            out.write_all(aligned(&rows[0], &widths).as_bytes())?;
        }
        let row = manifest_row(&manifest, all_namespaces, Timestamp::now(), path_version);
        out.write_all(aligned(&row, &widths).as_bytes())?;
        out.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn manifest(name: &str, version: &str) -> Manifest {
        serde_json::from_value(json!({
            "apiVersion": "modulemanager.io/v1alpha1", "kind": "Manifest",
            "metadata": {"name": name, "namespace": "apps", "resourceVersion": version},
            "spec": {"module": name, "chart": {"path": "charts/web"}},
        }))
        .unwrap()
    }

    fn name(row: Option<Manifest>) -> Option<String> {
        row.map(|m| m.name_any())
    }

    #[test]
    fn a_row_is_printed_per_change_and_a_relist_prints_only_what_changed() {
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        let mut seen = Seen::new(&[manifest("web", "1"), manifest("api", "1")]);
        // The watcher's own first list: nothing changed since the table.
        for event in [
            Init,
            InitApply(manifest("web", "1")),
            InitApply(manifest("api", "1")),
            InitDone,
        ] {
            assert_eq!(name(seen.row_for(event)), None);
        }
        assert_eq!(
            name(seen.row_for(Apply(manifest("web", "2")))).as_deref(),
            Some("web")
        );
        assert_eq!(
            name(seen.row_for(Apply(manifest("new", "3")))).as_deref(),
            Some("new")
        );
        assert_eq!(seen.versions.len(), 3);
        assert_eq!(
            name(seen.row_for(Delete(manifest("new", "4")))).as_deref(),
            Some("new")
        );
        assert_eq!(seen.versions.len(), 2);
        // A re-list after a lost watch: only `api` changed, `web` is gone and forgotten.
        assert_eq!(name(seen.row_for(Init)), None);
        assert_eq!(
            name(seen.row_for(InitApply(manifest("api", "5")))).as_deref(),
            Some("api")
        );
        assert_eq!(name(seen.row_for(InitDone)), None);
        assert_eq!(seen.versions.len(), 1);
    }
}
