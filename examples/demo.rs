//! The demo behind `make run`: applies `examples/manifests/*.yaml` to the cluster that
//! `$KUBECONFIG` names, then prints the Manifests' states until each is Ready or has settled
//! (at most a minute).

use std::time::{Duration, Instant};

use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use module_manager::api::{Manifest, State};

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

    let all = Api::<Manifest>::all(client);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    loop {
        let manifests = all.list(&ListParams::default()).await?.items;
        let table = table(&manifests);
        if table != last {
            println!("\n{table}");
            last = table;
        }
        let settled = manifests.iter().all(|m| {
            let status = m.status.clone().unwrap_or_default();
            status.observed_generation == m.metadata.generation
                && status.state.is_some_and(|s| s != State::Processing)
        });
        if settled {
            break;
        }
        if Instant::now() > deadline {
            println!("not settled after a minute: is the operator running? (see its log)");
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(())
}

fn table(manifests: &[Manifest]) -> String {
    let mut out = format!(
        "{:<10} {:<10} {:<10} {:<11} {:<17} {}\n",
        "NAMESPACE", "NAME", "MODULE", "STATE", "OWNER", "MESSAGE"
    );
    for m in manifests {
        let status = m.status.clone().unwrap_or_default();
        let message = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.message.clone())
            .unwrap_or_default();
        out += &format!(
            "{:<10} {:<10} {:<10} {:<11} {:<17} {}\n",
            m.namespace().unwrap_or_default(),
            m.name_any(),
            m.spec.module,
            status
                .state
                .map(|s| format!("{s:?}"))
                .unwrap_or_else(|| "-".into()),
            status.owner.unwrap_or_else(|| "-".into()),
            message
        );
    }
    out
}
