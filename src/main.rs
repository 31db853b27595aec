//! The `module-manager` command line: `crd`, `run` (the operator) and `admin` (its client).

use clap::{Parser, Subcommand};
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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crd => print!("{}", api::manifest_crd_yaml()),
        Command::Run(args) => runtime::run(args.validate()?).await?,
        Command::Admin(args) => print!("{}", cli::admin(args).await?),
    }
    Ok(())
}
