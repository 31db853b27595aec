//! API requests: the operator's own requests to Kubernetes API servers, counted by verb and
//! resource ([`CountRequests`], a tower layer on every client the operator builds).
//!
//! The labels are bounded: the verb is one of eight, read from the method, the path and the
//! query (`watch=true`) and, for a PATCH, the content type (server-side apply); the resource is
//! `group/resource` from the path (`configmaps` for the core group, `apps/deployments`,
//! `modulemanager.io/manifests/status` for a subresource), never a name or a namespace; the
//! target is one of three. The parse is kube-apiserver's request-info rules
//! (`k8s.io/apiserver/pkg/endpoints/request/requestinfo.go`), cut to what a label needs.

use std::task::{Context, Poll};

use http::{Method, Request};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tower::{Layer, Service};

/// Whose connection a request went through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestTarget {
    /// The operator's own connection to the cluster it runs in.
    Local,
    /// The local cluster, impersonating a Manifest's ServiceAccount.
    Impersonated,
    /// A remote target (`spec.target`).
    Remote,
}

impl RequestTarget {
    /// The `target` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Impersonated => "impersonated",
            Self::Remote => "remote",
        }
    }
}

/// The labels of one counted request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `apply`, `delete`.
    pub verb: &'static str,
    /// `group/resource[/subresource]` (no group for the core group), `discovery` for the
    /// discovery documents, `other` for any other path.
    pub resource: String,
    /// `local`, `impersonated`, `remote`.
    pub target: &'static str,
}

/// The operator's API requests.
#[derive(Clone, Debug, Default)]
pub struct ApiRequestMetrics {
    /// Requests sent, by verb, resource and target.
    pub requests: Family<RequestLabels, Counter>,
}

impl ApiRequestMetrics {
    /// Registers under `api_…` in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        let sub = registry.sub_registry_with_prefix("api");
        sub.register(
            "requests",
            "Requests this replica sent to Kubernetes API servers, by verb, resource (group/resource, never a name) and target (local, impersonated, remote)",
            metrics.requests.clone(),
        );
        metrics
    }

    /// The requests counted so far with `verb` and `resource` (any target): for tests.
    pub fn count(&self, verb: &str, resource: &str) -> u64 {
        self.sum(|labels| labels.verb == verb && labels.resource == resource)
    }

    /// The requests counted so far whose labels `pick` accepts.
    pub fn sum(&self, pick: impl Fn(&RequestLabels) -> bool) -> u64 {
        let mut total = 0;
        // Family has no iterator: the labels seen are kept beside it.
        for labels in self.seen() {
            if pick(&labels) {
                total += self.requests.get_or_create(&labels).get();
            }
        }
        total
    }

    /// Every label set counted so far.
    pub fn seen(&self) -> Vec<RequestLabels> {
        let mut text = String::new();
        let mut registry = Registry::default();
        registry.register("r", "", self.requests.clone());
        if prometheus_client::encoding::text::encode(&mut text, &registry).is_err() {
            return Vec::new();
        }
        text.lines().filter_map(parse_series).collect()
    }
}

/// The labels of one exposition line `r_total{verb="…",resource="…",target="…"} N`.
fn parse_series(line: &str) -> Option<RequestLabels> {
    let inner = line.strip_prefix("r_total{")?.split('}').next()?;
    let value = |key: &str| {
        let start = inner.find(&format!("{key}=\""))? + key.len() + 2;
        let end = inner[start..].find('"')? + start;
        Some(inner[start..end].to_owned())
    };
    let verb = VERBS
        .iter()
        .copied()
        .find(|v| Some(*v) == value("verb").as_deref())?;
    let target = [
        RequestTarget::Local,
        RequestTarget::Impersonated,
        RequestTarget::Remote,
    ]
    .map(RequestTarget::as_str)
    .into_iter()
    .find(|t| Some(*t) == value("target").as_deref())?;
    Some(RequestLabels {
        verb,
        resource: value("resource")?,
        target,
    })
}

/// Every verb label.
pub const VERBS: [&str; 8] = [
    "get", "list", "watch", "create", "update", "patch", "apply", "delete",
];

/// The content type of a server-side apply.
const APPLY_PATCH: &str = "application/apply-patch+yaml";

/// The verb and resource of a request: `method`, the URI's `path` and `query`, and the
/// `content_type` of a PATCH (pure).
pub fn classify(
    method: &Method,
    path: &str,
    query: Option<&str>,
    content_type: Option<&str>,
) -> (&'static str, String) {
    let parsed = parse_path(path);
    let has_name = matches!(parsed, Path::Resource { named: true, .. });
    let watching = query.is_some_and(|q| {
        q.split('&')
            .any(|pair| matches!(pair, "watch=true" | "watch=1"))
    });
    let verb = match *method {
        Method::GET if watching => "watch",
        Method::GET if has_name || !matches!(parsed, Path::Resource { .. }) => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH if content_type.is_some_and(|c| c.starts_with(APPLY_PATCH)) => "apply",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "get",
    };
    let resource = match parsed {
        Path::Resource { resource, .. } => resource,
        Path::Discovery => "discovery".to_owned(),
        Path::Other => "other".to_owned(),
    };
    (verb, resource)
}

