//! Remote chart sources: Helm HTTP repositories (`spec.chart.repository` + `name` + `version`)
//! and OCI registries (`spec.chart.oci`).
//!
//! The network part is async; hashing, the archive checks (the same as for a local `.tgz`) and
//! the disk cache run on blocking threads. A verified archive is cached on disk under its sha256
//! digest, so a later resolve of the same chart downloads nothing but the (briefly cached)
//! `index.yaml` or the OCI manifest. See `docs/reconcile.md` for the bounds and the errors.
//!
//! One file per concern: [`RemoteCharts`] and what its fetches share (`charts.rs`), built from
//! [`RemoteConfig`] (`config.rs`), failing with [`FetchError`] (`error.rs`); the HTTP client
//! (`client.rs`) and the capped requests through it (`http.rs`), where they may connect
//! (`reach.rs`, over the address classifier of `address.rs`), Helm repositories (`helm_repo.rs`,
//! their `index.yaml` in `index.rs`), OCI registries (`oci.rs`), the credentials of
//! `spec.chart.secretRef` (`credentials.rs`), the disk cache (`cache.rs`), the in-memory TTL
//! cache (`recent.rs`), what may be shown of a URL (`shown.rs`), and signature verification
//! (`spec.chart.verify`: the keys in `verify.rs`, cosign signatures in `cosign.rs`, Helm
//! provenance in `provenance.rs`). This file holds the entry point, `RemoteCharts::fetch`,
//! which sends each source to the file that fetches it (`source/mod.rs` resolves any source
//! through it).

mod address;
mod cache;
mod charts;
mod client;
mod config;
mod cosign;
mod credentials;
mod error;
mod helm_repo;
mod http;
mod index;
mod oci;
mod provenance;
mod reach;
mod recent;
mod shown;
mod verify;

use std::time::Duration;

use self::shown::{shown_reference, shown_url};
use self::verify::{Trust, trusted_keys};
use super::{Limits, ResolvedChart};
use crate::api::ChartSource;

pub use self::address::{Cidr, Reserved};
pub use self::charts::{FetchStats, RemoteCharts, ensure_crypto_provider};
pub use self::config::RemoteConfig;
pub use self::credentials::{Credentials, CredentialsError};
pub use self::error::FetchError;
pub use self::oci::{HELM_CHART_MEDIA_TYPE, HELM_CONFIG_MEDIA_TYPE, HELM_PROVENANCE_MEDIA_TYPE};
pub use self::reach::Refusal;
pub use self::verify::{KeyMaterial, VerifyError};

/// How much longer than the fetch timeout a fetch may take before it is given up on whatever
/// it is doing (its requests end at the timeout).
const BACKSTOP: Duration = Duration::from_secs(5);

impl RemoteCharts {
    /// Fetches the chart of a Helm repository or an OCI registry that `source` names, with
    /// `credentials` (those of `spec.chart.secretRef`, sent only to the repository's or
    /// registry's host), verified against `keys` when `source` has `verify`
    /// ([`RemoteCharts::resolve_verified`]); `None` when `source` names no remote chart. With
    /// the chart's origin, for an error to name: which chart from where (URLs without
    /// credentials or query).
    pub(in crate::source) async fn fetch(
        &self,
        source: &ChartSource,
        credentials: Option<&Credentials>,
        limits: Limits,
        keys: Option<&KeyMaterial>,
    ) -> Option<(String, Result<ResolvedChart, FetchError>)> {
        match (&source.path, &source.repository, &source.oci) {
            (None, Some(repository), None) => {
                let name = source.name.as_deref().unwrap_or_default();
                let version = source.version.as_deref().unwrap_or_default();
                let origin = format!(
                    "chart {name} {version} from {}",
                    shown_url(repository.as_str())
                );
                let trust = match trust(source, keys) {
                    Ok(trust) => trust,
                    Err(e) => return Some((origin, Err(e.into()))),
                };
                let fetch = async {
                    let auth = credentials.map(Credentials::for_repository).transpose()?;
                    let (auth, trust) = (auth.as_ref(), trust.as_ref());
                    self.fetch_from_repository(repository, name, version, auth, limits, trust)
                        .await
                };
                Some((origin, self.bounded(fetch).await))
            }
            (None, None, Some(reference)) => {
                let origin = format!("chart {}", shown_reference(reference));
                let trust = match trust(source, keys) {
                    Ok(trust) => trust,
                    Err(e) => return Some((origin, Err(e.into()))),
                };
                let fetch =
                    self.fetch_from_registry(reference, credentials, limits, trust.as_ref());
                Some((origin, self.bounded(fetch).await))
            }
            _ => None,
        }
    }

    /// Runs one fetch within the timeout: its requests share the deadline (each ends when it
    /// passes, as a host that did not answer in time); the limit here, a little later, is only
    /// a backstop for the work between requests.
    async fn bounded(
        &self,
        fetch: impl Future<Output = Result<ResolvedChart, FetchError>>,
    ) -> Result<ResolvedChart, FetchError> {
        let timeout = self.config.timeout;
        let deadlined = http::with_deadline(timeout, fetch);
        match tokio::time::timeout(timeout + BACKSTOP, deadlined).await {
            Ok(result) => result,
            Err(_) => Err(FetchError::Timeout(self.config.timeout)),
        }
    }
}

/// The parsed keys of `source.verify`, if set; refused when set without key material.
fn trust(source: &ChartSource, keys: Option<&KeyMaterial>) -> Result<Option<Trust>, VerifyError> {
    match (&source.verify, keys) {
        (None, _) => Ok(None),
        (Some(verify), Some(material)) => Ok(Some(Trust {
            keys: trusted_keys(verify, material)?,
            from: material.from.clone(),
        })),
        (Some(_), None) => Err(VerifyError::NoKeyMaterial),
    }
}
