//! A real node for the local control plane ([`crate::Options::kubelet`]): containerd, runc and
//! the CNI plugins from Debian, kubelet and kube-proxy built by `hack/build-tools.sh`, a static
//! `pause` image built here. Pods run for real, reach the API server through the `kubernetes`
//! Service, and nothing they send is forwarded off the machine ([`ISOLATION_RULES`]). The set-up
//! and each workaround: docs/development.md § A real node.
//!
//! Needs root (containers, mounts, cgroups, iptables). One node per machine: its bridge, its
//! cgroup subtree and the record of the running one ([`record_path`], under `/run`, behind a
//! lock) are fixed; a second start while one runs fails with [`Error::Node`], and a start after a
//! node whose owner died sweeps what it left (its pods' processes, mounts, network namespaces,
//! cgroups, rules, kernel settings) first. Everything [`prepare_host`] changes on the machine is
//! undone when the start fails ([`HostGuard`]) and when the node stops ([`teardown`]); a record
//! stays until a teardown left nothing behind.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::File;
use std::net::{Ipv4Addr, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as NodeObject;
use kube::Client;
use kube::api::Api;
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::process::{Lifetime, Proc, stop_pid};
use crate::tools::Tools;

/// The node's name (`kubernetes.io/hostname`).
pub const NODE_NAME: &str = "testenv-node";
/// The bridge the pods are attached to; its address is the node's and the API server's.
pub const BRIDGE: &str = "mmtest0";
/// The node's address: the bridge's, on no physical interface.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
/// The pods' subnet (the bridge's), with [`NODE_IP`] as their gateway.
pub const POD_SUBNET: &str = "10.244.0.0/24";
/// The Service range of the API server (`--service-cluster-ip-range`): the only destination
/// besides the pod subnet a pod has a route to.
pub const SERVICE_RANGE: &str = "10.0.0.0/16";
/// The `kubernetes` Service's address (the first of [`SERVICE_RANGE`]).
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
/// The cgroup (under every v1 controller) the node's pods live in; everything in it is ours.
const CGROUP_ROOT: &str = "mm-testenv";
/// The sandbox image, built from `testenv/node/pause.c`.
pub const PAUSE_IMAGE: &str = "localhost/module-manager-testenv/pause:1";
const PAUSE_SOURCE: &str = include_str!("../node/pause.c");
/// How long the node may take to become Ready (containerd, kubelet, its first status).
const NODE_READY_TIMEOUT: Duration = Duration::from_secs(180);

/// Where the machine-wide record of the running node and its lock live: root's, one per machine
/// (not per `HOME` or `MODULE_MANAGER_CACHE`, which two users of the machine may set apart).
const RUN_DIR: &str = "/run/module-manager-testenv";

/// The kernel settings (under `/proc/sys`) the node changes, saved when it starts and written
/// back when it stops: `ip_forward` (the bridge plugin with `isGateway` turns it on), the ones
/// kubelet's `setupKernelTunables` sets at every start (`vm.overcommit_memory=1`,
/// `vm.panic_on_oom=0`, `kernel.panic=10`, `kernel.panic_on_oops=1`, `kernel.keys.root_maxkeys`,
/// `kernel.keys.root_maxbytes`) and `route_localnet` (kube-proxy's, for localhost NodePorts,
/// which are off here).
pub const SYSCTLS: [&str; 8] = [
    "net/ipv4/ip_forward",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/conf/all/route_localnet",
];

/// What a running node is made of, as recorded in [`record_path`] and in `state.json`
/// (`testenv down` tears a detached node down with it).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeState {
    /// The node's working directory: configuration, containerd's root and state, kubelet's root,
    /// runc's state, the pods' logs.
    pub dir: PathBuf,
    /// containerd's socket.
    pub socket: PathBuf,
    /// containerd's pid once it started (recognized by its `--config` path, not by name alone).
    pub containerd_pid: Option<u32>,
    /// The values of [`SYSCTLS`] before the node started.
    pub sysctls_before: BTreeMap<String, String>,
}

/// The machine-wide record of the running node (`/run/module-manager-testenv/node.json`).
pub fn record_path() -> PathBuf {
    Path::new(RUN_DIR).join("node.json")
}

fn lock_path() -> PathBuf {
    Path::new(RUN_DIR).join("node.lock")
}

/// containerd's configuration file in the node's directory (how its process is recognized).
fn containerd_config_path(dir: &Path) -> PathBuf {
    dir.join("containerd.toml")
}

/// Ports and credentials the control plane hands the node.
pub(crate) struct NodeInputs<'a> {
    pub dir: &'a Path,
    pub client_ca: &'a Path,
    /// Kubeconfig of `system:node:testenv-node` (group `system:nodes`).
    pub kubelet_kubeconfig: &'a Path,
    /// Kubeconfig of `system:kube-proxy`.
    pub proxy_kubeconfig: &'a Path,
    pub lifetime: Lifetime,
}

