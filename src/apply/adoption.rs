//! Adoption's one read (`spec.adopt`): whether the Manifest an object's label names still
//! exists. An object of a Manifest that is gone (deleted with `deletionPolicy: Orphan`) may be
//! taken over; one of a Manifest that exists never is ([`crate::plan::ownership::decide`]).

use std::collections::HashSet;

use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use tokio::sync::Mutex;

use super::ApplyError;
use crate::api::Manifest;

/// A page of the metadata-only listing.
const PAGE: u32 = 500;

/// Listings one pass makes at most: each owner it asks about costs one (the answer is kept for
/// the pass), and owners beyond these count as existing (refused, retried by the next pass), so
/// that a chart whose objects name many owners cannot make a pass list the Manifests as often.
const MAX_LISTINGS: usize = 4;

/// The owners one adopting pass asked about, and what it found.
pub struct Owners {
    /// The operator's own client (Manifests live on the local cluster, also for a module
    /// written to a remote target or as a ServiceAccount).
    client: Client,
    found: Mutex<Found>,
}

#[derive(Default)]
struct Found {
    existing: HashSet<String>,
    gone: HashSet<String>,
    listings: usize,
}

impl Owners {
    /// Looks Manifests up with `client` (the operator's, which lists Manifests everywhere).
    pub fn new(client: Client) -> Self {
        Self {
            client,
            found: Mutex::default(),
        }
    }

    /// Whether no Manifest with UID `owner` exists in any namespace of this cluster. Asked
    /// right after reading an object labelled `owner`, so that the listing that answers comes
    /// after that read: the owner existed then, so its absence from the listing means it was
    /// deleted (UIDs are never reused: gone stays gone). The listing is metadata-only, paged,
    /// read from etcd (a quorum read, not the watch cache), and stops at the page that holds
    /// the owner. Each owner is listed for once per pass, at most [`MAX_LISTINGS`] in all.
    pub async fn gone(&self, owner: &str) -> Result<bool, ApplyError> {
        let mut found = self.found.lock().await;
        if found.gone.contains(owner) {
            return Ok(true);
        }
        if found.existing.contains(owner) || found.listings >= MAX_LISTINGS {
            return Ok(false);
        }
        found.listings += 1;
        let exists = self
            .exists(owner)
            .await
            .map_err(|source| ApplyError::ReadOwner {
                owner: owner.to_owned(),
                source,
            })?;
        match exists {
            true => found.existing.insert(owner.to_owned()),
            false => found.gone.insert(owner.to_owned()),
        };
        Ok(!exists)
    }

    async fn exists(&self, owner: &str) -> Result<bool, kube::Error> {
        let api: Api<Manifest> = Api::all(self.client.clone());
        let mut params = ListParams::default().limit(PAGE);
        loop {
            let page = api.list_metadata(&params).await?;
            if page.items.iter().any(|m| m.uid().as_deref() == Some(owner)) {
                return Ok(true);
            }
            match page.metadata.continue_.filter(|token| !token.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(false),
            }
        }
    }
}
