//! Requests per client from the API server's audit log (local control planes started with
//! `testenv::Options::audit_log`): `apiserver_request_total` counts every client together, the
//! audit log names each request's user agent, so the fleet's own requests can be told from the
//! harness's, kube-controller-manager's and helm's.
//!
//! Clients by user agent: the harness sends `loadtest` ([`HARNESS_AGENT`]); module-manager sends
//! `module-manager/<version>` (its CLI `module-manager-cli/<version>`, not the fleet's; builds
//! before 2026-12-02 sent none, counted as the fleet's too); Go clients send their program's
//! name. [`count`] is pure; [`AuditLog`] reads the file from a mark.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// The user agent of the harness's own client.
pub const HARNESS_AGENT: &str = "loadtest";
/// The client name [`client_of`] gives module-manager's requests (user agent
/// `module-manager/<version>`, `module_manager::telemetry::requests::USER_AGENT`).
pub const OPERATOR: &str = "module-manager";

/// Requests of one client.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClientRequests {
    pub total: u64,
    /// By audit verb (`get`, `list`, `watch`, `create`, `update`, `patch` — server-side
    /// apply included —, `delete`).
    pub by_verb: BTreeMap<String, u64>,
    /// By resource (`manifests`, `manifests/status`, `leases`, `events`…; `non-resource` for
    /// discovery and other paths).
    pub by_resource: BTreeMap<String, u64>,
    /// By verb and resource (`patch deployments`, `get non-resource`).
    #[serde(default)]
    pub by_request: BTreeMap<String, u64>,
}

/// The client a user agent belongs to.
pub fn client_of(user_agent: &str) -> &'static str {
    let lower = user_agent.to_ascii_lowercase();
    if lower.starts_with(HARNESS_AGENT) {
        "loadtest"
    } else if lower.starts_with("module-manager/") || lower.is_empty() {
        // Builds before the user agent (2026-12-02) sent none: `--binary` A/B runs compare them.
        OPERATOR
    } else if lower.starts_with("kube-controller-manager") {
        "kube-controller-manager"
    } else if lower.starts_with("kube-apiserver") {
        "kube-apiserver"
    } else if lower.starts_with("helm") {
        "helm"
    } else {
        "other"
    }
}

#[derive(Deserialize)]
struct Event {
    #[serde(default)]
    stage: String,
    #[serde(default)]
    verb: String,
    #[serde(default, rename = "userAgent")]
    user_agent: String,
    #[serde(default, rename = "objectRef")]
    object: Option<ObjectRef>,
    #[serde(default)]
    user: User,
}

#[derive(Default, Deserialize)]
struct User {
    #[serde(default)]
    username: String,
}

#[derive(Deserialize)]
struct ObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: String,
}

/// Requests per client in audit log lines (JSON, one event per line). Only finished requests
/// count (`ResponseComplete`, `Panic`); other lines are ignored.
pub fn count(text: &str) -> BTreeMap<String, ClientRequests> {
    count_by(text, |event| Some(client_of(&event.user_agent).to_owned()))
}

/// module-manager's requests per user (the credential they were sent with: a remote target's
/// ServiceAccount), from audit log lines as [`count`] reads them.
pub fn operator_requests_by_user(text: &str) -> BTreeMap<String, ClientRequests> {
    count_by(text, |event| {
        (client_of(&event.user_agent) == OPERATOR).then(|| event.user.username.clone())
    })
}

fn count_by(
    text: &str,
    key: impl Fn(&Event) -> Option<String>,
) -> BTreeMap<String, ClientRequests> {
    let mut clients: BTreeMap<String, ClientRequests> = BTreeMap::new();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<Event>(line) else {
            continue;
        };
        if event.stage != "ResponseComplete" && event.stage != "Panic" {
            continue;
        }
        let resource = match &event.object {
            Some(o) if !o.resource.is_empty() && !o.subresource.is_empty() => {
                format!("{}/{}", o.resource, o.subresource)
            }
            Some(o) if !o.resource.is_empty() => o.resource.clone(),
            _ => "non-resource".to_owned(),
        };
        let Some(key) = key(&event) else {
            continue;
        };
        let client = clients.entry(key).or_default();
        client.total += 1;
        *client
            .by_request
            .entry(format!("{} {resource}", event.verb))
            .or_default() += 1;
        *client.by_verb.entry(event.verb).or_default() += 1;
        *client.by_resource.entry(resource).or_default() += 1;
    }
    clients
}

/// The API server's audit log, read from marks.
#[derive(Clone, Debug)]
pub struct AuditLog {
    path: PathBuf,
}

