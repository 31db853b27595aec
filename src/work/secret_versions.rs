//! The metadata-only watch of Secrets (of `--namespace`, or all) that keeps
//! [`WatchedSecrets`] current, so that a pass on a remote target reuses its cached client
//! without reading the kubeconfig Secret (`apply/target.rs`). It starts when this replica first
//! uses a remote target. The API server sends `PartialObjectMetadata`: no `data`, but
//! annotations (a Secret created by a client-side `kubectl apply` carries its data in the
//! last-applied annotation); each object is decoded and dropped at once, keeping only its
//! namespace, name, UID and resourceVersion. After any error the watch is started anew (a full
//! list), and nothing it showed is trusted until that list is complete.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use crate::apply::watched_secrets::{Fingerprint, SecretName, WatchedSecrets};

/// Secrets per page of the list.
const PAGE: u32 = 500;
/// The first wait before a failed watch is started anew; it doubles up to [`MAX_RESTART_DELAY`].
const RESTART_DELAY: Duration = Duration::from_secs(1);
const MAX_RESTART_DELAY: Duration = Duration::from_secs(60);

fn version(secret: &PartialObjectMeta<Secret>) -> (SecretName, Fingerprint) {
    let name = (secret.namespace().unwrap_or_default(), secret.name_any());
    (name, Fingerprint::of(&secret.metadata))
}

/// Watches the Secrets' versions into `watched` once a remote target is used; runs until the
/// task is dropped.
pub(super) async fn feed_secret_versions(
    client: Client,
    namespace: Option<String>,
    watched: Arc<WatchedSecrets>,
) {
    watched.wanted().await;
    let api: Api<PartialObjectMeta<Secret>> = match &namespace {
        Some(namespace) => Api::namespaced(client, namespace),
        None => Api::all(client),
    };
    let mut delay = RESTART_DELAY;
    loop {
        if watch_until_error(&api, &watched).await {
            delay = RESTART_DELAY;
        }
        watched.out_of_step();
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(MAX_RESTART_DELAY);
    }
}

/// One watch, from a full list, until its first error; whether it had listed.
async fn watch_until_error(api: &Api<PartialObjectMeta<Secret>>, watched: &WatchedSecrets) -> bool {
    let config = watcher::Config::default().page_size(PAGE);
    let mut events = watcher::watcher(api.clone(), config).boxed();
    let mut listing: HashMap<SecretName, Fingerprint> = HashMap::new();
    let mut listed = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listing.clear(),
            Ok(watcher::Event::InitApply(secret)) => {
                let (name, fingerprint) = version(&secret);
                listing.insert(name, fingerprint);
            }
            Ok(watcher::Event::InitDone) => {
                watched.listed(std::mem::take(&mut listing));
                listed = true;
            }
            Ok(watcher::Event::Apply(secret)) => {
                let (name, fingerprint) = version(&secret);
                watched.changed([(name, Some(fingerprint))]);
            }
            Ok(watcher::Event::Delete(secret)) => watched.changed([(version(&secret).0, None)]),
            Err(e) => {
                tracing::warn!(
                    "watch Secrets' versions (remote target clients): {e}; starting it anew"
                );
                return listed;
            }
        }
    }
    listed
}
