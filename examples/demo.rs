//! The demo behind `make run`: applies `examples/manifests/*.yaml` to the cluster that
//! `$KUBECONFIG` names and lists the Manifests.
//!
//! The operator that reconciles them is not part of the project yet; until it is, the Manifests
//! are accepted by the API server (schema and CEL validation) and wait without a status.

use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use module_manager::api::Manifest;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let client = Client::try_default().await?;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/manifests");
    let mut files: Vec<_> = std::fs::read_dir(&dir)?.collect::<Result<Vec<_>, _>>()?;
    files.sort_by_key(|f| f.path());
    for file in files {
        let manifest: Manifest = serde_yaml_ng::from_str(&std::fs::read_to_string(file.path())?)?;
        let ns = manifest.namespace().unwrap_or_else(|| "default".into());
        Api::<Manifest>::namespaced(client.clone(), &ns)
            .patch(
                &manifest.name_any(),
                &PatchParams::apply("module-manager-demo").force(),
                &Patch::Apply(&manifest),
            )
            .await?;
        println!("applied {}", file.path().display());
    }
    println!();
    println!("NAMESPACE    NAME                 MODULE     STATE        OWNER");
    for m in Api::<Manifest>::all(client)
        .list(&ListParams::default())
        .await?
    {
        let status = m.status.clone().unwrap_or_default();
        let state = status
            .state
            .map(|s| format!("{s:?}"))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<12} {:<20} {:<10} {:<12} {}",
            m.namespace().unwrap_or_default(),
            m.name_any(),
            m.spec.module,
            state,
            status.owner.unwrap_or_else(|| "-".into())
        );
    }
    Ok(())
}
