//! `loadtest <scenario> [options]`: runs a scenario against a local control plane and fleet it
//! starts itself, or against a deployed fleet (`--kubeconfig`); writes `results.json`,
//! `summary.md` and PNG charts; exits 1 when a checker found a violation, 2 on an error.

use std::time::SystemTime;

use anyhow::Context;
use clap::Parser;
use loadtest::options::{Options, Scenario};
use loadtest::phase::{Cluster, harness_client, repo};
use loadtest::run::execute;

#[derive(Parser)]
#[command(
    name = "loadtest",
    about = "Load-test a module-manager fleet: named scenarios, checkers that fail the run, capacity, baselines, reports (docs/loadtest.md)"
)]
struct Cli {
    /// The scenario.
    #[arg(value_enum)]
    scenario: Scenario,
    #[command(flatten)]
    options: Options,
}

fn main() {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    // Ctrl-C or SIGTERM ends the run: dropping it stops the replicas (SIGTERM, then SIGKILL),
    // removes their CPU cgroups and stops the control plane.
    let outcome = runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        tokio::select! {
            outcome = run(cli) => outcome,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted (SIGINT)")),
            _ = term.recv() => Err(anyhow::anyhow!("interrupted (SIGTERM)")),
        }
    });
    match outcome {
        Ok(true) => std::process::exit(0),
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("loadtest: {e:#}");
            std::process::exit(2);
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<bool> {
    let Cli { scenario, options } = cli;
    let stamp = k8s_openapi::jiff::Timestamp::try_from(SystemTime::now())?
        .strftime("%Y%m%dT%H%M%SZ")
        .to_string();
    let dir = options.out.join(format!("{}-{stamp}", scenario.name()));
    let result = match &options.kubeconfig {
        Some(kubeconfig) => {
            let client = harness_client(kubeconfig).await?;
            let cluster = Cluster::Deployed {
                client,
                kubeconfig: kubeconfig.clone(),
                run: format!("{}-{stamp}", scenario.name()).to_lowercase(),
            };
            execute(scenario, &options, cluster).await?
        }
        None => {
            eprintln!(
                "loadtest: starting the control plane (etcd, kube-apiserver, kube-controller-manager)"
            );
            let control_plane = testenv::ControlPlane::start(testenv::Options {
                controller_manager: true,
                crd_files: vec![repo(&options).join("crds/manifest.yaml")],
                // Requests per client (the fleet's apart from the others'): `mttp` only, the
                // log costs the API server a little per request.
                audit_log: scenario == Scenario::Mttp,
                feature_gates: options.feature_gates.clone(),
                ..Default::default()
            })
            .await
            .context("start the control plane")?;
            let result = execute(scenario, &options, Cluster::Local(&control_plane)).await;
            control_plane.stop();
            result?
        }
    };
    let files = loadtest::report::write(&result, &dir)?;
    println!("{}", loadtest::report::markdown(&result));
    eprintln!(
        "loadtest: wrote {}",
        files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    if !result.passed {
        eprintln!("loadtest: FAILED — {} violations:", result.violations.len());
        for v in &result.violations {
            eprintln!("  [{}] {}", v.checker, v.detail);
        }
    }
    Ok(result.passed)
}
