//! The Argo CD health script (`deploy/argocd/health.lua`) run by a real Lua 5.1 interpreter
//! against the statuses the pipeline writes for each of its states.

use mlua::{Lua, LuaSerdeExt};
use serde_json::{Value, json};

use super::install::tests::{Kstatus, after, pipeline_states};
use crate::api::{ManifestStatus, State};

const SCRIPT: &str = include_str!("../../deploy/argocd/health.lua");
const ARGOCD_CM: &str = include_str!("../../deploy/argocd/argocd-cm.yaml");

/// Argo CD's answer for `obj`: (status, message).
fn health(obj: &Value) -> (String, String) {
    let lua = Lua::new();
    // Objects from the API server hold no nulls (a merge patch's null deletes the field);
    // Argo CD hands the script a table without them.
    let table = lua.to_value(&without_nulls(obj)).expect("a Lua value");
    lua.globals().set("obj", table).expect("obj is set");
    let hs: mlua::Table = lua
        .load(SCRIPT)
        .set_name("health.lua")
        .eval()
        .unwrap_or_else(|e| panic!("health.lua fails on {obj:#}: {e}"));
    (
        hs.get("status").expect("hs.status"),
        hs.get("message").expect("hs.message"),
    )
}

fn without_nulls(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

/// A Manifest at `generation` with `status`, as Argo CD reads it from the cluster.
fn manifest(generation: i64, status: Option<&ManifestStatus>) -> Value {
    let mut manifest = json!({
        "apiVersion": "modulemanager.io/v1alpha1",
        "kind": "Manifest",
        "metadata": {"name": "web", "namespace": "apps", "generation": generation},
        "spec": {"module": "web", "chart": {"path": "charts/web"}},
    });
    if let Some(status) = status {
        manifest["status"] = serde_json::to_value(status).unwrap();
    }
    manifest
}

fn ready_message(status: &ManifestStatus) -> String {
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
    ready.unwrap().message.clone()
}

#[test]
fn every_state_of_the_pipeline_has_the_health_argo_cd_users_expect() {
    for (what, outcome, kstatus) in pipeline_states() {
        let status = after(None, 3, &outcome);
        let mut obj = manifest(3, Some(&status));
        let deleting = outcome.state == State::Deleting;
        if deleting {
            obj["metadata"]["deletionTimestamp"] = json!("2026-12-01T12:00:00Z");
        }
        let retried = what == "transient error, retried";
        let want = match kstatus {
            Kstatus::Current => "Healthy",
            Kstatus::InProgress if retried => "Degraded",
            Kstatus::InProgress => "Progressing",
            Kstatus::Failed => "Degraded",
        };
        let (got, message) = health(&obj);
        assert_eq!(got, want, "{what}: {status:#?}");
        let expected = match () {
            () if deleting => format!("Pending deletion: {}", ready_message(&status)),
            () if retried => format!("Retrying: {}", ready_message(&status)),
            () => ready_message(&status),
        };
        assert_eq!(message, expected, "{what}: the Ready message");
    }
}

#[test]
fn suspended_unreconciled_and_outdated_manifests() {
    let (_, ready, _) = pipeline_states()
        .into_iter()
        .find(|(what, ..)| *what == "ready")
        .unwrap();
    let status = after(None, 3, &ready);
    let mut suspended = manifest(3, Some(&status));
    suspended["spec"]["suspend"] = json!(true);
    assert_eq!(
        health(&suspended),
        ("Suspended".into(), "Manifest is suspended".into())
    );
    assert_eq!(
        health(&manifest(1, None)),
        (
            "Progressing".into(),
            "Waiting for the operator to reconcile".into()
        )
    );
    // As the API server serves a new Manifest: the CRD's default status.
    let unobserved = ManifestStatus {
        observed_generation: Some(crate::api::NOT_OBSERVED),
        ..ManifestStatus::default()
    };
    assert_eq!(
        health(&manifest(1, Some(&unobserved))),
        (
            "Progressing".into(),
            "Waiting for the operator to reconcile".into()
        )
    );
    // A spec change the operator has not reconciled yet: its Ready=True is about generation 3.
    assert_eq!(
        health(&manifest(4, Some(&status))),
        (
            "Progressing".into(),
            "Waiting for generation 4 to be reconciled".into()
        )
    );
    assert_eq!(health(&manifest(3, Some(&status))).0, "Healthy");
    // Deleted before any status was written.
    let mut gone = manifest(1, None);
    gone["metadata"]["deletionTimestamp"] = json!("2026-12-01T12:00:00Z");
    assert_eq!(
        health(&gone),
        ("Progressing".into(), "Pending deletion".into())
    );
}

#[test]
fn the_argocd_cm_snippet_carries_the_tested_script() {
    let cm: Value = serde_yaml_ng::from_str(ARGOCD_CM).unwrap();
    assert_eq!(cm["metadata"]["name"], "argocd-cm");
    assert_eq!(
        cm["data"]["resource.customizations.health.modulemanager.io_Manifest"],
        SCRIPT
    );
}