/// The running node's processes (kube-proxy, kubelet, containerd: stopped in that order, then
/// the rest is swept by its [`HostGuard`]). Dropping it stops it.
pub(crate) struct Node {
    pub procs: Vec<Proc>,
    guard: HostGuard,
}

/// What [`prepare_host`] changed on the machine (the record, the bridge, the isolation rules,
/// then containerd, kubelet's kernel settings, the cgroups, the mounts…): dropping it runs
/// [`teardown`], unless the node was stopped or detached. A failed start therefore leaves the
/// machine as it was, and does so before the run directory (a `TempDir`, the node's mounts under
/// it) is removed. It holds the machine-wide lock while it lives.
pub(crate) struct HostGuard {
    state: NodeState,
    armed: bool,
    _lock: File,
}

impl HostGuard {
    /// The node's state as recorded.
    pub(crate) fn state(&self) -> &NodeState {
        &self.state
    }

    fn record(&self) -> Result<(), Error> {
        write(
            &record_path(),
            &serde_json::to_string_pretty(&self.state).expect("the node state serializes"),
        )
    }

    fn set_containerd(&mut self, pid: u32) -> Result<(), Error> {
        self.state.containerd_pid = Some(pid);
        self.record()
    }

    /// Tears the node down now (once); false when something was left (the record then stays).
    fn teardown(&mut self) -> bool {
        if !self.armed {
            return true;
        }
        self.armed = false;
        teardown_unlocked(&self.state).is_ok()
    }
}

impl Drop for HostGuard {
    fn drop(&mut self) {
        if self.armed {
            tracing::warn!(dir = %self.state.dir.display(), "the real node did not start: undoing what it changed on this machine");
            self.teardown();
        }
    }
}

/// Checks what the node needs without changing anything: root, Debian's containerd, runc, the
/// CNI plugins, iproute2, iptables and gcc (`hack/ensure-node-packages.sh` installs them).
pub fn check_prerequisites() -> Result<(), Error> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(node_error(
            "the real node (containerd, kubelet, kube-proxy) needs root",
        ));
    }
    for binary in [
        "/usr/bin/containerd",
        "/usr/bin/ctr",
        "/usr/sbin/runc",
        "/usr/lib/cni/bridge",
        "/usr/lib/cni/host-local",
        "/usr/lib/cni/portmap",
    ] {
        if !Path::new(binary).exists() {
            return Err(node_error(format!(
                "{binary} is missing: run hack/ensure-node-packages.sh (Debian's containerd, runc, containernetworking-plugins, iptables, iproute2)"
            )));
        }
    }
    for program in ["ip", "iptables", "gcc"] {
        if Command::new(program).arg("-V").output().is_err() {
            return Err(node_error(format!(
                "{program} is missing: run hack/ensure-node-packages.sh"
            )));
        }
    }
    Ok(())
}

/// Checks the machine can run the node and that no other node runs; sweeps a dead one's
/// leftovers; records the node (under the lock) and makes its bridge and isolation rules. `dir`
/// is the control plane's run directory (the node's is `dir/node`).
pub(crate) fn prepare_host(dir: &Path) -> Result<HostGuard, Error> {
    check_prerequisites()?;
    let lock = lock_exclusive()?;
    if let Some(previous) = read_record() {
        if containerd_runs(&previous) {
            return Err(node_error(format!(
                "a real node already runs on this machine (containerd pid {}, {}); stop it first (testenv down)",
                previous.containerd_pid.unwrap_or_default(),
                previous.dir.display()
            )));
        }
        tracing::warn!(dir = %previous.dir.display(), "sweeping the leftovers of a node whose owner died");
        if let Err(left) = teardown_unlocked(&previous) {
            return Err(node_error(format!(
                "the leftovers of an earlier node ({}) could not all be removed: {}; its record {} stays for the next sweep",
                previous.dir.display(),
                left.join("; "),
                record_path().display()
            )));
        }
    }
    let overlaps = overlapping_routes(&run("ip", &["-4", "route", "show", "table", "all"])?);
    if !overlaps.is_empty() {
        return Err(node_error(format!(
            "the node's fixed ranges (pods {POD_SUBNET}, Services {SERVICE_RANGE}) overlap this machine's routes: {}",
            overlaps.join("; ")
        )));
    }
    let node_dir = dir.join("node");
    let guard = HostGuard {
        state: NodeState {
            socket: node_dir.join("containerd.sock"),
            dir: node_dir,
            containerd_pid: None,
            sysctls_before: read_sysctls(),
        },
        armed: true,
        _lock: lock,
    };
    // Recorded before the first change: a start killed from here on is swept by the next one.
    guard.record()?;
    // The bridge and its address exist before the API server binds to it.
    if run("ip", &["link", "show", BRIDGE]).is_err() {
        run("ip", &["link", "add", BRIDGE, "type", "bridge"])?;
    }
    let addresses = run("ip", &["-4", "addr", "show", "dev", BRIDGE])?;
    if !addresses.contains(&format!("inet {NODE_IP}/")) {
        run(
            "ip",
            &["addr", "add", &format!("{NODE_IP}/24"), "dev", BRIDGE],
        )?;
    }
    run("ip", &["link", "set", BRIDGE, "up"])?;
    for rule in ISOLATION_RULES {
        run("iptables", &[&["-t", "mangle", "-I"][..], rule].concat())?;
    }
    Ok(guard)
}

