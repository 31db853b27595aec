//! The real node (`Options::kubelet`): a pod without kwok's toleration runs on it for real —
//! sandbox, CNI address on the node's bridge, Running — and the simulated node beside it is
//! tainted; nothing a pod sends leaves the machine, even along a route forged in its network
//! namespace; stopping the control plane leaves the machine as it was: the kernel settings the
//! node changes (kubelet's tunables, `ip_forward`), the iptables rules (`KUBE-` and the
//! isolation rules), the network namespaces, the bridge, kubelet's log links, no process in its
//! cgroups, no mount under its directory, no record. A start that fails after containerd ran
//! leaves the machine as it was too. Needs root and `hack/ensure-node-packages.sh` (`make setup`
//! runs it).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use testenv::node::{BRIDGE, NODE_IP, NODE_NAME, PAUSE_IMAGE, SYSCTLS, record_path};
use testenv::{ControlPlane, Options};

const LIMIT: Duration = Duration::from_secs(120);

/// One node per machine: the tests of this file take turns.
static ONE_NODE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs `sh -c script`; its stdout, trimmed.
fn sh(script: &str) -> String {
    let output = Command::new("sh").args(["-c", script]).output().unwrap();
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// What the node may change on the machine, as it is now.
fn machine() -> BTreeMap<String, String> {
    let mut now = BTreeMap::new();
    for name in SYSCTLS.iter().chain(&[
        "net/bridge/bridge-nf-call-iptables",
        "net/ipv6/conf/all/forwarding",
    ]) {
        let value = std::fs::read_to_string(Path::new("/proc/sys").join(name)).unwrap_or_default();
        now.insert(format!("sysctl {name}"), value.trim().to_owned());
    }
    for (what, script) in [
        (
            "iptables-save | grep -c KUBE-",
            "iptables-save | grep -c KUBE-",
        ),
        (
            "ip6tables-save | grep -c KUBE-",
            "ip6tables-save | grep -c KUBE-",
        ),
        (
            "iptables-save | grep -c mm-testenv",
            "iptables-save | grep -c mm-testenv",
        ),
        ("network namespaces", "ls /run/netns 2>/dev/null | sort"),
        ("the bridge", "ip -o link show mmtest0 2>/dev/null"),
        (
            "links in /var/log/containers into the node's directory",
            "find /var/log/containers -lname '*module-manager-testenv*' 2>/dev/null | wc -l",
        ),
    ] {
        now.insert(what.to_owned(), sh(script));
    }
    now.insert("record".to_owned(), record_path().exists().to_string());
    now
}

/// Kernel settings set for the test, the machine's written back when dropped.
struct Sysctls(Vec<(String, String)>);

impl Sysctls {
    fn set(values: &[(&str, &str)]) -> Self {
        let mut saved = Vec::new();
        for (name, value) in values {
            let path = Path::new("/proc/sys").join(name);
            let was = std::fs::read_to_string(&path).unwrap().trim().to_owned();
            std::fs::write(&path, value).unwrap();
            saved.push(((*name).to_owned(), was));
        }
        Self(saved)
    }
}

impl Drop for Sysctls {
    fn drop(&mut self) {
        for (name, value) in &self.0 {
            let _ = std::fs::write(Path::new("/proc/sys").join(name), value);
        }
    }
}

/// A network namespace standing for the world outside the machine (that of an `unshare --net`
/// process, not one of `ip netns add`, which bind-mounts `/run/netns` over itself and so hides
/// the pods' namespaces mounted there): a veth from the host (172.31.255.2) to it
/// (172.31.255.1), with a route back to the pods through the host. From the host, a connection
/// to it is refused (nothing listens): a pod's packet that got there would be refused too, one
/// that is dropped on the way times out.
struct Outside(std::process::Child);

const OUTSIDE_IP: &str = "172.31.255.1";

impl Outside {
    fn create() -> Self {
        let child = Command::new("unshare")
            .args(["--net", "sleep", "infinity"])
            .spawn()
            .unwrap();
        let outside = Self(child);
        let pid = outside.0.id().to_string();
        let ours = std::fs::read_link("/proc/self/ns/net").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::read_link(format!("/proc/{pid}/ns/net")).ok() == Some(ours.clone()) {
            assert!(Instant::now() < deadline, "unshare --net did not unshare");
            std::thread::sleep(Duration::from_millis(20));
        }
        let inside = ["nsenter", "-t", &pid, "-n", "ip"];
        for argv in [
            &[
                "ip",
                "link",
                "add",
                "mmtest-out0",
                "type",
                "veth",
                "peer",
                "name",
                "mmtest-out1",
                "netns",
                &pid,
            ][..],
            &["ip", "addr", "add", "172.31.255.2/30", "dev", "mmtest-out0"],
            &["ip", "link", "set", "mmtest-out0", "up"],
            &[
                &inside[..],
                &["addr", "add", "172.31.255.1/30", "dev", "mmtest-out1"],
            ]
            .concat(),
            &[&inside[..], &["link", "set", "mmtest-out1", "up"]].concat(),
            &[&inside[..], &["link", "set", "lo", "up"]].concat(),
            &[
                &inside[..],
                &["route", "add", "default", "via", "172.31.255.2"],
            ]
            .concat(),
        ] {
            let status = Command::new(argv[0]).args(&argv[1..]).status().unwrap();
            assert!(status.success(), "{}", argv.join(" "));
        }
        outside
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        // The namespace, and the veth with it, goes with its last process.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Connects to `OUTSIDE_IP:80` with bash's `/dev/tcp` (in the network namespace `netns`, or the
/// host's), at most 5 s: what bash says, or "timed out".
fn connect_outside(netns: Option<&str>) -> String {
    let script = format!("exec 3<>/dev/tcp/{OUTSIDE_IP}/80");
    let mut argv: Vec<&str> = Vec::new();
    if let Some(netns) = netns {
        argv.extend(["ip", "netns", "exec", netns]);
    }
    argv.extend(["timeout", "5", "bash", "-c", &script]);
    let output = Command::new(argv[0]).args(&argv[1..]).output().unwrap();
    if output.status.code() == Some(124) {
        return "timed out".to_owned();
    }
    format!(
        "{} ({})",
        String::from_utf8_lossy(&output.stderr).trim(),
        output.status
    )
}

/// The pod network namespace (`/run/netns/cni-…`) holding `ip`.
fn netns_of(ip: &str) -> String {
    for entry in std::fs::read_dir("/run/netns").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("cni-")
            && sh(&format!("ip -n {name} -4 -o addr show")).contains(&format!("inet {ip}/"))
        {
            return name;
        }
    }
    panic!("no network namespace in /run/netns holds {ip}");
}

#[tokio::test]
async fn a_pod_runs_on_the_real_node_stays_on_the_machine_and_the_node_leaves_nothing_behind() {
    let _turn = ONE_NODE.lock().await;
    // kubelet sets these at every start (overcommit 1, panic 10, panic_on_oops 1); an earlier
    // node may have left its values in place, where the restore would not show, so the test
    // sets the kernel's defaults (this kernel's CONFIG_PANIC_TIMEOUT=0, no PANIC_ON_OOPS) for its
    // run and writes the machine's back at the end. (A run whose teardown left something keeps
    // its record, and the next start's sweep writes these defaults back, not the machine's.)
    let _sysctls = Sysctls::set(&[
        ("vm/overcommit_memory", "0"),
        ("kernel/panic", "0"),
        ("kernel/panic_on_oops", "0"),
    ]);
    let before = machine();
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

    // Nothing leaves the machine, even along a forged route: a default route via the node is
    // added in the pod's network namespace (from the host: what a pod with NET_ADMIN could do
    // itself), and a connection to an address beyond another interface of the host, which the
    // host itself reaches, times out.
    let outside = Outside::create();
    let from_host = connect_outside(None);
    assert!(
        from_host.contains("Connection refused"),
        "the outside answers the host: {from_host}"
    );
    let netns = netns_of(&ip);
    let status = Command::new("ip")
        .args(["-n", &netns, "route", "add", "default", "via"])
        .arg(NODE_IP.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "a default route added in {netns}");
    let from_pod = connect_outside(Some(&netns));
    assert_eq!(
        from_pod, "timed out",
        "a pod's connection to {OUTSIDE_IP}, off the bridge, is dropped on the machine"
    );
    drop(outside);

    control_plane.stop();
    assert_eq!(
        machine(),
        before,
        "the machine is as it was before the node started"
    );
    assert!(!record_path().exists(), "the node's record is removed");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let node_dir = node_dir.to_string_lossy().into_owned();
    assert!(
        !mounts.lines().any(|l| l.contains(&node_dir)),
        "no mount is left under {node_dir}"
    );
    assert!(
        !Path::new(&format!("/sys/class/net/{BRIDGE}")).exists(),
        "the bridge {BRIDGE} is removed"
    );
    for hierarchy in ["memory", "pids", "unified"] {
        let cgroup = Path::new("/sys/fs/cgroup")
            .join(hierarchy)
            .join("mm-testenv");
        assert!(
            !cgroup.exists(),
            "the node's cgroup {} is removed",
            cgroup.display()
        );
    }
}

#[tokio::test]
async fn a_failed_start_leaves_the_machine_as_it_was() {
    let _turn = ONE_NODE.lock().await;
    let before = machine();
    // Two failures: kube-apiserver refusing an unknown feature gate, after the host was prepared
    // (the bridge, the isolation rules, the record) but before the node's start; the import of
    // an image that does not exist, after containerd started.
    for (options, says) in [
        (
            Options {
                kubelet: true,
                feature_gates: vec!["NoSuchFeatureGate".to_owned()],
                ..Default::default()
            },
            "kube-apiserver",
        ),
        (
            Options {
                kubelet: true,
                images: vec!["/nonexistent/module-manager-e2e.tar".into()],
                ..Default::default()
            },
            "/nonexistent/module-manager-e2e.tar",
        ),
    ] {
        let error = match ControlPlane::start(options).await {
            Ok(_) => panic!("a control plane started that should not have ({says})"),
            Err(e) => e.to_string(),
        };
        assert!(error.contains(says), "the start fails on {says}: {error}");
        assert_eq!(
            machine(),
            before,
            "the machine is as it was before the failed start ({says})"
        );
        let containerd = sh("pgrep -af '[c]ontainerd --config=.*module-manager-testenv' || true");
        assert!(
            containerd.is_empty(),
            "no containerd of the node runs: {containerd}"
        );
    }
}
