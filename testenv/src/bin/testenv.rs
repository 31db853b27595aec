//! `testenv up | down | status`: keeps one local control plane running for manual use.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, Subcommand};
use testenv::{ControlPlane, Endpoints, Options, pid_runs, stop_pid, tools};

#[derive(Parser)]
#[command(
    name = "testenv",
    about = "A local etcd + kube-apiserver (+ kube-controller-manager) for manual use"
)]
struct Cli {
    /// Where the running control plane keeps its state, certificates, data and logs.
    #[arg(long, global = true, default_value_os_t = tools::cache_root().join("cluster"))]
    state_dir: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a control plane in the background (or reuse the running one); print its kubeconfig path.
    Up {
        /// CRD YAML files to install.
        #[arg(long = "crds")]
        crd_files: Vec<PathBuf>,
        /// Do not run kube-controller-manager (nor the simulated nodes).
        #[arg(long)]
        no_controller_manager: bool,
        /// Simulated nodes (kube-scheduler + kwok), so that workloads roll out; 0 for none.
        #[arg(long, default_value_t = 2)]
        nodes: usize,
        /// kube-apiserver feature gates to enable, e.g. `ShardedListAndWatch` (repeatable).
        #[arg(long = "feature-gate")]
        feature_gates: Vec<String>,
        /// Also run a real node: containerd, kubelet and kube-proxy (root; docs/development.md
        /// § A real node). The simulated nodes are then tainted `kwok.x-k8s.io/node=fake:NoSchedule`.
        #[arg(long)]
        kubelet: bool,
        /// OCI image archives to import into the real node (`hack/build-image.sh`; repeatable).
        #[arg(long = "image", requires = "kubelet")]
        images: Vec<PathBuf>,
    },
    /// Stop the control plane and remove its state.
    Down,
    /// Print the kubeconfig path if a control plane is running; fail otherwise.
    Status,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let state_file = cli.state_dir.join("state.json");
    match cli.command {
        Command::Up {
            crd_files,
            no_controller_manager,
            nodes,
            feature_gates,
            kubelet,
            images,
        } => {
            if kubelet && no_controller_manager {
                anyhow::bail!(
                    "--kubelet needs the controller-manager: drop --no-controller-manager"
                );
            }
            if let Some(running) = running(&state_file) {
                eprintln!("control plane already running at {}", running.server);
                for file in &crd_files {
                    testenv::install_crds(&testenv::client_for(&running.kubeconfig).await?, file)
                        .await?;
                }
                println!("{}", running.kubeconfig.display());
                return Ok(());
            }
            stop_all(&state_file);
            let _ = std::fs::remove_dir_all(&cli.state_dir);
            let options = Options {
                controller_manager: !no_controller_manager,
                crd_files,
                dir: Some(cli.state_dir.join("run")),
                detached: true,
                controllers: None,
                simulated_nodes: if no_controller_manager { 0 } else { nodes },
                node_monitor_grace_period: None,
                audit_log: false,
                feature_gates,
                kubelet,
                images,
            };
            let endpoints = ControlPlane::start(options).await?.detach();
            std::fs::write(&state_file, serde_json::to_vec_pretty(&endpoints)?)?;
            eprintln!(
                "control plane ready at {} after {} ms; logs in {}",
                endpoints.server,
                endpoints.apiserver_ready_after_ms,
                endpoints.dir.display()
            );
            println!("{}", endpoints.kubeconfig.display());
        }
        Command::Down => {
            if stop_all(&state_file) {
                eprintln!("control plane stopped");
            } else {
                eprintln!("no control plane was running");
            }
            let _ = std::fs::remove_dir_all(&cli.state_dir);
        }
        Command::Status => match running(&state_file) {
            Some(endpoints) => println!("{}", endpoints.kubeconfig.display()),
            None => anyhow::bail!(
                "no control plane is running (state: {})",
                state_file.display()
            ),
        },
    }
    Ok(())
}

fn read_state(state_file: &Path) -> Option<Endpoints> {
    serde_json::from_slice(&std::fs::read(state_file).ok()?).ok()
}

/// The recorded control plane, if every one of its processes is still alive.
fn running(state_file: &Path) -> Option<Endpoints> {
    read_state(state_file).filter(|e| e.pids.iter().all(|(name, pid)| pid_runs(*pid, name)))
}

/// Stops the recorded processes, newest first; whether any was running.
fn stop_all(state_file: &Path) -> bool {
    let Some(endpoints) = read_state(state_file) else {
        return false;
    };
    let mut any = false;
    // The real node first: kube-proxy, kubelet, then its pods, containerd and the rest.
    for (name, pid) in endpoints.pids.iter().rev() {
        if ["kube-proxy", "kubelet"].contains(&name.as_str()) && pid_runs(*pid, name) {
            any |= stop_pid(*pid, Duration::from_secs(10));
        }
    }
    if let Some(node) = &endpoints.node
        && let Err(left) = testenv::node::teardown(node)
    {
        eprintln!(
            "the real node left: {}; its record {} stays, and the next start sweeps again",
            left.join("; "),
            testenv::node::record_path().display()
        );
    }
    for (name, pid) in endpoints.pids.iter().rev() {
        if pid_runs(*pid, name) {
            any |= stop_pid(*pid, Duration::from_secs(10));
        }
    }
    any
}
