//! Drift modes on the wire (`spec.drift`): what a drift pass found on each object it looks at,
//! a warn-mode look that writes nothing, and the take-over of other managers' fields before an
//! enabled-mode apply reverts them. Decisions in `plan::drift_report` (docs/reconcile.md,
//! "Drift modes and foreign managers").

use std::sync::Mutex;

use kube::ResourceExt;
use kube::api::DynamicObject;

use super::error::ReconcileError;
use crate::api::{DriftMode, InventoryEntry};
use crate::apply::{ApplyError, Cluster, FIELD_MANAGER, MANIFEST_UID_LABEL};
use crate::plan::diff::{ObjectChange, object_change};
use crate::plan::drift::Pointer;
use crate::plan::drift_report::{self, DriftedObject, MAX_PATHS};
use crate::plan::status::DriftCondition;
use crate::plan::{RenderedObject, describe};
use crate::shard::fence::Fence;
use crate::telemetry::metrics::{DriftLabels, ReconcileMetrics};

/// What a pass's drift checks found (shared by its CRD and object applies).
#[derive(Debug, Default)]
pub(super) struct Findings {
    /// Whether this pass's object loop ran as a checking one ([`DriftCheck::begin`]): a pass
    /// that only re-reads a rollout looks at nothing and reports nothing.
    checked: bool,
    found: Vec<DriftedObject>,
}

/// The drift side of a pass: its mode, the managers it overrides, what it found.
#[derive(Debug)]
pub(super) struct DriftCheck {
    /// `spec.drift.mode`.
    pub mode: DriftMode,
    /// The managers whose fields are taken over before an apply (checked, deduplicated).
    pub override_managers: Vec<String>,
    /// Whether this pass checks objects (a drift pass in `enabled` or `warn` mode).
    pub active: bool,
    /// Whether this pass takes over the override managers' fields before it applies an object
    /// that exists (every drift pass in `enabled` mode, when there are such managers).
    pub takes_over: bool,
    findings: Mutex<Findings>,
}

/// The object as read before a checked apply: `None` when it is missing.
pub(super) type Before = Option<DynamicObject>;

impl DriftCheck {
    /// A check for a pass in `mode`: `drift_pass` when nothing changed since the last pass
    /// that applied everything, `active` when it is one that checks.
    pub fn new(
        mode: DriftMode,
        override_managers: Vec<String>,
        drift_pass: bool,
        active: bool,
    ) -> Self {
        let takes_over = drift_pass && mode == DriftMode::Enabled && !override_managers.is_empty();
        Self {
            mode,
            override_managers,
            active,
            takes_over,
            findings: Mutex::new(Findings::default()),
        }
    }

    /// The pass applies (or looks at) its objects — not a re-check of a rollout, not the CRD
    /// phase alone: from here on an active check reports what it finds.
    pub fn begin(&self) {
        let mut findings = self.findings.lock().unwrap_or_else(|e| e.into_inner());
        findings.checked = self.active;
    }

    /// Whether this pass only looks at an object (`exists`: applied before): a warn-mode drift
    /// check writes nothing ([`Self::look`]).
    pub fn looks_only(&self, exists: bool) -> bool {
        self.active && exists && self.mode == DriftMode::Warn
    }

    /// Whether an enabled-mode apply of an object that exists reads it first
    /// ([`Self::before_apply`]).
    pub fn reads_before_apply(&self) -> bool {
        self.mode == DriftMode::Enabled && (self.active || self.takes_over)
    }

    /// Records `id` as drifted (paths empty: missing), counted in the metric.
    fn record(&self, metrics: &ReconcileMetrics, id: &InventoryEntry, paths: Vec<String>) {
        let mode = match self.mode {
            DriftMode::Warn => "warn",
            _ => "enabled",
        };
        metrics.drifted.get_or_create(&DriftLabels { mode }).inc();
        let fields = paths
            .iter()
            .take(MAX_PATHS)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        let more = paths.len().saturating_sub(MAX_PATHS);
        tracing::info!(object = %describe(id), %fields, more, mode, "drift found");
        let mut findings = self.findings.lock().unwrap_or_else(|e| e.into_inner());
        findings.found.push(DriftedObject {
            id: id.clone(),
            paths,
        });
    }

    /// The `Drifted` condition this pass leaves: `None` keeps the previous one
    /// ([`drift_report::condition`]).
    pub fn condition(&self, changed: bool) -> Option<DriftCondition> {
        let findings = self.findings.lock().unwrap_or_else(|e| e.into_inner());
        drift_report::condition(self.mode, changed, findings.checked, &findings.found)
    }