/// The rules that keep the pods' traffic on the machine, in the `mangle` table's FORWARD chain
/// (every forwarded packet passes it before the `filter` table's FORWARD, where kube-proxy's
/// KUBE-FORWARD, inserted first, accepts established packets and those marked for
/// masquerading): nothing that enters on the bridge is forwarded to another interface, nothing
/// from another interface is forwarded onto the bridge. Traffic between pods (on the bridge) and
/// to and from the node's own addresses (INPUT, OUTPUT) is not forwarded and passes. IPv4 only:
/// the pods have no IPv6 address but their link-local ones, which are never forwarded.
const ISOLATION_RULES: [&[&str]; 2] = [
    &[
        "FORWARD",
        "-i",
        BRIDGE,
        "!",
        "-o",
        BRIDGE,
        "-m",
        "comment",
        "--comment",
        "mm-testenv",
        "-j",
        "DROP",
    ],
    &[
        "FORWARD",
        "!",
        "-i",
        BRIDGE,
        "-o",
        BRIDGE,
        "-m",
        "comment",
        "--comment",
        "mm-testenv",
        "-j",
        "DROP",
    ],
];

/// Takes the machine-wide lock of the node's record, or fails when another process holds it.
fn lock_exclusive() -> Result<File, Error> {
    std::fs::create_dir_all(RUN_DIR).map_err(|e| Error::io(format!("create {RUN_DIR}"), e))?;
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(lock_path())
        .map_err(|e| Error::io(format!("open {}", lock_path().display()), e))?;
    // SAFETY: flock on an open file descriptor has no memory effects.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(node_error(format!(
            "a real node already runs on this machine: another process holds {}; stop it first",
            lock_path().display()
        )));
    }
    Ok(file)
}

/// The values of [`SYSCTLS`] now (those this kernel has).
fn read_sysctls() -> BTreeMap<String, String> {
    SYSCTLS
        .iter()
        .filter_map(|name| {
            let value = std::fs::read_to_string(Path::new("/proc/sys").join(name)).ok()?;
            Some(((*name).to_owned(), value.trim().to_owned()))
        })
        .collect()
}

/// The routes of `ip -4 route show table all` that overlap [`POD_SUBNET`] or [`SERVICE_RANGE`]
/// (the default route aside; the bridge's own are the node's).
fn overlapping_routes(routes: &str) -> Vec<String> {
    const TYPES: [&str; 10] = [
        "unicast",
        "local",
        "broadcast",
        "multicast",
        "anycast",
        "unreachable",
        "blackhole",
        "prohibit",
        "throw",
        "nat",
    ];
    let ranges = [POD_SUBNET, SERVICE_RANGE].map(|r| (r, parse_prefix(r).expect("a valid range")));
    let mut out = Vec::new();
    for line in routes.lines() {
        let mut words = line.split_whitespace().peekable();
        if words.peek().is_some_and(|w| TYPES.contains(w)) {
            words.next();
        }
        let Some(destination) = words.next() else {
            continue;
        };
        if destination == "default" || line.contains(&format!(" dev {BRIDGE}")) {
            continue;
        }
        let Some(route) = parse_prefix(destination) else {
            continue;
        };
        for (name, range) in ranges {
            if overlap(route, range) {
                out.push(format!("`{}` overlaps {name}", line.trim()));
            }
        }
    }
    out
}

/// `a.b.c.d/len` (or a bare address, /32) as (address, length).
fn parse_prefix(prefix: &str) -> Option<(u32, u32)> {
    let (address, length) = prefix.split_once('/').unwrap_or((prefix, "32"));
    let address: Ipv4Addr = address.parse().ok()?;
    let length: u32 = length.parse().ok().filter(|l| *l <= 32)?;
    Some((u32::from(address), length))
}

fn overlap((a, a_len): (u32, u32), (b, b_len): (u32, u32)) -> bool {
    let len = a_len.min(b_len);
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    a & mask == b & mask
}