impl AuditLog {
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
        }
    }

    /// Where the log ends now: requests finished after this are read by [`AuditLog::since`].
    pub fn mark(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len())
    }

    /// Requests per client logged since `mark`. The API server writes in batches within a
    /// second: wait that long after a window before reading it.
    pub fn since(&self, mark: u64) -> anyhow::Result<BTreeMap<String, ClientRequests>> {
        Ok(count(&self.text_since(mark)?))
    }

    /// The log's lines since `mark`.
    pub fn text_since(&self, mark: u64) -> anyhow::Result<String> {
        let mut file = std::fs::File::open(&self.path)
            .with_context(|| format!("open the audit log {}", self.path.display()))?;
        file.seek(SeekFrom::Start(mark))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).context("read the audit log")?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_per_client_verb_and_resource() {
        let text = r#"{"stage":"ResponseComplete","verb":"patch","userAgent":"module-manager/0.1.0","objectRef":{"resource":"manifests","subresource":"status"}}
{"stage":"ResponseComplete","verb":"get","userAgent":"module-manager/0.1.0","objectRef":{"resource":"configmaps"}}
{"stage":"ResponseComplete","verb":"patch","userAgent":"module-manager-cli/0.1.0","objectRef":{"resource":"manifests"}}
{"stage":"ResponseComplete","verb":"get","userAgent":"","objectRef":{"resource":"secrets"}}
{"stage":"ResponseComplete","verb":"create","userAgent":"loadtest","objectRef":{"resource":"manifests"}}
{"stage":"ResponseComplete","verb":"update","userAgent":"kube-controller-manager/v1.34.0 (linux/amd64) kubernetes/abc/system:serviceaccount:kube-system:deployment-controller","objectRef":{"resource":"deployments","subresource":"status"}}
{"stage":"ResponseStarted","verb":"watch","userAgent":"module-manager/0.1.0","objectRef":{"resource":"manifests"}}
{"stage":"ResponseComplete","verb":"get","userAgent":"Helm/4.0.0","requestURI":"/version"}
not json
"#;
        let counted = count(text);
        let operator = &counted[OPERATOR];
        assert_eq!(
            operator.total, 3,
            "the started watch does not count yet, nor the CLI; an older build sent no agent"
        );
        assert_eq!(counted["other"].total, 1, "the CLI");
        assert_eq!(operator.by_resource["manifests/status"], 1);
        assert_eq!(operator.by_verb["get"], 2);
        assert_eq!(counted["loadtest"].total, 1);
        assert_eq!(
            counted["kube-controller-manager"].by_resource["deployments/status"],
            1
        );
        assert_eq!(counted["helm"].by_resource["non-resource"], 1);
    }

    #[test]
    fn the_operators_requests_are_counted_per_user() {
        let text = r#"{"stage":"ResponseComplete","verb":"patch","userAgent":"module-manager/0.1.0","user":{"username":"system:serviceaccount:t-00001:module-manager"}}
{"stage":"ResponseComplete","verb":"get","userAgent":"module-manager/0.1.0","user":{"username":"system:serviceaccount:t-00001:module-manager"}}
{"stage":"ResponseComplete","verb":"get","userAgent":"module-manager/0.1.0","user":{"username":"system:serviceaccount:t-00002:module-manager"}}
{"stage":"ResponseComplete","verb":"patch","userAgent":"loadtest","user":{"username":"system:serviceaccount:t-00002:module-manager"}}
"#;
        let counted = operator_requests_by_user(text);
        assert_eq!(counted.len(), 2);
        assert_eq!(
            counted["system:serviceaccount:t-00001:module-manager"].total,
            2
        );
        assert_eq!(
            counted["system:serviceaccount:t-00002:module-manager"].total, 1,
            "the harness's request with the same credential is not the operator's"
        );
    }

    #[test]
    fn the_log_is_read_from_a_mark() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let log = AuditLog::new(&path);
        assert_eq!(log.mark(), 0, "no log yet");
        let line = r#"{"stage":"ResponseComplete","verb":"get","userAgent":"module-manager/0.1.0","objectRef":{"resource":"leases"}}"#;
        std::fs::write(&path, format!("{line}\n")).unwrap();
        let mark = log.mark();
        std::fs::write(&path, format!("{line}\n{line}\n{line}\n")).unwrap();
        assert_eq!(log.since(mark).unwrap()[OPERATOR].total, 2);
        assert_eq!(log.since(0).unwrap()[OPERATOR].total, 3);
    }
}