    /// Before an enabled-mode apply: reads the object and, when it is the object this Manifest
    /// recorded and override managers own fields of it (less those left to others), moves those
    /// to module-manager (the apply that follows reverts them). A take-over the API server
    /// refuses as outdated (409) waits for the next drift pass; the apply goes on.
    pub async fn before_apply(
        &self,
        cluster: &Cluster,
        fence: &Fence,
        subject: &Subject<'_>,
    ) -> Result<Before, ReconcileError> {
        let id = &subject.object.id;
        let Some(live) = cluster.get(id).await? else {
            return Ok(None);
        };
        if !self.takes_over || !subject.may_take_over(&live) {
            return Ok(Some(live)); // not ours: the guarded apply refuses it
        }
        let value = serde_json::to_value(&live).unwrap_or_default();
        let managers = &self.override_managers;
        let entries = drift_report::take_over(&value, managers, FIELD_MANAGER, subject.left);
        let (Some(entries), Some(version), Some(uid)) =
            (entries, live.resource_version(), live.uid())
        else {
            return Ok(Some(live));
        };
        fence.check()?;
        let object = describe(id);
        let managers = managers.join(", ");
        match cluster
            .take_over_fields(id, &uid, &version, entries)
            .await?
        {
            None => {
                tracing::info!(%object, "the object changed since it was read: its fields are taken over at the next drift pass");
            }
            Some(stored) if self.still_foreign(&stored, subject.left) => {
                tracing::warn!(%object, %managers, "the API server kept the overridden managers' managedFields entries: their changes stay");
            }
            Some(_) => {
                tracing::info!(%object, %managers, "took over the fields of overridden managers")
            }
        }
        Ok(Some(live))
    }

    /// Whether `stored` (a take-over's answer) still has fields of the override managers.
    fn still_foreign(&self, stored: &DynamicObject, left: &[Pointer]) -> bool {
        let value = serde_json::to_value(stored).unwrap_or_default();
        drift_report::take_over(&value, &self.override_managers, FIELD_MANAGER, left).is_some()
    }

    /// After an enabled-mode apply: what the apply changed of `before` is drift.
    pub fn after_apply(
        &self,
        metrics: &ReconcileMetrics,
        id: &InventoryEntry,
        before: &Before,
        answer: &DynamicObject,
    ) {
        if !self.active {
            return;
        }
        match before {
            None => self.record(metrics, id, Vec::new()),
            Some(live) => {
                let paths = changed_paths(id, live, answer);
                if !paths.is_empty() {
                    self.record(metrics, id, paths);
                }
            }
        }
    }

    /// A warn-mode look at one object: read it, dry-run the apply, report what differs and
    /// what override managers own (less the fields left to others). Writes nothing. Returns the
    /// live object (for readiness); `None` when it is missing or not this Manifest's. Each of
    /// these, and a dry run the API server refuses (`Rejected`: a webhook without
    /// `sideEffects: None`), is reported; the pass goes on.
    pub async fn look(
        &self,
        metrics: &ReconcileMetrics,
        cluster: &Cluster,
        subject: &Subject<'_>,
    ) -> Result<Option<DynamicObject>, ReconcileError> {
        let id = &subject.object.id;
        let Some(live) = cluster.get(id).await? else {
            self.record(metrics, id, Vec::new());
            return Ok(None);
        };
        if !subject.may_take_over(&live) {
            self.record(metrics, id, vec![NOT_OURS.to_owned()]);
            return Ok(None);
        }
        let applied = match cluster.dry_run_apply(subject.object, subject.uid).await {
            Ok(applied) => applied,
            Err(ApplyError::Rejected { .. }) => {
                // The server's message is not logged: it may quote a field's value.
                tracing::warn!(object = %describe(id), "the dry run of the apply was refused (400/422)");
                self.record(metrics, id, vec![NO_DRY_RUN.to_owned()]);
                return Ok(Some(live));
            }
            Err(e) => return Err(e.into()),
        };
        let mut paths = changed_paths(id, &live, &applied);
        let value = serde_json::to_value(&live).unwrap_or_default();
        let limit = MAX_PATHS * 4;
        let managers = &self.override_managers;
        for path in drift_report::foreign_paths(&value, managers, subject.left, limit) {
            if !paths.contains(&path) {
                paths.push(path);
            }
        }
        if !paths.is_empty() {
            self.record(metrics, id, paths);
        }
        Ok(Some(live))
    }
}

/// What a warn-mode pass reports of an object under the name that is not this Manifest's.
const NOT_OURS: &str = "not this Manifest's";
/// What a warn-mode pass reports of an object whose dry-run apply was refused.
const NO_DRY_RUN: &str = "could not dry-run the apply";

/// The object a drift check looks at: the body to apply, the Manifest's UID, the object's UID
/// as recorded, and the fields left to others ([`crate::plan::drift::Prepared::left_alone`]).
pub(super) struct Subject<'a> {
    pub object: &'a RenderedObject,
    pub uid: &'a str,
    pub recorded_uid: Option<&'a str>,
    pub left: &'a [Pointer],
}

impl Subject<'_> {
    /// Whether `live` is the object this Manifest recorded under the name.
    fn may_take_over(&self, live: &DynamicObject) -> bool {
        let label = live.labels().get(MANIFEST_UID_LABEL).map(String::as_str);
        let live_uid = live.metadata.uid.as_deref();
        drift_report::may_take_over(label, live_uid, self.uid, self.recorded_uid)
    }
}

/// The paths of the fields that differ between `live` and `after` (bookkeeping left out).
fn changed_paths(id: &InventoryEntry, live: &DynamicObject, after: &DynamicObject) -> Vec<String> {
    let before = serde_json::to_value(live).unwrap_or_default();
    let after = serde_json::to_value(after).unwrap_or_default();
    match object_change(id, &before, &after) {
        Some(ObjectChange::Update { fields }) => fields.into_iter().map(|f| f.path).collect(),
        _ => Vec::new(),
    }
}
