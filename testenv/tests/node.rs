//! The real node (`Options::kubelet`): a pod without kwok's toleration runs on it for real —
//! sandbox, CNI address on the node's bridge, Running — and the simulated node beside it is
//! tainted; stopping the control plane leaves nothing of the node behind (no process in its
//! cgroups, no mount under its directory, no bridge, no record, `ip_forward` as it was).
//! Needs root and `hack/ensure-node-packages.sh` (`make setup` runs it).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use testenv::node::{BRIDGE, NODE_NAME, PAUSE_IMAGE, record_path};
use testenv::{ControlPlane, Options};

const LIMIT: Duration = Duration::from_secs(120);

#[tokio::test]
async fn a_pod_runs_on_the_real_node_and_the_node_leaves_nothing_behind() {
    let ip_forward_before = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").unwrap();
    let control_plane = ControlPlane::start(Options {
        kubelet: true,
        simulated_nodes: 1,
        ..Default::default()
    })
    .await
    .expect("start a control plane with a real node");
    let client = control_plane.client().await.unwrap();
    let node_dir = control_plane.endpoints().node.clone().expect("a node").dir;

    let kwok = Api::<Node>::all(client.clone())
        .get("kwok-node-0")
        .await
        .unwrap();
    let taints = kwok.spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(
        taints
            .iter()
            .any(|t| t.key == "kwok.x-k8s.io/node" && t.effect == "NoSchedule"),
        "the simulated node is tainted beside the real one: {taints:?}"
    );

    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sleeper"},
        "spec": {
            "automountServiceAccountToken": false,
            "containers": [{"name": "pause", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let deadline = Instant::now() + LIMIT;
    let running = loop {
        let pod = pods.get("sleeper").await.unwrap();
        let status = pod.status.clone().unwrap_or_default();
        if status.phase.as_deref() == Some("Running") {
            break pod;
        }
        assert!(
            Instant::now() < deadline,
            "the pod is not Running on the real node: {status:?}\nkubelet's log ends:\n{}",
            std::fs::read_to_string(control_plane.endpoints().dir.join("kubelet.log"))
                .unwrap_or_default()
                .lines()
                .rev()
                .take(20)
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(
        running.spec.unwrap().node_name.as_deref(),
        Some(NODE_NAME),
        "the pod without kwok's toleration lands on the real node"
    );
    let ip = running.status.unwrap().pod_ip.unwrap_or_default();
    assert!(
        ip.starts_with("10.244.0."),
        "the pod's address is on the node's bridge: {ip}"
    );

    control_plane.stop();
    assert!(!record_path().exists(), "the node's record is removed");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let node_dir = node_dir.to_string_lossy().into_owned();
    assert!(
        !mounts.lines().any(|l| l.contains(&node_dir)),
        "no mount is left under {node_dir}"
    );
    assert!(
        !std::path::Path::new(&format!("/sys/class/net/{BRIDGE}")).exists(),
        "the bridge {BRIDGE} is removed"
    );
    assert!(
        !std::path::Path::new("/sys/fs/cgroup/memory/mm-testenv").exists(),
        "the node's cgroups are removed"
    );
    assert_eq!(
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").unwrap(),
        ip_forward_before,
        "ip_forward is as it was"
    );
}
