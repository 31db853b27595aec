//! The control plane starts for real, serves requests, and leaves no process behind: not when
//! dropped, and not when the process that started it is killed with SIGKILL.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, PostParams};
use testenv::{ControlPlane, Options, Stop, pid_runs};

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The state letter of `/proc/<pid>/stat` (`T` when stopped by a signal).
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

#[tokio::test]
async fn start_serve_and_stop_leaves_no_process() {
    let control_plane = ControlPlane::start(Options {
        controller_manager: true,
        ..Default::default()
    })
    .await
    .expect("start");
    let endpoints = control_plane.endpoints();
    let names: Vec<&str> = endpoints.pids.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["etcd", "kube-apiserver", "kube-controller-manager"]);
    for (name, pid) in &endpoints.pids {
        assert!(pid_runs(*pid, name), "{name} ({pid}) runs");
    }
    // pause() freezes a component; resume() and dropping the answer let it run on.
    let kcm = control_plane.pid("kube-controller-manager").unwrap();
    let paused = control_plane.pause("kube-controller-manager").unwrap();
    wait_until("paused", || process_state(kcm) == Some('T'));
    paused.resume().unwrap();
    wait_until("resumed", || process_state(kcm).is_some_and(|s| s != 'T'));
    drop(control_plane.pause("kube-controller-manager").unwrap());
    wait_until("resumed on drop", || {
        process_state(kcm).is_some_and(|s| s != 'T')
    });
    assert!(matches!(
        control_plane.pause("kubelet"),
        Err(testenv::Error::NoSuchProcess(_))
    ));
    eprintln!(
        "kube-apiserver ready after {} ms",
        endpoints.apiserver_ready_after_ms
    );

    // The API server answers, and with the controller-manager a namespace deletion completes.
    let client = control_plane.client().await.unwrap();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(
        version.git_version,
        format!("v{}", testenv::tools::pinned_version("KUBERNETES_VERSION"))
    );
    let ns = control_plane.namespace(&client, "lifecycle").await.unwrap();
    let namespaces = Api::<Namespace>::all(client.clone());
    namespaces
        .delete(&ns, &DeleteParams::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while namespaces.get_opt(&ns).await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "namespace {ns} was not finalized by kube-controller-manager"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    drop(control_plane);
    for (name, pid) in &endpoints.pids {
        assert!(
            !pid_runs(*pid, name),
            "{name} ({pid}) still runs after drop"
        );
    }
    assert!(
        !endpoints.dir.exists(),
        "{} was not removed",
        endpoints.dir.display()
    );
}

/// Run as a child by `sigkill_of_the_test_process_leaves_no_orphans`: starts the shared control
/// plane, reports its PIDs, then waits to be killed.
#[tokio::test]
async fn child_started_then_killed() {
    let Some(report) = std::env::var_os("TESTENV_CHILD_REPORT") else {
        return;
    };
    let control_plane = testenv::shared(Options::default()).await.expect("start");
    let pids = serde_json::to_vec(&control_plane.endpoints().pids).unwrap();
    std::fs::write(Path::new(&report).with_extension("tmp"), pids).unwrap();
    std::fs::rename(Path::new(&report).with_extension("tmp"), &report).unwrap();
    tokio::time::sleep(Duration::from_secs(300)).await;
}

#[test]
fn sigkill_of_the_test_process_leaves_no_orphans() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("pids.json");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_started_then_killed", "--nocapture"])
        .env("TESTENV_CHILD_REPORT", &report)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    while !report.exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child test exited before reporting"
        );
        assert!(
            Instant::now() < deadline,
            "the child did not start a control plane in time"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let pids: Vec<(String, u32)> =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(pids.len(), 2);
    for (name, pid) in &pids {
        assert!(pid_runs(*pid, name), "{name} ({pid}) runs in the child");
    }

    child.kill().unwrap(); // SIGKILL: no destructor, no atexit handler runs.
    child.wait().unwrap();
    for (name, pid) in &pids {
        wait_until(&format!("{name} ({pid}) is gone"), || !pid_runs(*pid, name));
    }
}

/// etcd killed, kube-apiserver killed and stopped gracefully: each starts again on its port
/// and data, and what was written before is still there (the same object, the same uid).
#[tokio::test]
async fn etcd_and_apiserver_restart_on_their_ports_and_data() {
    let control_plane = ControlPlane::start(Options::default())
        .await
        .expect("start");
    let client = control_plane.client().await.unwrap();
    let ns = control_plane.namespace(&client, "restart").await.unwrap();
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    let before = config_maps
        .create(&PostParams::default(), &config_map("before"))
        .await
        .unwrap();
    for (program, how) in [
        ("etcd", Stop::Kill),
        ("kube-apiserver", Stop::Kill),
        ("kube-apiserver", Stop::Graceful),
    ] {
        let old = control_plane.pid(program).unwrap();
        let killed = control_plane.stop_process(program, how).await.unwrap();
        eprintln!("{program} {how:?}: SIGKILL needed: {killed}");
        assert!(!pid_runs(old, program), "{program} ({old}) still runs");
        assert_eq!(control_plane.pid(program), None);
        if program == "kube-apiserver" {
            assert!(config_maps.get("before").await.is_err(), "nobody answers");
        }
        control_plane.start_process(program).await.unwrap();
        let new = control_plane.pid(program).unwrap();
        assert!(new != old && pid_runs(new, program), "{program} {how:?}");
        // What `testenv up` writes to state.json for `testenv down`: the new pid.
        let pids = control_plane.endpoints().pids;
        assert!(
            pids.contains(&(program.to_owned(), new)) && !pids.iter().any(|(_, p)| *p == old),
            "{program} {how:?}: {pids:?}"
        );
        // The admin kubeconfig still reaches it: the same port.
        let client = control_plane.client().await.unwrap();
        let config_maps = Api::<ConfigMap>::namespaced(client, &ns);
        let after = config_maps.get("before").await.unwrap();
        assert_eq!(after.metadata.uid, before.metadata.uid, "{program} {how:?}");
        let name = format!("after-{program}-{how:?}").to_lowercase();
        config_maps
            .create(&PostParams::default(), &config_map(&name))
            .await
            .unwrap();
    }
    assert!(matches!(
        control_plane
            .stop_process("kube-controller-manager", Stop::Kill)
            .await,
        Err(testenv::Error::NoSuchProcess(_))
    ));
}

fn config_map(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        ..Default::default()
    }
}
