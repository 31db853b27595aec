//! The module-manager API: the `Manifest` custom resource and its CRD.

mod manifest;

pub use manifest::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSON,
};
use kube::CustomResourceExt;

/// `status.observedGeneration` of a Manifest no pass has written a status for yet: the CRD's
/// default for `status` (as Flux's CRDs have it), so that kstatus — Flux's health checks, `kpt
/// live status` — reads a new Manifest as in progress ("generation is 1, but latest observed
/// generation is -1") instead of Current, as it reads any object without conditions.
pub const NOT_OBSERVED: i64 = -1;

/// The `Manifest` CustomResourceDefinition as it is installed on a cluster.
pub fn manifest_crd() -> CustomResourceDefinition {
    let mut crd = Manifest::crd();
    for version in &mut crd.spec.versions {
        let status = version
            .schema
            .as_mut()
            .and_then(|schema| schema.open_api_v3_schema.as_mut())
            .and_then(|root| root.properties.as_mut())
            .and_then(|properties| properties.get_mut("status"));
        if let Some(status) = status {
            status.default = Some(JSON(
                serde_json::json!({ "observedGeneration": NOT_OBSERVED }),
            ));
        }
    }
    crd
}

/// Annotation asking for a pass now, whatever `spec.interval` says: set it to any new value
/// (by convention the current time, as `module-manager reconcile` does); the value a pass
/// handled is echoed in `status.lastHandledReconcileAt`.
pub const RECONCILE_REQUESTED_AT: &str = "reconcile.modulemanager.io/requestedAt";
/// Annotation asking for a failed hook run or a permanent error to be tried again without a
/// spec change (`module-manager retry`); echoed in `status.lastHandledResetAt`.
pub const RESET_REQUESTED_AT: &str = "reconcile.modulemanager.io/resetAt";
/// Label that opts a ConfigMap or Secret into the values-source watch: set to `true`, a change
/// of the object queues at once the Manifests that name it (`valuesFrom`, or `spec.target`'s
/// kubeconfig Secret); without it a change waits for `spec.interval` (Flux's
/// `reconcile.fluxcd.io/watch: Enabled`).
pub const WATCH_LABEL: &str = "modulemanager.io/watch";
/// The value of [`WATCH_LABEL`] that opts an object in.
pub const WATCH_LABEL_VALUE: &str = "true";

/// Label the operator stamps (`true`) on a Manifest some other Manifest names in
/// `spec.dependsOn`: every replica watches the Manifests carrying it (a small set) and queues at
/// once the dependents it holds when one's readiness changes. Never removed (a stale label costs
/// one object in that watch).
pub const DEPENDED_ON_LABEL: &str = "modulemanager.io/depended-on";
/// Label the operator stamps (`true`) on a Manifest with a `spec.dependsOn`: a dependency being
/// deleted lists only these to find its dependents.
pub const HAS_DEPENDENCIES_LABEL: &str = "modulemanager.io/has-dependencies";

/// The shortest drift-check interval: shorter ones are raised to it (no busy loop).
pub const MIN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// The longest drift-check interval: longer ones are lowered to it.
pub const MAX_INTERVAL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// `spec.interval` as a duration within [`MIN_INTERVAL`, `MAX_INTERVAL`]; `None` when it does
/// not parse (the CRD's pattern makes that unlikely).
pub fn interval(spec: &ManifestSpec) -> Option<std::time::Duration> {
    parse_interval(&spec.interval).map(|d| d.clamp(MIN_INTERVAL, MAX_INTERVAL))
}

/// `spec.timeout` as a duration within [`MIN_TIMEOUT`, `MAX_TIMEOUT`]; the default (5m) when it
/// does not parse (the CRD's pattern makes that unlikely).
pub fn timeout(spec: &ManifestSpec) -> std::time::Duration {
    parse_interval(&spec.timeout).map_or(DEFAULT_TIMEOUT, |d| d.clamp(MIN_TIMEOUT, MAX_TIMEOUT))
}

/// The readiness deadline when `spec.timeout` is not set.
pub const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);
/// The shortest readiness deadline: shorter ones are raised to it.
pub const MIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);
/// The longest readiness deadline: longer ones are lowered to it.
pub const MAX_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Parses a Go-style duration (`90s`, `10m`, `1h30m`, `500ms`); `None` when it does not parse
/// or does not fit a `Duration`.
pub fn parse_interval(text: &str) -> Option<std::time::Duration> {
    let mut total = 0f64;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..number_len].parse().ok()?;
        rest = &rest[number_len..];
        let (unit, seconds) = [("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)]
            .into_iter()
            .find(|(unit, _)| rest.starts_with(unit))?;
        total += number * seconds;
        rest = &rest[unit.len()..];
    }
    std::time::Duration::try_from_secs_f64(total).ok()
}