/// Starts containerd, imports the pause image and `images`, starts kubelet and kube-proxy and
/// waits until the node is Ready and kube-proxy has synced. On an error, the node is stopped and
/// `guard` undoes what was changed on the machine.
pub(crate) async fn start(
    tools: &Tools,
    inputs: NodeInputs<'_>,
    client: &Client,
    images: &[PathBuf],
    guard: HostGuard,
) -> Result<Node, Error> {
    let dir = guard.state().dir.clone();
    let socket = guard.state().socket.clone();
    let mut node = Node {
        procs: Vec::new(),
        guard,
    };
    std::fs::create_dir_all(dir.join("cni"))
        .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    write(&dir.join("cni/10-mm-testenv.conflist"), &cni_config(&dir))?;
    let containerd_config = containerd_config_path(&dir);
    write(&containerd_config, &containerd_config_toml(&dir, &socket))?;
    let mut containerd = Command::new("/usr/bin/containerd");
    containerd.arg(format!("--config={}", containerd_config.display()));
    let containerd = Proc::spawn(
        "containerd",
        containerd,
        &inputs.dir.join("containerd.log"),
        inputs.lifetime,
    )?;
    let pid = containerd.pid();
    node.procs.push(containerd);
    node.guard.set_containerd(pid)?;
    wait_containerd(&mut node).await?;
    import_image(&socket, &pause_archive(&dir)?)?;
    for image in images {
        import_image(&socket, image)?;
    }
    make_cgroup_root()?;

    let [kubelet_port, kubelet_healthz, proxy_healthz, proxy_metrics] =
        crate::control_plane::free_ports()?;
    let kubelet_config = dir.join("kubelet.yaml");
    write(
        &kubelet_config,
        &kubelet_config_yaml(&inputs, &dir, &socket, kubelet_port, kubelet_healthz),
    )?;
    let mut kubelet = Command::new(&tools.kubelet);
    kubelet.args([
        format!("--config={}", kubelet_config.display()),
        format!("--kubeconfig={}", inputs.kubelet_kubeconfig.display()),
        format!("--root-dir={}", dir.join("kubelet").display()),
        format!("--cert-dir={}", dir.join("kubelet-pki").display()),
        format!("--hostname-override={NODE_NAME}"),
        format!("--node-ip={NODE_IP}"),
        "--v=1".to_owned(),
    ]);
    node.procs.push(Proc::spawn(
        "kubelet",
        kubelet,
        &inputs.dir.join("kubelet.log"),
        inputs.lifetime,
    )?);
    wait_node_ready(client, &mut node).await?;

    let proxy_config = dir.join("kube-proxy.yaml");
    write(
        &proxy_config,
        &proxy_config_yaml(inputs.proxy_kubeconfig, proxy_healthz, proxy_metrics),
    )?;
    let mut proxy = Command::new(&tools.kube_proxy);
    proxy.args([
        format!("--config={}", proxy_config.display()),
        "--v=1".to_owned(),
    ]);
    node.procs.push(Proc::spawn(
        "kube-proxy",
        proxy,
        &inputs.dir.join("kube-proxy.log"),
        inputs.lifetime,
    )?);
    wait_proxy_synced(&mut node, proxy_healthz).await?;
    Ok(node)
}

impl Node {
    /// The node's state as recorded.
    pub(crate) fn state(&self) -> &NodeState {
        self.guard.state()
    }

    /// Stops kube-proxy, kubelet and containerd and sweeps the rest ([`teardown`]); false when
    /// something was left behind (logged; the record stays for the next start's sweep).
    pub(crate) fn stop(&mut self, grace: Duration) -> bool {
        // kube-proxy, then kubelet (so that it restarts no container); the teardown then kills
        // the pods' processes before it stops containerd.
        while self.procs.len() > 1 {
            if let Some(mut p) = self.procs.pop() {
                p.stop(grace);
            }
        }
        let clean = self.guard.teardown();
        // Reaps containerd (the teardown stopped it).
        self.procs.clear();
        clean
    }