/// What a request path names.
#[derive(Debug, PartialEq)]
enum Path {
    /// A resource (`group/resource[/subresource]`), one object of it (`named`) or a collection.
    Resource { resource: String, named: bool },
    /// `/api`, `/apis`, `/apis/<group>[/<version>]`, `/version`, `/openapi/…`.
    Discovery,
    /// Anything else.
    Other,
}

/// Parses a path under `/api/v1/` or `/apis/<group>/<version>/` (after any prefix a
/// kubeconfig's server URL adds): `[namespaces/<ns>/]<resource>[/<name>[/<subresource>]]`.
fn parse_path(path: &str) -> Path {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let Some(start) = segments
        .iter()
        .position(|s| matches!(*s, "api" | "apis" | "version" | "openapi"))
    else {
        return Path::Other;
    };
    let (group, rest) = match segments[start] {
        "api" if segments.len() > start + 2 => ("", &segments[start + 2..]),
        "apis" if segments.len() > start + 3 => (segments[start + 1], &segments[start + 3..]),
        _ => return Path::Discovery,
    };
    // A namespaced resource: `namespaces/<ns>/<resource>…`; but a Namespace's own
    // subresources (`namespaces/<name>/status|finalize`) are of `namespaces`.
    let parts = match rest {
        ["namespaces", _, "status" | "finalize"] => rest,
        ["namespaces", _, resource_on @ ..] if !resource_on.is_empty() => resource_on,
        _ => rest,
    };
    let mut resource = match group {
        "" => parts[0].to_owned(),
        group => format!("{group}/{}", parts[0]),
    };
    if let Some(sub) = parts.get(2) {
        resource.push('/');
        resource.push_str(sub);
    }
    Path::Resource {
        resource,
        named: parts.len() > 1,
    }
}

/// A tower layer counting each request into [`ApiRequestMetrics`] as it is sent.
#[derive(Clone, Debug)]
pub struct CountRequests {
    metrics: ApiRequestMetrics,
    target: RequestTarget,
}

impl CountRequests {
    /// Counts into `metrics`, labelled with `target`.
    pub fn new(metrics: ApiRequestMetrics, target: RequestTarget) -> Self {
        Self { metrics, target }
    }
}

impl<S> Layer<S> for CountRequests {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`CountRequests`].
#[derive(Clone, Debug)]
pub struct Counted<S> {
    inner: S,
    layer: CountRequests,
}

impl<S, B> Service<Request<B>> for Counted<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let content_type = request
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        let uri = request.uri();
        let (verb, resource) = classify(request.method(), uri.path(), uri.query(), content_type);
        let labels = RequestLabels {
            verb,
            resource,
            target: self.layer.target.as_str(),
        };
        self.layer.metrics.requests.get_or_create(&labels).inc();
        self.inner.call(request)
    }
}

/// The `User-Agent` of every request module-manager sends (Kubernetes API and chart
/// repositories). The API server names the field manager of a write without one after it
/// (`module-manager` in `managedFields`), and audit logs tell module-manager's requests from
/// other clients' by it.
pub const USER_AGENT: &str = concat!("module-manager/", env!("CARGO_PKG_VERSION"));

/// A client for `config` whose requests are counted into `metrics` as `target`'s and carry
/// [`USER_AGENT`].
pub fn client(
    mut config: kube::Config,
    metrics: &ApiRequestMetrics,
    target: RequestTarget,
) -> kube::Result<kube::Client> {
    with_user_agent(&mut config, USER_AGENT);
    let layer = CountRequests::new(metrics.clone(), target);
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&layer)
        .build())
}

