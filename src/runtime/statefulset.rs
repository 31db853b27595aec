//! The startup check of `--statefulset`: it exists and this replica is one of its ordinals.

use k8s_openapi::api::apps::v1::StatefulSet;

use crate::shard::fleet::DesiredOrdinals;

/// Refuses to start when the StatefulSet `name` in `namespace` cannot be read or `replica` is
/// not `<name>-<n>`: either would leave the fleet idle without a word.
pub async fn check(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    replica: &str,
) -> anyhow::Result<()> {
    let statefulsets = kube::Api::<StatefulSet>::namespaced(client.clone(), namespace);
    statefulsets
        .get(name)
        .await
        .map_err(|e| anyhow::anyhow!("--statefulset {name} in namespace {namespace}: {e}"))?;
    anyhow::ensure!(
        is_ordinal(name, replica),
        "--replica {replica:?} is not an ordinal of StatefulSet {name} (expected {name}-<n>)"
    );
    Ok(())
}

/// Whether `replica` is some ordinal of the StatefulSet `name`, whatever its replica count.
fn is_ordinal(name: &str, replica: &str) -> bool {
    let any_ordinal = DesiredOrdinals {
        name: name.to_owned(),
        replicas: u32::MAX,
    };
    any_ordinal.desires(replica)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_is_an_ordinal_by_its_name() {
        assert!(is_ordinal("mm", "mm-0") && is_ordinal("mm", "mm-12"));
        assert!(!is_ordinal("mm", "other-0") && !is_ordinal("mm", "mm"));
    }
}