    /// Lets the node run on after this process (`testenv up`; `testenv down` tears it down).
    pub(crate) fn detach(mut self) {
        for p in self.procs.drain(..) {
            p.leak();
        }
        self.guard.armed = false;
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

/// Tears down the node of `state` (`testenv down`), under the machine-wide lock (refused while
/// a live process holds it); [`teardown_unlocked`] says what. The error lists what was left.
pub fn teardown(state: &NodeState) -> Result<(), Vec<String>> {
    let _lock = lock_exclusive().map_err(|e| vec![e.to_string()])?;
    if let Some(recorded) = read_record()
        && recorded.dir != state.dir
        && containerd_runs(&recorded)
    {
        return Err(vec![format!(
            "another node runs ({}): left alone",
            recorded.dir.display()
        )]);
    }
    teardown_unlocked(state)
}

/// Removes what a node leaves behind, whether it stopped or its owner died: its pods'
/// processes (everything in the [`CGROUP_ROOT`] cgroups), their network namespaces (those of
/// their processes and those at the other end of the bridge's veths), containerd and its
/// shims, kubelet's links to the pods' logs, the mounts under its directory, its cgroups,
/// kube-proxy's and kubelet's rules, the isolation rules, the bridge, and the kernel settings as
/// they were. Each step is best effort; then what is left is listed, and the record is removed
/// only when nothing is.
fn teardown_unlocked(state: &NodeState) -> Result<(), Vec<String>> {
    let mut namespaces = pod_network_namespaces();
    namespaces.extend(bridge_network_namespaces());
    namespaces.sort();
    namespaces.dedup();
    kill_pods();
    for netns in &namespaces {
        umount(netns);
        let _ = std::fs::remove_file(netns);
    }
    if let Some(pid) = state.containerd_pid
        && containerd_runs(state)
    {
        stop_pid(pid, Duration::from_secs(10));
    }
    kill_shims(&state.socket);
    remove_container_log_links(&state.dir);
    let mut mounts = mounts_under(&state.dir);
    mounts.sort_by_key(|m| std::cmp::Reverse(m.as_os_str().len()));
    for m in mounts {
        umount(&m);
    }
    remove_cgroups();
    if let Ok(proxy) = Tools::node_binaries().map(|t| t.kube_proxy)
        && let Err(e) = run(&proxy.to_string_lossy(), &["--cleanup"])
    {
        tracing::warn!("kube-proxy --cleanup: {e}");
    }
    remove_kubelet_chains();
    for rule in ISOLATION_RULES {
        while run("iptables", &[&["-t", "mangle", "-D"][..], rule].concat()).is_ok() {}
    }
    let _ = run("ip", &["link", "del", BRIDGE]);
    for (name, value) in &state.sysctls_before {
        let path = Path::new("/proc/sys").join(name);
        if let Err(e) = std::fs::write(&path, value) {
            tracing::warn!("restore {}: {e}", path.display());
        }
    }
    let left = leftovers(state, &namespaces);
    if !left.is_empty() {
        tracing::warn!(dir = %state.dir.display(), "the node left: {}; its record stays for the next start's sweep", left.join("; "));
        return Err(left);
    }
    if read_record().is_none_or(|recorded| recorded.dir == state.dir) {
        let _ = std::fs::remove_file(record_path());
    }
    Ok(())
}

/// What of the node is still on the machine after a teardown.
fn leftovers(state: &NodeState, namespaces: &[PathBuf]) -> Vec<String> {
    let mut left = Vec::new();
    if containerd_runs(state) {
        left.push(format!(
            "containerd (pid {}) still runs",
            state.containerd_pid.unwrap_or_default()
        ));
    }
    let pids = pod_pids();
    if !pids.is_empty() {
        left.push(format!("processes of the pods still run: {pids:?}"));
    }
    let mounts = mounts_under(&state.dir);
    if !mounts.is_empty() {
        left.push(format!("mounts under {}: {mounts:?}", state.dir.display()));
    }
    let netns: Vec<&PathBuf> = namespaces.iter().filter(|n| n.exists()).collect();
    if !netns.is_empty() {
        left.push(format!("network namespaces: {netns:?}"));
    }
    let cgroups: Vec<PathBuf> = cgroup_mounts(true)
        .iter()
        .flat_map(|h| cgroup_tree(h))
        .collect();
    if !cgroups.is_empty() {
        left.push(format!("cgroups: {cgroups:?}"));
    }
    if Path::new("/sys/class/net").join(BRIDGE).exists() {
        left.push(format!("the bridge {BRIDGE}"));
    }
    for rule in ISOLATION_RULES {
        if run("iptables", &[&["-t", "mangle", "-C"][..], rule].concat()).is_ok() {
            left.push(format!("the rule `iptables -t mangle {}`", rule.join(" ")));
        }
    }
    let now = read_sysctls();
    for (name, before) in &state.sysctls_before {
        if now.get(name) != Some(before) {
            left.push(format!(
                "{name} is {}, was {before}",
                now.get(name).map_or("unreadable", String::as_str)
            ));
        }
    }
    left
}

/// Whether the node's containerd runs: its recorded pid is a containerd started with the node's
/// `--config` (a pid reused by another containerd is not it).
fn containerd_runs(state: &NodeState) -> bool {
    let Some(pid) = state.containerd_pid else {
        return false;
    };
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let config = format!("--config={}", containerd_config_path(&state.dir).display());
    args.first().is_some_and(|a| a.ends_with("containerd")) && args.contains(&config)
}

/// The network namespaces (`/run/netns/cni-…`) at the other end of the bridge's veths: the
/// pods', also those none of whose processes is left.
fn bridge_network_namespaces() -> Vec<PathBuf> {
    let Ok(links) = run("ip", &["-o", "link", "show", "master", BRIDGE]) else {
        return Vec::new();
    };
    links
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|w| w[0] == "link-netns" && w[1].starts_with("cni-"))
        .map(|w| Path::new("/run/netns").join(w[1]))
        .collect()
}

/// Removes kubelet's links in `/var/log/containers` (a directory kubelet does not let one move)
/// to the pods' logs under `dir` (`podLogsDir`).
fn remove_container_log_links(dir: &Path) {
    let Ok(entries) = std::fs::read_dir("/var/log/containers") else {
        return;
    };
    for entry in entries.flatten() {
        if std::fs::read_link(entry.path()).is_ok_and(|target| target.starts_with(dir)) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Removes the chains kubelet makes (kube-proxy's own `--cleanup` leaves them): its canary, the
/// hint of the iptables backend, and KUBE-FIREWALL with the jumps of INPUT and OUTPUT to it.
fn remove_kubelet_chains() {
    for iptables in ["iptables", "ip6tables"] {
        for (table, chain) in [
            ("mangle", "KUBE-KUBELET-CANARY"),
            ("nat", "KUBE-KUBELET-CANARY"),
            ("filter", "KUBE-KUBELET-CANARY"),
            ("mangle", "KUBE-IPTABLES-HINT"),
            ("filter", "KUBE-FIREWALL"),
        ] {
            for base in ["INPUT", "OUTPUT", "FORWARD"] {
                while run(iptables, &["-t", table, "-D", base, "-j", chain]).is_ok() {}
            }
            let _ = run(iptables, &["-t", table, "-F", chain]);
            let _ = run(iptables, &["-t", table, "-X", chain]);
        }
    }
}

/// Imports an OCI archive into containerd's `k8s.io` namespace (where the CRI finds images).
pub fn import_image(socket: &Path, archive: &Path) -> Result<(), Error> {
    run(
        "/usr/bin/ctr",
        &[
            "--address",
            &socket.to_string_lossy(),
            "-n",
            "k8s.io",
            "images",
            "import",
            &archive.to_string_lossy(),
        ],
    )
    .map(drop)
}

/// Compiles `pause.c` statically and writes its image archive (`hack/oci-image.py files`).
fn pause_archive(dir: &Path) -> Result<PathBuf, Error> {
    let source = dir.join("pause.c");
    let binary = dir.join("pause");
    let archive = dir.join("pause.tar");
    write(&source, PAUSE_SOURCE)?;
    run(
        "gcc",
        &[
            "-static",
            "-Os",
            "-o",
            &binary.to_string_lossy(),
            &source.to_string_lossy(),
        ],
    )?;
    run(
        "python3",
        &[
            &oci_image_script().to_string_lossy(),
            "files",
            "--ref",
            PAUSE_IMAGE,
            "--out",
            &archive.to_string_lossy(),
            "--file",
            &format!("{}:/pause", binary.display()),
            "--entrypoint",
            "[\"/pause\"]",
        ],
    )?;
    Ok(archive)
}

/// `hack/oci-image.py` of this repository.
pub fn oci_image_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/oci-image.py")
}

fn cni_config(dir: &Path) -> String {
    // The bridge plugin with isGateway gives the bridge NODE_IP and turns ip_forward on; no
    // masquerading and no default route in the pods: a pod reaches its subnet (the node, other
    // pods) and the Service range, and nothing else — no packet of a pod can leave the machine.
    serde_json::to_string_pretty(&serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "mm-testenv",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": true,
                "isDefaultGateway": false,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_IP.to_string()}]],
                    "routes": [{"dst": SERVICE_RANGE}],
                    "dataDir": dir.join("cni-ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    }))
    .expect("a static CNI configuration serializes")
}

fn containerd_config_toml(dir: &Path, socket: &Path) -> String {
    // restrict_oom_score_adj: this VM's bounding set lacks CAP_SYS_RESOURCE, so the sandbox's
    // write to its oom_score_adj below the parent's fails; with it, containerd clamps the value.
    // SystemdCgroup = false: cgroups v1 without systemd as PID 1 (the cgroupfs driver). runc's
    // state in the node's directory (Root), not /run/containerd/runc.
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{socket}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        Root = "{runc}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
        root = dir.join("containerd-root").display(),
        state = dir.join("containerd-state").display(),
        socket = socket.display(),
        cni = dir.join("cni").display(),
        runc = dir.join("runc").display(),
    )
}

fn kubelet_config_yaml(
    inputs: &NodeInputs<'_>,
    dir: &Path,
    socket: &Path,
    port: u16,
    healthz: u16,
) -> String {
    // cgroupfs and failCgroupV1: false for cgroups v1 without systemd (kubelet 1.35+ refuses v1
    // otherwise; containerd 1.6 cannot tell kubelet its driver). oomScoreAdj 0: kubelet may not
    // lower its own score without CAP_SYS_RESOURCE. Eviction thresholds and image GC at their
    // limits: the disk is shared with everything else on the machine, and the images are
    // imported, not pulled back. Anonymous requests off, the API server's client certificate
    // (client CA) authenticates, SubjectAccessReviews authorize. The pods' logs in the node's
    // directory, not /var/log/pods.
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {NODE_IP}
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {client_ca}}}
authorization: {{mode: Webhook}}
containerRuntimeEndpoint: unix://{socket}
cgroupDriver: cgroupfs
cgroupRoot: /{CGROUP_ROOT}
failCgroupV1: false
oomScoreAdj: 0
failSwapOn: false
evictionHard: {{memory.available: 100Mi, nodefs.available: 1%, nodefs.inodesFree: 1%, imagefs.available: 1%}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
serializeImagePulls: false
rotateCertificates: false
maxPods: 60
podLogsDir: {pod_logs}
"#,
        client_ca = inputs.client_ca.display(),
        pod_logs = dir.join("pod-logs").display(),
        socket = socket.display(),
    )
}

