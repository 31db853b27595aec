//! The `module-manager` command line: `crd`, `run` (the operator), `admin` (its client) and the
//! Manifest commands (`get`, `describe`, `reconcile`, … `diff`); also `kubectl module-manager`.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use module_manager::runtime::{self, RunArgs};
use module_manager::{api, cli};

#[derive(Parser)]
#[command(name = "module-manager", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the Manifest CustomResourceDefinition as YAML.
    Crd,
    /// Run the operator: reconcile every Manifest of the cluster in $KUBECONFIG (or in-cluster).
    Run(Box<RunArgs>),
    /// Ask a replica's admin API and print the answer as a table.
    Admin(cli::AdminArgs),
    #[command(flatten)]
    Manifests(cli::ManifestCommand),
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    // Invoked as `kubectl-module_manager` (the plugin), help and usage say `kubectl module-manager`.
    let name = cli::display_name(std::env::args_os().next().as_deref());
    let matches = Cli::command().name(name).bin_name(name).get_matches();
    match Cli::from_arg_matches(&matches)?.command {
        Command::Crd => print!("{}", api::manifest_crd_yaml()),
        Command::Run(args) => runtime::run(args.validate()?).await?,
        Command::Admin(args) => print!("{}", cli::admin(args).await?),
        Command::Manifests(command) => return Ok(cli::manifest_command(command).await),
    }
    Ok(ExitCode::SUCCESS)
}
