//! Minimal CRDs of the Prometheus Operator (`monitoring.coreos.com/v1` ServiceMonitor and
//! PrometheusRule), written after its API reference, so that `deploy/` applies with strict field
//! validation on a cluster without the operator (tests/deploy.rs, tests/e2e.rs): the fields the
//! deployment uses, with their types. A misspelled or misplaced field is rejected — and so is a
//! real field they leave out (add it here when the deployment starts using it).

/// A minimal namespaced CRD of `monitoring.coreos.com/v1` (see the module documentation):
/// `spec_schema` is the schema of its required `spec`, indented for its place.
fn monitoring_crd(kind: &str, plural: &str, spec_schema: &str) -> String {
    let singular = kind.to_lowercase();
    format!(
        r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {plural}.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {{kind: {kind}, listKind: {kind}List, plural: {plural}, singular: {singular}}}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          required: [spec]
          properties:
            spec:
{spec_schema}
"#
    )
}

/// The schema of a ServiceMonitor's `spec`.
const SERVICE_MONITOR_SPEC: &str = r#"              type: object
              required: [selector]
              properties:
                jobLabel: {type: string}
                selector:
                  type: object
                  properties:
                    matchLabels: {type: object, additionalProperties: {type: string}}
                    matchExpressions:
                      type: array
                      items:
                        type: object
                        required: [key, operator]
                        properties:
                          key: {type: string}
                          operator: {type: string}
                          values: {type: array, items: {type: string}}
                namespaceSelector:
                  type: object
                  properties:
                    any: {type: boolean}
                    matchNames: {type: array, items: {type: string}}
                endpoints:
                  type: array
                  items:
                    type: object
                    properties:
                      port: {type: string}
                      targetPort: {x-kubernetes-int-or-string: true, anyOf: [{type: integer}, {type: string}]}
                      path: {type: string}
                      scheme: {type: string, enum: [http, https, HTTP, HTTPS]}
                      interval: {type: string, pattern: '^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$'}
                      scrapeTimeout: {type: string, pattern: '^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$'}
                      honorLabels: {type: boolean}"#;

/// The schema of a PrometheusRule's `spec`.
const PROMETHEUS_RULE_SPEC: &str = r#"              type: object
              properties:
                groups:
                  type: array
                  items:
                    type: object
                    required: [name]
                    properties:
                      name: {type: string, minLength: 1}
                      interval: {type: string, pattern: '^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$'}
                      labels: {type: object, additionalProperties: {type: string}}
                      limit: {type: integer}
                      query_offset: {type: string}
                      partial_response_strategy: {type: string}
                      rules:
                        type: array
                        items:
                          type: object
                          required: [expr]
                          properties:
                            alert: {type: string}
                            record: {type: string}
                            expr: {x-kubernetes-int-or-string: true, anyOf: [{type: integer}, {type: string}]}
                            for: {type: string, pattern: '^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$'}
                            keep_firing_for: {type: string}
                            labels: {type: object, additionalProperties: {type: string}}
                            annotations: {type: object, additionalProperties: {type: string}}"#;

/// Installs the minimal ServiceMonitor and PrometheusRule CRDs and waits until they are served.
pub async fn install_monitoring_crds(client: &kube::Client) {
    let file = tempfile::NamedTempFile::new().unwrap();
    let crds = [
        monitoring_crd("ServiceMonitor", "servicemonitors", SERVICE_MONITOR_SPEC),
        monitoring_crd("PrometheusRule", "prometheusrules", PROMETHEUS_RULE_SPEC),
    ];
    std::fs::write(file.path(), crds.join("---\n")).unwrap();
    testenv::install_crds(client, file.path())
        .await
        .expect("monitoring CRDs");
}