fn proxy_config_yaml(kubeconfig: &Path, healthz: u16, metrics: u16) -> String {
    // iptables mode (Debian's iptables, the nf_tables backend); no masquerading of anything but
    // what needs it (clusterCIDR unset, masqueradeAll off); NodePorts only on the node's
    // address; conntrack limits and timeouts left as the machine has them.
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {{kubeconfig: {kubeconfig}}}
hostnameOverride: {NODE_NAME}
healthzBindAddress: 127.0.0.1:{healthz}
metricsBindAddress: 127.0.0.1:{metrics}
mode: iptables
nodePortAddresses: ["{NODE_IP}/32"]
iptables: {{masqueradeAll: false, localhostNodePorts: false}}
conntrack: {{maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}
"#,
        kubeconfig = kubeconfig.display(),
    )
}

async fn wait_containerd(node: &mut Node) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let address = node.state().socket.to_string_lossy().into_owned();
    loop {
        for p in &mut node.procs {
            p.check_running()?;
        }
        if run("/usr/bin/ctr", &["--address", &address, "version"]).is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::NotReady {
                what: "containerd",
                log_tail: node.procs[0].log_tail(),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn wait_node_ready(client: &Client, node: &mut Node) -> Result<(), Error> {
    let nodes = Api::<NodeObject>::all(client.clone());
    let deadline = Instant::now() + NODE_READY_TIMEOUT;
    loop {
        for p in &mut node.procs {
            p.check_running()?;
        }
        let ready = nodes.get_opt(NODE_NAME).await?.is_some_and(|n| {
            n.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        });
        if ready {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::NotReady {
                what: "the real node (kubelet)",
                log_tail: node
                    .procs
                    .iter()
                    .map(|p| format!("--- {}\n{}\n", p.name(), p.log_tail()))
                    .collect(),
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// kube-proxy's `/healthz` answers 200 once its rules are synced.
async fn wait_proxy_synced(node: &mut Node, port: u16) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for p in &mut node.procs {
            p.check_running()?;
        }
        if http_status(port, "/healthz") == Some(200) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::NotReady {
                what: "kube-proxy",
                log_tail: node.procs.last().map(Proc::log_tail).unwrap_or_default(),
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The status code of a plain HTTP GET to 127.0.0.1:`port`.
fn http_status(port: u16, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut head = [0u8; 16];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// The v1 cgroup hierarchies mounted on this machine (`/sys/fs/cgroup/memory`, …), and with
/// `v2` the unified one too (where kubelet also makes its root: `/sys/fs/cgroup/unified`).
fn cgroup_mounts(v2: bool) -> Vec<PathBuf> {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return Vec::new();
    };
    mounts
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let v1 = fields.get(2) == Some(&"cgroup");
            let unified = v2 && fields.get(2) == Some(&"cgroup2");
            (v1 || unified).then(|| PathBuf::from(fields[1]))
        })
        .collect()
}

/// Creates [`CGROUP_ROOT`] in every hierarchy (kubelet requires its cgroup root to exist); in
/// cpuset, with the parent's CPUs and memory nodes (a new v1 cpuset starts empty).
fn make_cgroup_root() -> Result<(), Error> {
    for hierarchy in cgroup_mounts(false) {
        let ours = hierarchy.join(CGROUP_ROOT);
        if !ours.exists() {
            std::fs::create_dir(&ours)
                .map_err(|e| Error::io(format!("create {}", ours.display()), e))?;
        }
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(value) = std::fs::read_to_string(hierarchy.join(file)) {
                std::fs::write(ours.join(file), value.trim())
                    .map_err(|e| Error::io(format!("write {}", ours.join(file).display()), e))?;
            }
        }
    }
    Ok(())
}

/// Every directory of [`CGROUP_ROOT`]'s subtree in `hierarchy`, deepest first.
fn cgroup_tree(hierarchy: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&entry.path(), out);
                }
            }
        }
        out.push(dir.to_owned());
    }
    let mut out = Vec::new();
    let root = hierarchy.join(CGROUP_ROOT);
    if root.is_dir() {
        walk(&root, &mut out);
    }
    out
}