/// Sets `config`'s `User-Agent` to `agent` (replacing one already set).
pub fn with_user_agent(config: &mut kube::Config, agent: &'static str) {
    config
        .headers
        .retain(|(name, _)| name != http::header::USER_AGENT);
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(agent),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(method: Method, uri: &str, content_type: Option<&str>) -> (&'static str, String) {
        let uri: http::Uri = uri.parse().unwrap();
        classify(&method, uri.path(), uri.query(), content_type)
    }

    fn pair(verb: &'static str, resource: &str) -> (&'static str, String) {
        (verb, resource.to_owned())
    }

    #[test]
    fn verbs_come_from_the_method_the_path_the_query_and_the_content_type() {
        let cm = "/api/v1/namespaces/ns/configmaps";
        assert_eq!(of(Method::GET, cm, None), pair("list", "configmaps"));
        assert_eq!(
            of(Method::GET, &format!("{cm}/c"), None),
            pair("get", "configmaps")
        );
        assert_eq!(
            of(
                Method::GET,
                &format!("{cm}?watch=true&resourceVersion=5"),
                None
            ),
            pair("watch", "configmaps")
        );
        assert_eq!(
            of(
                Method::GET,
                &format!("{cm}?labelSelector=watch%3Dtrue"),
                None
            ),
            pair("list", "configmaps"),
            "a selector mentioning watch is no watch"
        );
        assert_eq!(of(Method::POST, cm, None), pair("create", "configmaps"));
        assert_eq!(
            of(Method::PUT, &format!("{cm}/c"), None),
            pair("update", "configmaps")
        );
        let apply = Some("application/apply-patch+yaml");
        assert_eq!(
            of(
                Method::PATCH,
                &format!("{cm}/c?fieldManager=m&force=true"),
                apply
            ),
            pair("apply", "configmaps")
        );
        let merge = Some("application/merge-patch+json");
        assert_eq!(
            of(Method::PATCH, &format!("{cm}/c"), merge),
            pair("patch", "configmaps")
        );
        assert_eq!(
            of(Method::DELETE, &format!("{cm}/c"), None),
            pair("delete", "configmaps")
        );
    }

    #[test]
    fn resources_are_group_and_resource_never_names_or_namespaces() {
        let merge = Some("application/merge-patch+json");
        assert_eq!(
            of(
                Method::PATCH,
                "/apis/modulemanager.io/v1alpha1/namespaces/team-a/manifests/web/status",
                merge
            ),
            pair("patch", "modulemanager.io/manifests/status")
        );
        assert_eq!(
            of(Method::GET, "/apis/apps/v1/deployments?limit=500", None),
            pair("list", "apps/deployments"),
            "all namespaces"
        );
        assert_eq!(
            of(
                Method::GET,
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/x.example.com",
                None
            ),
            pair("get", "apiextensions.k8s.io/customresourcedefinitions")
        );
        // The Namespace objects themselves, and their subresources.
        assert_eq!(
            of(Method::GET, "/api/v1/namespaces/team-a", None),
            pair("get", "namespaces")
        );
        assert_eq!(
            of(Method::GET, "/api/v1/namespaces", None),
            pair("list", "namespaces")
        );
        assert_eq!(
            of(Method::PUT, "/api/v1/namespaces/team-a/finalize", None),
            pair("update", "namespaces/finalize")
        );
        assert_eq!(
            of(
                Method::POST,
                "/apis/coordination.k8s.io/v1/namespaces/fleet/leases",
                None
            ),
            pair("create", "coordination.k8s.io/leases")
        );
        // A namespace literally named like a resource is still a namespace.
        assert_eq!(
            of(Method::GET, "/api/v1/namespaces/status/pods/p", None),
            pair("get", "pods")
        );
        assert_eq!(
            of(Method::GET, "/api/v1/namespaces/ns/pods/p/log", None),
            pair("get", "pods/log")
        );
    }

    #[test]
    fn discovery_and_prefixed_servers() {
        for path in [
            "/api",
            "/apis",
            "/api/v1",
            "/apis/apps",
            "/apis/apps/v1",
            "/version",
        ] {
            assert_eq!(
                of(Method::GET, path, None),
                pair("get", "discovery"),
                "{path}"
            );
        }
        assert_eq!(of(Method::GET, "/healthz", None), pair("get", "other"));
        // A kubeconfig's server URL may carry a path (a proxy in front of the API server).
        assert_eq!(
            of(
                Method::GET,
                "/k8s/clusters/c-1/api/v1/namespaces/ns/services/s",
                None
            ),
            pair("get", "services")
        );
    }

    #[test]
    fn counted_series_can_be_read_back() {
        let metrics = ApiRequestMetrics::default();
        let labels = |verb, resource: &str, target| RequestLabels {
            verb,
            resource: resource.into(),
            target,
        };
        metrics
            .requests
            .get_or_create(&labels("apply", "configmaps", "local"))
            .inc_by(3);
        metrics
            .requests
            .get_or_create(&labels("apply", "configmaps", "remote"))
            .inc();
        metrics
            .requests
            .get_or_create(&labels("get", "modulemanager.io/manifests", "local"))
            .inc();
        assert_eq!(metrics.count("apply", "configmaps"), 4);
        assert_eq!(metrics.sum(|l| l.target == "local"), 4);
        assert_eq!(metrics.seen().len(), 3);
    }
}
