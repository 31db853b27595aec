//! The kube calls the integration tests repeat, each in one line: list, names, whether an object
//! exists, create from JSON, merge patches (object and status), server-side apply, delete. Each
//! panics with the step and the object's name when the API server refuses (a test's failure).

use std::fmt::Debug;

use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// What these helpers ask of an object type (creating and applying also ask for `Serialize`).
pub trait Object: Resource + Clone + DeserializeOwned + Debug {}
impl<K: Resource + Clone + DeserializeOwned + Debug> Object for K {}

/// Every object of `api`, in the API server's order.
pub async fn list<K: Object>(api: &Api<K>) -> Vec<K> {
    api.list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("list: {e}"))
        .items
}

/// The names of every object of `api`, in the API server's order.
pub async fn names<K: Object>(api: &Api<K>) -> Vec<String> {
    list(api).await.iter().map(ResourceExt::name_any).collect()
}

/// Whether the object `name` exists.
pub async fn exists<K: Object>(api: &Api<K>, name: &str) -> bool {
    api.get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("get {name}: {e}"))
        .is_some()
}

/// The UID of the object `name`.
pub async fn uid<K: Object>(api: &Api<K>, name: &str) -> String {
    let object = api
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("get {name}: {e}"));
    object.uid().unwrap_or_else(|| panic!("{name} has no UID"))
}

/// Creates the object written as JSON (the namespace is `api`'s).
pub async fn create_json<K: Object + Serialize>(api: &Api<K>, object: Value) -> K {
    let object: K = serde_json::from_value(object).unwrap_or_else(|e| panic!("the object: {e}"));
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("create {}: {e}", object.name_any()))
}

/// JSON-merge-patches the object `name`.
pub async fn merge<K: Object>(api: &Api<K>, name: &str, patch: Value) -> K {
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("patch {name}: {e}"))
}

/// JSON-merge-patches the status of the object `name` (its status subresource).
pub async fn merge_status<K: Object>(api: &Api<K>, name: &str, patch: Value) -> K {
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("patch the status of {name}: {e}"))
}

/// Server-side applies `object` as field manager `manager`, taking fields over (`force`).
pub async fn apply<K: Object + Serialize>(api: &Api<K>, manager: &str, object: &K) -> K {
    let name = object.name_any();
    api.patch(
        &name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(object),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {name}: {e}"))
}

/// Deletes the object `name` (it may stay while finalizers hold it).
pub async fn delete<K: Object>(api: &Api<K>, name: &str) {
    api.delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete {name}: {e}"));
}

/// A loopback port nothing listens on (free when asked; another process may take it after).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .unwrap_or_else(|e| panic!("bind a loopback port: {e}"))
}