/// The processes of the node's pods: everything in [`CGROUP_ROOT`]'s `pids` (or `memory`) subtree.
fn pod_pids() -> Vec<libc::pid_t> {
    let mut pids = Vec::new();
    for hierarchy in cgroup_mounts(false)
        .into_iter()
        .filter(|h| h.ends_with("pids") || h.ends_with("memory"))
    {
        for dir in cgroup_tree(&hierarchy) {
            if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                pids.extend(
                    procs
                        .lines()
                        .filter_map(|l| l.trim().parse::<libc::pid_t>().ok()),
                );
            }
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// SIGKILLs every process of the node's pods until none is left (up to 10 s).
fn kill_pods() {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids = pod_pids();
        if pids.is_empty() || Instant::now() > deadline {
            return;
        }
        for pid in pids {
            // SAFETY: kill(2) with a positive pid and a valid signal has no memory effects.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The bind-mounted network namespaces (`/run/netns/cni-…`) of the node's pods' processes.
fn pod_network_namespaces() -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let ours: std::collections::BTreeSet<u64> = pod_pids()
        .into_iter()
        .filter_map(|pid| std::fs::metadata(format!("/proc/{pid}/ns/net")).ok())
        .map(|m| m.ino())
        .collect();
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("cni-"))
        .filter(|e| std::fs::metadata(e.path()).is_ok_and(|m| ours.contains(&m.ino())))
        .map(|e| e.path())
        .collect()
}

/// Kills containerd's shims for `socket` (they outlive containerd), found by their command line.
fn kill_shims(socket: &Path) {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    let socket = socket.to_string_lossy().into_owned();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args
            .first()
            .is_some_and(|a| a.ends_with("containerd-shim-runc-v2"))
            && args.contains(&socket)
        {
            stop_pid(pid, Duration::from_secs(2));
        }
    }
}

fn remove_cgroups() {
    for hierarchy in cgroup_mounts(true) {
        for dir in cgroup_tree(&hierarchy) {
            let _ = std::fs::remove_dir(&dir);
        }
    }
}

/// The mount points under `dir`.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    mount_points()
        .into_iter()
        .filter(|m| m.starts_with(dir))
        .collect()
}

