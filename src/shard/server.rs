//! Server-side sharded watches (`--server-side-sharding`): whether the API server filters the
//! Manifest list and watch by shard itself, how a replica finds out, and the client that asks it.
//!
//! kube-rs' `ListParams`/`WatchParams` have no `shardSelector`: a shard watch runs on a client
//! of its own ([`with_shard_selector`]) that adds the parameter to each of its requests (its
//! lists and watches, the re-lists after an error too). The owned shards change by starting a
//! new watch on a new client, as the label path restarts its watch with a new label selector.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response, Uri};
use kube::Client;
use kube::client::Body;

/// `--server-side-sharding`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ServerSharding {
    /// The label path: the shard label, the stray watch, the relabel path.
    #[default]
    Off,
    /// The server's filter when the API server honours `shardSelector` (probed at startup),
    /// else the label path.
    Auto,
    /// The server's filter; startup fails when the API server does not honour it.
    On,
}

/// How the Manifest watches select a replica's shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ShardFilter {
    /// By the shard label (`modulemanager.io/shard in (…)`), which the owner stamps.
    #[default]
    Labels,
    /// By the API server, from the UID (`shardSelector`): no label, no stray watch.
    Server,
}

impl ShardFilter {
    /// Whether the shard label is written and read (the label path).
    pub fn labels(self) -> bool {
        self == Self::Labels
    }
}

/// The filter `mode` gives, after the probe's answer (`honoured`: the API server filters
/// Manifests by `shardSelector`); an error when `on` finds it not honoured.
pub fn decide(mode: ServerSharding, honoured: Option<bool>) -> Result<ShardFilter, String> {
    match (mode, honoured) {
        (ServerSharding::Off, _) => Ok(ShardFilter::Labels),
        (ServerSharding::Auto | ServerSharding::On, Some(true)) => Ok(ShardFilter::Server),
        (ServerSharding::Auto, _) => Ok(ShardFilter::Labels),
        (ServerSharding::On, _) => Err(
            "--server-side-sharding=on: the API server does not honour shardSelector on Manifests \
             (kube-apiserver needs --feature-gates=ShardedListAndWatch=true, Kubernetes 1.36 or later)"
                .to_owned(),
        ),
    }
}

/// A selector the API server refuses when it parses `shardSelector` at all (the bounds must be
/// 16 hex digits), and that one without the feature gate never reads.
const MALFORMED: &str = "shardRange(object.metadata.uid,'0x0','0x1')";

/// The start of the API server's answer to a malformed `shardSelector`
/// (apiserver v0.36.3 `pkg/registry/generic/registry/store.go`, `ListPredicate`).
const REFUSAL: &str = "invalid shard selector";

/// Whether the API server honours `shardSelector` on Manifest lists: with the feature gate, the
/// store that serves them (custom resources included) parses it and refuses a malformed one;
/// without, the parameter is never read and the list is answered. One list of at most one
/// Manifest's metadata.
pub async fn probe(client: &Client) -> Result<bool, kube::Error> {
    let probing = with_shard_selector(client, MALFORMED);
    let manifests = kube::Api::<crate::api::Manifest>::all(probing);
    match manifests
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
    {
        Ok(_) => Ok(false),
        Err(kube::Error::Api(status)) if status.message.contains(REFUSAL) => Ok(true),
        Err(e) => Err(e),
    }
}

/// A client whose every request carries `shardSelector=<selector>`: the client of one shard
/// watch (its other layers, the request counting among them, are `client`'s).
pub fn with_shard_selector(client: &Client, selector: &str) -> Client {
    let parameter = format!("shardSelector={}", encode(selector));
    Client::new(
        AddParameter {
            inner: client.clone(),
            parameter,
        },
        client.default_namespace(),
    )
}

/// The service of [`with_shard_selector`].
#[derive(Clone)]
struct AddParameter {
    inner: Client,
    parameter: String,
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<Body>, kube::Error>> + Send>>;

impl tower::Service<Request<Body>> for AddParameter {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner client's own buffer waits for its readiness in `send`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Body>) -> Answer {
        let inner = self.inner.clone();
        let with = append_query(request.uri(), &self.parameter);
        Box::pin(async move {
            *request.uri_mut() = with.map_err(|e| kube::Error::Service(e.into()))?;
            inner.send(request).await
        })
    }
}

/// `uri` with `parameter` (`name=value`, encoded) added to its query.
fn append_query(uri: &Uri, parameter: &str) -> Result<Uri, http::Error> {
    let path = uri.path();
    let path_and_query = match uri.query() {
        Some(query) if !query.is_empty() => format!("{path}?{query}&{parameter}"),
        _ => format!("{path}?{parameter}"),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query.parse()?);
    Ok(Uri::from_parts(parts)?)
}

/// Everything but the unreserved characters of RFC 3986 is percent-encoded.
const UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `value` percent-encoded for a query (every byte but the unreserved characters).
fn encode(value: &str) -> String {
    percent_encoding::utf8_percent_encode(value, UNRESERVED).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parameter_is_added_to_lists_and_watches() {
        let list: Uri = "/apis/modulemanager.io/v1alpha1/manifests?limit=500"
            .parse()
            .unwrap();
        assert_eq!(
            append_query(&list, "shardSelector=x").unwrap(),
            "/apis/modulemanager.io/v1alpha1/manifests?limit=500&shardSelector=x"
        );
        let bare: Uri = "/apis/modulemanager.io/v1alpha1/namespaces/a/manifests"
            .parse()
            .unwrap();
        assert_eq!(
            append_query(&bare, "shardSelector=x").unwrap(),
            "/apis/modulemanager.io/v1alpha1/namespaces/a/manifests?shardSelector=x"
        );
        let absolute: Uri = "https://127.0.0.1:6443/api/v1/pods?watch=true"
            .parse()
            .unwrap();
        assert_eq!(
            append_query(&absolute, "shardSelector=x").unwrap(),
            "https://127.0.0.1:6443/api/v1/pods?watch=true&shardSelector=x"
        );
    }

    #[test]
    fn the_selector_is_percent_encoded() {
        assert_eq!(
            encode("shardRange(object.metadata.uid,'0x0000000000000000','0x8000000000000000')||x"),
            "shardRange%28object.metadata.uid%2C%270x0000000000000000%27%2C%270x8000000000000000%27%29%7C%7Cx"
        );
    }

    #[test]
    fn on_needs_the_server_and_off_never_asks() {
        assert_eq!(decide(ServerSharding::Off, None), Ok(ShardFilter::Labels));
        assert_eq!(
            decide(ServerSharding::Auto, Some(true)),
            Ok(ShardFilter::Server)
        );
        assert_eq!(
            decide(ServerSharding::Auto, Some(false)),
            Ok(ShardFilter::Labels)
        );
        assert_eq!(
            decide(ServerSharding::On, Some(true)),
            Ok(ShardFilter::Server)
        );
        assert!(decide(ServerSharding::On, Some(false)).is_err());
    }
}
