//! Adoption's one read (`spec.adopt`): whether the Manifest an object's label names still
//! exists. An object of a Manifest that is gone (deleted with `deletionPolicy: Orphan`) may be
//! taken over; one of a Manifest that exists never is ([`crate::plan::ownership::decide`]).

use std::collections::HashMap;

use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use tokio::sync::Mutex;

use super::ApplyError;
use crate::api::Manifest;

/// A page of the metadata-only listing: Manifest metadata is small, and a listing stops at the
/// page that holds the UID asked for.
const PAGE: u32 = 500;

/// The Manifests one adopting pass asked about, each looked up once.
pub struct Owners {
    /// The operator's own client (Manifests live on the local cluster, also for a module
    /// written to a remote target or as a ServiceAccount).
    client: Client,
    /// UID → whether a Manifest with it exists.
    known: Mutex<HashMap<String, bool>>,
}

impl Owners {
    /// Looks Manifests up with `client` (the operator's, which lists Manifests everywhere).
    pub fn new(client: Client) -> Self {
        Self {
            client,
            known: Mutex::default(),
        }
    }

    /// Whether no Manifest with UID `uid` exists, in any namespace: a metadata-only listing of
    /// the Manifests, paged, read from etcd (a quorum read, not the watch cache: a Manifest that
    /// labelled an object exists in every read after that label) and stopped at the page that
    /// holds it. UIDs are never reused, so a Manifest found gone stays gone.
    pub async fn gone(&self, uid: &str) -> Result<bool, ApplyError> {
        let mut known = self.known.lock().await;
        if let Some(exists) = known.get(uid) {
            return Ok(!exists);
        }
        let exists = self
            .exists(uid)
            .await
            .map_err(|source| ApplyError::ReadOwner {
                owner: uid.to_owned(),
                source,
            })?;
        known.insert(uid.to_owned(), exists);
        Ok(!exists)
    }

    async fn exists(&self, uid: &str) -> Result<bool, kube::Error> {
        let api: Api<Manifest> = Api::all(self.client.clone());
        let mut params = ListParams::default().limit(PAGE);
        loop {
            let page = api.list_metadata(&params).await?;
            if page.items.iter().any(|m| m.uid().as_deref() == Some(uid)) {
                return Ok(true);
            }
            match page.metadata.continue_.filter(|token| !token.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(false),
            }
        }
    }
}