/// The CRD as the YAML document checked in at `crds/manifest.yaml`.
pub fn manifest_crd_yaml() -> String {
    let yaml = serde_yaml_ng::to_string(&manifest_crd()).expect("a CRD always serializes to YAML");
    format!(
        "# Generated by `module-manager crd`; do not edit. `make verify-crds` checks it.\n---\n{yaml}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minimal_manifest_gets_the_documented_defaults() {
        let manifest: Manifest = serde_yaml_ng::from_str(
            "apiVersion: modulemanager.io/v1alpha1\nkind: Manifest\nmetadata: {name: web}\nspec:\n  module: web\n  chart: {path: /charts/web}\n  valuesFrom: [{kind: Secret, name: web-values}]\n",
        )
        .unwrap();
        assert_eq!(manifest.spec.interval, "10m");
        assert_eq!(manifest.spec.deletion_policy, DeletionPolicy::Delete);
        assert!(!manifest.spec.suspend);
        assert_eq!(manifest.spec.values_from[0].key, "values.yaml");
        assert!(!manifest.spec.values_from[0].optional);
    }

    #[test]
    fn intervals_parse_like_go_durations() {
        use std::time::Duration;
        assert_eq!(parse_interval("10m"), Some(Duration::from_secs(600)));
        assert_eq!(parse_interval("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_interval("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_interval("250ms"), Some(Duration::from_millis(250)));
        for bad in ["", "10", "m", "10x", "1h 2m", "99999999999999999999999999h"] {
            assert_eq!(parse_interval(bad), None, "{bad}");
        }
        let spec = |interval: &str| ManifestSpec {
            interval: interval.into(),
            ..serde_json::from_value(serde_json::json!({"module": "m", "chart": {"path": "p"}}))
                .unwrap()
        };
        assert_eq!(interval(&spec("0s")), Some(MIN_INTERVAL));
        assert_eq!(interval(&spec("3000000000000000h")), Some(MAX_INTERVAL));
        assert_eq!(interval(&spec("5m")), Some(Duration::from_secs(300)));
    }

    #[test]
    fn timeouts_default_to_five_minutes_and_stay_bounded() {
        use std::time::Duration;
        let spec = |extra: serde_json::Value| -> ManifestSpec {
            let mut spec = serde_json::json!({"module": "m", "chart": {"path": "p"}});
            spec.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            serde_json::from_value(spec).unwrap()
        };
        assert_eq!(spec(serde_json::json!({})).timeout, "5m");
        assert_eq!(timeout(&spec(serde_json::json!({}))), DEFAULT_TIMEOUT);
        let of = |text: &str| timeout(&spec(serde_json::json!({"timeout": text})));
        assert_eq!(of("90s"), Duration::from_secs(90));
        assert_eq!(of("0s"), MIN_TIMEOUT);
        assert_eq!(of("100h"), MAX_TIMEOUT);
        assert_eq!(of("soon"), DEFAULT_TIMEOUT);
    }

    #[test]
    fn the_crd_carries_print_columns_cel_rules_and_the_status_subresource() {
        let crd = serde_json::to_value(manifest_crd()).unwrap();
        let version = &crd["spec"]["versions"][0];
        let columns: Vec<&str> = version["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            columns,
            [
                "Module", "Version", "Ready", "Status", "State", "Owner", "Age"
            ]
        );
        assert!(version["subresources"]["status"].is_object());
        let chart =
            &version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["chart"];
        let rules: Vec<&str> = chart["x-kubernetes-validations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["rule"].as_str().unwrap())
            .collect();
        assert_eq!(rules.len(), 4);
        assert!(rules[0].contains("size() == 1"));
        assert!(rules[2].contains("has(self.secretRef)"));
        assert!(rules[3].contains("self.verify.provider == 'cosign'"));
        let verify = &chart["properties"]["verify"]["x-kubernetes-validations"][0]["rule"];
        assert_eq!(verify, "has(self.secretRef) != has(self.configMapRef)");
        assert_eq!(crd["spec"]["names"]["shortNames"][0], "mfst");
    }

    #[test]
    fn a_status_not_written_yet_defaults_to_no_generation_observed() {
        let crd = serde_json::to_value(manifest_crd()).unwrap();
        let status =
            &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"];
        assert_eq!(
            status["default"],
            serde_json::json!({"observedGeneration": -1})
        );
        let default: ManifestStatus = serde_json::from_value(status["default"].clone()).unwrap();
        assert_eq!(
            default,
            ManifestStatus {
                observed_generation: Some(NOT_OBSERVED),
                ..ManifestStatus::default()
            }
        );
    }
}