fn mount_points() -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape_mount(m)))
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mount(path: &str) -> String {
    path.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

fn umount(path: &Path) {
    let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return;
    };
    // SAFETY: umount2 with a valid NUL-terminated path has no memory effects.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
}

fn read_record() -> Option<NodeState> {
    serde_json::from_slice(&std::fs::read(record_path()).ok()?).ok()
}

fn write(path: &Path, content: &str) -> Result<(), Error> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::io(format!("create {}", parent.display()), e))?;
    }
    std::fs::write(path, content).map_err(|e| Error::io(format!("write {}", path.display()), e))
}

/// Runs a command to completion; its stdout, or an error with its stderr.
fn run(program: &str, args: &[&str]) -> Result<String, Error> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| Error::io(format!("run {program}"), e))?;
    if !output.status.success() {
        return Err(node_error(format!(
            "{program} {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim(),
            String::from_utf8_lossy(&output.stdout).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn node_error(message: impl Into<String>) -> Error {
    Error::Node(message.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_overlapping_the_fixed_ranges_are_named() {
        let routes = "default via 192.0.2.1 dev eth0\n\
            192.0.2.0/24 dev eth0 proto kernel scope link src 192.0.2.2\n\
            10.244.0.0/24 dev mmtest0 proto kernel scope link src 10.244.0.1\n\
            10.0.0.0/8 via 192.0.2.9 dev eth0\n\
            10.244.0.128/25 dev docker0\n\
            local 10.0.3.4 dev eth1 table local proto kernel scope host src 10.0.3.4\n\
            broadcast 192.0.2.255 dev eth0 table local proto kernel scope link src 192.0.2.2\n\
            10.1.0.0/16 dev eth2\n";
        assert_eq!(
            overlapping_routes(routes),
            [
                "`10.0.0.0/8 via 192.0.2.9 dev eth0` overlaps 10.244.0.0/24",
                "`10.0.0.0/8 via 192.0.2.9 dev eth0` overlaps 10.0.0.0/16",
                "`10.244.0.128/25 dev docker0` overlaps 10.244.0.0/24",
                "`local 10.0.3.4 dev eth1 table local proto kernel scope host src 10.0.3.4` overlaps 10.0.0.0/16",
            ]
        );
        assert!(
            overlapping_routes("default via 192.0.2.1 dev eth0\n192.0.2.0/24 dev eth0\n")
                .is_empty()
        );
    }
}
