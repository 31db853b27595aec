//! What a cached remote target client keeps on the heap (issue 29: memory at 5,000 targets).
//!
//! A counting global allocator tells the bytes allocated and not freed: the clients of `N`
//! kubeconfig Secrets that name the same real API server are built one after the other through
//! the replica's own path (`apply::target::resolve`: the Secret read, the kubeconfig checked, the
//! client with its TLS configuration, discovery), and the heap held once they are all cached,
//! divided by `N`, is what one cached target costs.
//!
//! The counter sees every thread's allocations: this file holds one test, so that no other test
//! of the binary allocates beside it. The figure includes each client's pooled connection (the
//! API server closes idle ones after a while; the loop takes seconds), so the bound is a second
//! check: the shared snapshot is asserted directly.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use module_manager::api::Manifest;
use module_manager::apply::target::{TargetClients, TargetSettings, resolve};
use module_manager::telemetry::metrics::TargetMetrics;
use serde_json::json;
use std::sync::Arc;

struct Counting;

static HELD: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        HELD.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn held() -> isize {
    HELD.load(Ordering::Relaxed)
}

/// A Manifest of namespace `ns` whose target is the kubeconfig Secret `secret`.
fn manifest_for(ns: &str, secret: &str) -> Manifest {
    serde_json::from_value(json!({
        "apiVersion": "modulemanager.io/v1alpha1",
        "kind": "Manifest",
        "metadata": {"name": secret, "namespace": ns},
        "spec": {"module": "m", "chart": {"path": "x"},
                 "target": {"kubeconfigSecretRef": {"name": secret}}},
    }))
    .unwrap()
}

/// Heap held per cached target client (issue 29: 582 MiB per replica at 5,000 targets, ~4,340
/// cached clients each). Before discovery snapshots were shared (`apply/surface.rs`), each held
/// its own: 112 KiB per client — discovery 44, a plain kube `Client` 28, its pooled TLS
/// connection 37, the rest 3; shared, 76. Both assertions below fail on unshared snapshots.
#[tokio::test(flavor = "current_thread")]
async fn a_cached_target_client_holds_little_heap() {
    const N: usize = 100;
    const BOUND_KIB: isize = 96;
    let plane = testenv::shared(testenv::Options::default())
        .await
        .expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = plane.namespace(&client, "target-memory").await.unwrap();
    let kubeconfig = std::fs::read(plane.kubeconfig()).unwrap();
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    for i in 0..N + 5 {
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("t{i}")),
                ..Default::default()
            },
            data: Some([("kubeconfig".to_owned(), ByteString(kubeconfig.clone()))].into()),
            ..Default::default()
        };
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }
    let local = module_manager::apply::Cluster::connect(client.clone())
        .await
        .unwrap();
    let targets = TargetClients::new(TargetSettings::default(), TargetMetrics::default());
    let mut surfaces = Vec::new();
    let mut before = 0;
    // The first 5: lazies and pools that exist once per process.
    for i in 0..N + 5 {
        if i == 5 {
            before = held();
        }
        let manifest = manifest_for(&ns, &format!("t{i}"));
        let target = resolve(&manifest, &local, &client, &targets).await.unwrap();
        surfaces.push(target.surface());
    }
    let per_client = (held() - before) / N as isize / 1024;
    eprintln!(
        "{} clients cached; heap held per client: {per_client} KiB",
        targets.len()
    );
    assert_eq!(targets.len(), N + 5, "every client is cached");
    assert!(
        surfaces.iter().all(|s| Arc::ptr_eq(s, &surfaces[0])),
        "one discovery snapshot for the targets that serve the same APIs"
    );
    assert!(
        per_client <= BOUND_KIB,
        "{per_client} KiB per cached target client (at most {BOUND_KIB})"
    );
}
