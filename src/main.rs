//! The `module-manager` command line.

use clap::{Parser, Subcommand};

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
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crd => print!("{}", module_manager::api::manifest_crd_yaml()),
    }
    Ok(())
}
