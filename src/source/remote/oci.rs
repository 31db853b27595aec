//! OCI registries: the token flow (anonymous, or with the credentials of the registry's
//! `.dockerconfigjson` entry), the image manifest (checked against its digests),
//! the Helm chart layer it must hold, and plain HTTP for loopback and listed registries.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use oci_client::Reference;
use oci_client::manifest::{OciDescriptor, OciManifest};
use reqwest::Url;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::cache::{Fetcher, sha256_hex};
use super::charts::RemoteCharts;
use super::credentials::{Auth, Credentials};
use super::error::FetchError;
use super::http::{checked_url, request_error};
use super::reach::authority;
use super::shown::{bounded_text, shown_reference};
use super::verify::{Trust, TrustedKeys, VerifyError};
use crate::source::{Limits, ResolvedChart};

/// Media type of a Helm chart's OCI config (Chart.yaml as JSON).
pub const HELM_CONFIG_MEDIA_TYPE: &str = "application/vnd.cncf.helm.config.v1+json";
/// Media type of the layer holding the chart archive.
pub const HELM_CHART_MEDIA_TYPE: &str = "application/vnd.cncf.helm.chart.content.v1.tar+gzip";
/// Media type of a chart's provenance layer (allowed beside the chart, not read).
pub const HELM_PROVENANCE_MEDIA_TYPE: &str = "application/vnd.cncf.helm.chart.provenance.v1.prov";

/// Most bytes of an OCI manifest (what the OCI distribution spec asks registries to accept).
const MAX_MANIFEST_BYTES: u64 = 4 * 1024 * 1024;
/// Most bytes of a registry's token answer (a JSON object with a token of a few KiB).
const MAX_TOKEN_BYTES: u64 = 1024 * 1024;
/// The manifest media types asked for: image manifests (a chart is one) and indexes (refused
/// with a clear message).
const MANIFEST_MEDIA_TYPES: &[&str] = &[
    oci_client::manifest::OCI_IMAGE_MEDIA_TYPE,
    oci_client::manifest::IMAGE_MANIFEST_MEDIA_TYPE,
    oci_client::manifest::OCI_IMAGE_INDEX_MEDIA_TYPE,
    oci_client::manifest::IMAGE_MANIFEST_LIST_MEDIA_TYPE,
];

/// What a registry's 404 reads as.
pub(super) const NOT_FOUND: &str = "not found in the registry";

/// What the manifest and blob requests of one pull carry.
#[derive(Debug, Default)]
pub(super) struct Grant {
    /// The `Authorization` header: a pull token, or the credentials themselves.
    auth: Option<Auth>,
    /// Whether `spec.chart.secretRef`'s credentials were used (for the message of a refusal).
    with_credentials: bool,
}

impl RemoteCharts {
    /// How the pull is authorized, as the distribution spec's token flow: nothing when `/v2/`
    /// asks for nothing; for a `Bearer` challenge, a pull token from the realm, asked for with
    /// `credentials` (basic) when there are any — only to a realm on the registry's own host
    /// (any port) when the registry is spoken to over plain HTTP (an unauthenticated answer
    /// could name any realm) — or the credentials themselves when they are a token; for a `Basic` challenge,
    /// the credentials.
    async fn grant(
        &self,
        reference: &Reference,
        scheme: &str,
        credentials: Option<&Auth>,
    ) -> Result<Grant, FetchError> {
        let url = registry_url(scheme, reference, "")?;
        let response = self
            .get(&url)?
            .send()
            .await
            .map_err(|e| request_error(&url, e))?;
        if response.status() != reqwest::StatusCode::UNAUTHORIZED {
            return Ok(Grant::default());
        }
        let challenge = response
            .headers()
            .get_all(reqwest::header::WWW_AUTHENTICATE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(bearer_challenge);
        drop(response);
        let direct = Grant {
            auth: credentials.cloned(),
            with_credentials: credentials.is_some(),
        };
        match challenge {
            Some(_) if credentials.is_some_and(Auth::is_bearer) => Ok(direct),
            Some(challenge) => {
                let token = self
                    .pull_token(reference, &url, &challenge, credentials)
                    .await?;
                Ok(Grant {
                    auth: Some(Auth::bearer(token)),
                    with_credentials: credentials.is_some(),
                })
            }
            None => Ok(direct),
        }
    }

    /// A pull token for `reference`'s repository from the challenge's realm (`registry` is the
    /// registry's `/v2/` URL), read within [`MAX_TOKEN_BYTES`].
    async fn pull_token(
        &self,
        reference: &Reference,
        registry: &Url,
        challenge: &HashMap<String, String>,
        credentials: Option<&Auth>,
    ) -> Result<String, FetchError> {
        let refused = |what: &str| FetchError::Registry {
            message: format!("the registry's token {what}"),
            transient: false,
        };
        let realm = challenge
            .get("realm")
            .ok_or_else(|| refused("challenge names no realm"))?;
        let realm = Url::parse(realm).map_err(|_| refused("realm is not a URL"))?;
        let mut realm = checked_url(realm, "token realm")?;
        {
            let mut query = realm.query_pairs_mut();
            if let Some(service) = challenge.get("service") {
                query.append_pair("service", service);
            }
            query.append_pair(
                "scope",
                &format!("repository:{}:pull", reference.repository()),
            );
        }
        let mut request = self.get(&realm)?;
        if let Some(auth) = credentials {
            if registry.scheme() == "http" && realm.host_str() != registry.host_str() {
                return Err(FetchError::Registry {
                    message: format!(
                        "the registry, spoken to over plain HTTP, names a token realm on \
                         another host ({}): credentials are not sent there",
                        authority(&realm)
                    ),
                    transient: false,
                });
            }
            request = auth.authorize(request);
        }
        let body = match self.send_bounded(request, &realm, MAX_TOKEN_BYTES).await {
            Ok((body, _)) => body,
            Err(e) if credentials.is_some() => {
                return Err(e.credentials_sent_to(&authority(&realm)));
            }
            Err(e) => return Err(e),
        };
        #[derive(Deserialize)]
        struct Answer {
            token: Option<String>,
            access_token: Option<String>,
        }
        let answer: Answer =
            serde_json::from_slice(&body).map_err(|_| refused("answer is not a token"))?;
        answer
            .token
            .or(answer.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| refused("answer holds no token"))
    }

    /// GETs `what` of the registry with the grant, within `max` bytes; the registry's
    /// refusals in words.
    pub(super) async fn registry_get(
        &self,
        url: &Url,
        accept: Option<&str>,
        grant: &Grant,
        max: u64,
    ) -> Result<(Vec<u8>, reqwest::header::HeaderMap), FetchError> {
        let mut request = self.get(url)?;
        if let Some(accept) = accept {
            request = request.header(reqwest::header::ACCEPT, accept);
        }
        if let Some(auth) = &grant.auth {
            request = auth.authorize(request);
        }
        match self.send_bounded(request, url, max).await {
            Err(FetchError::Status { status: 404, .. }) => Err(FetchError::Registry {
                message: NOT_FOUND.into(),
                transient: false,
            }),
            Err(e) if grant.with_credentials => Err(e.credentials_sent_to(&authority(url))),
            other => other,
        }
    }

    /// The image manifest of `reference`, read within [`MAX_MANIFEST_BYTES`] and checked
    /// against a digest in the reference and the registry's `Docker-Content-Digest`.
    async fn pull_manifest(
        &self,
        reference: &Reference,
        scheme: &str,
        grant: &Grant,
    ) -> Result<(OciManifest, String), FetchError> {
        let target = reference
            .digest()
            .or(reference.tag())
            .expect("oci_reference requires a tag or digest");
        let url = registry_url(scheme, reference, &format!("manifests/{target}"))?;
        self.counters
            .manifest_requests
            .fetch_add(1, Ordering::Relaxed);
        let accept = MANIFEST_MEDIA_TYPES.join(", ");
        let (body, headers) = self
            .registry_get(&url, Some(&accept), grant, MAX_MANIFEST_BYTES)
            .await?;
        let actual = format!("{:x}", Sha256::digest(&body));
        let published = headers
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .filter(|d| d.starts_with("sha256:"));
        for expected in [reference.digest(), published].into_iter().flatten() {
            let expected = sha256_hex(expected)?;
            if expected != actual {
                return Err(FetchError::DigestMismatch {
                    expected,
                    actual: actual.clone(),
                });
            }
        }
        let manifest = serde_json::from_slice(&body).map_err(|e| FetchError::Registry {
            message: format!(
                "not an OCI manifest (line {}, column {})",
                e.line(),
                e.column()
            ),
            transient: false,
        })?;
        Ok((manifest, actual))
    }

    /// The chart of the OCI reference `text`, pulled with the `credentials`' entry for its
    /// registry (if any).
    pub(super) async fn fetch_from_registry(
        &self,
        text: &str,
        credentials: Option<&Credentials>,
        limits: Limits,
        trust: Option<&Trust>,
    ) -> Result<ResolvedChart, FetchError> {
        let reference = oci_reference(text)?;
        let auth = credentials
            .map(|c| c.for_registry(reference.registry(), reference.resolve_registry()))
            .transpose()?;
        let plain = self.reach.plain_registry(reference.registry());
        // A reference resolved moments ago (a tag) or ever (a digest) with the same
        // credentials needs no manifest; other credentials (or none) pull the manifest
        // themselves. Either way the archive comes from the disk cache only when the same
        // registry repository with the same credentials pulled it (`cache.rs`).
        let fingerprint = auth
            .as_ref()
            .map_or("anonymous", |a| a.fingerprint.as_str());
        let key = format!("{plain}:{} {fingerprint}", reference.whole());
        let ttl = match reference.digest() {
            Some(_) => Duration::MAX,
            None => self.config.index_ttl,
        };
        // A verified chart always needs its manifest: the signature is of the manifest's digest.
        if trust.is_none()
            && let Some(hex) = self.layers.get(&key)
            && let Some(chart) = self
                .cached(
                    &hex,
                    &blob_fetcher(&reference, plain, auth.as_ref())?,
                    limits,
                )
                .await?
        {
            return Ok(chart);
        }
        let chart = self
            .fetch_layer(&reference, plain, text, auth.as_ref(), limits, trust)
            .await?;
        let hex = chart.digest.trim_start_matches("sha256:").to_owned();
        self.layers.put(key, hex, ttl, 1);
        Ok(chart)
    }

    /// Pulls the manifest, verifies its signature (with `trust`), checks it is a Helm chart,
    /// and takes its archive from the cache or the registry: the layer named by the manifest
    /// whose digest was verified, by its digest.
    async fn fetch_layer(
        &self,
        reference: &Reference,
        plain: bool,
        text: &str,
        credentials: Option<&Auth>,
        limits: Limits,
        trust: Option<&Trust>,
    ) -> Result<ResolvedChart, FetchError> {
        let scheme = if plain { "http" } else { "https" };
        let grant = self.grant(reference, scheme, credentials).await?;
        let (manifest, manifest_hex) = self.pull_manifest(reference, scheme, &grant).await?;
        if let Some(trust) = trust {
            let TrustedKeys::Cosign(keys) = &trust.keys else {
                return Err(VerifyError::Provider("helm", "charts of a Helm repository").into());
            };
            let from = &trust.from;
            self.verify_cosign(reference, scheme, &grant, &manifest_hex, keys, from)
                .await?;
        }
        let manifest = match manifest {
            OciManifest::Image(manifest) => manifest,
            OciManifest::ImageIndex(_) => {
                return Err(FetchError::MediaType(
                    "the reference is an image index, not a Helm chart".into(),
                ));
            }
        };
        if manifest.config.media_type != HELM_CONFIG_MEDIA_TYPE {
            return Err(FetchError::MediaType(format!(
                "the config media type is not a Helm chart's ({HELM_CONFIG_MEDIA_TYPE})"
            )));
        }
        if manifest.layers.iter().any(|l| {
            l.media_type != HELM_CHART_MEDIA_TYPE && l.media_type != HELM_PROVENANCE_MEDIA_TYPE
        }) {
            return Err(FetchError::MediaType(format!(
                "a layer's media type is not a Helm chart's ({HELM_CHART_MEDIA_TYPE})"
            )));
        }
        let charts: Vec<_> = manifest
            .layers
            .iter()
            .filter(|l| l.media_type == HELM_CHART_MEDIA_TYPE)
            .collect();
        let [layer] = charts[..] else {
            return Err(FetchError::MediaType(format!(
                "{} layers of media type {HELM_CHART_MEDIA_TYPE}, expected one",
                charts.len()
            )));
        };
        if u64::try_from(layer.size).map_or(true, |size| size > limits.max_bytes) {
            return Err(FetchError::TooLarge {
                what: format!("chart layer of {} bytes", layer.size),
                limit: limits.max_bytes,
            });
        }
        let hex = sha256_hex(&layer.digest)?;
        let fetcher = blob_fetcher(reference, plain, credentials)?;
        if let Some(chart) = self.cached(&hex, &fetcher, limits).await? {
            return Ok(chart);
        }
        let bytes = self
            .pull_layer(reference, scheme, &grant, layer, limits)
            .await?;
        self.counters
            .archive_downloads
            .fetch_add(1, Ordering::Relaxed);
        self.verify_and_store(shown_reference(text), bytes, hex, fetcher, limits)
            .await
    }

    /// The chart layer's bytes, read within the chart's byte limit (a registry may send more
    /// than the size it declared). Redirects (to a CDN) follow the HTTP client's policy: not
    /// from https to http, the token not sent to another host; `urls` of the descriptor are
    /// not used. The digest is checked by the caller.
    async fn pull_layer(
        &self,
        reference: &Reference,
        scheme: &str,
        grant: &Grant,
        layer: &OciDescriptor,
        limits: Limits,
    ) -> Result<Vec<u8>, FetchError> {
        let url = registry_url(scheme, reference, &format!("blobs/{}", layer.digest))?;
        match self.registry_get(&url, None, grant, limits.max_bytes).await {
            Ok((body, _)) => Ok(body),
            Err(FetchError::TooLarge { limit, .. }) => Err(FetchError::TooLarge {
                what: "chart layer".into(),
                limit,
            }),
            Err(e) => Err(e),
        }
    }
}

/// Parses `oci://host[:port]/repository/chart:tag` or `…@sha256:<hex>`. Helm stores a version's
/// `+` as `_` in tags (OCI tags cannot hold `+`); so does this.
fn oci_reference(text: &str) -> Result<Reference, FetchError> {
    let rest = text
        .strip_prefix("oci://")
        .ok_or_else(|| FetchError::Reference("an OCI reference starts with oci://".into()))?;
    let (host, path) = rest
        .split_once('/')
        .ok_or_else(|| FetchError::Reference("the reference has no repository".into()))?;
    if host.contains('@') {
        return Err(FetchError::Reference(
            "the reference carries credentials, which are not supported (they would show in \
             status and logs)"
                .into(),
        ));
    }
    if !(host.contains('.') || host.contains(':') || host == "localhost") {
        return Err(FetchError::Reference(format!(
            "{:?} is not a registry host (oci://host[:port]/repository/chart:tag)",
            bounded_text(host)
        )));
    }
    let last = path.rsplit('/').next().unwrap_or_default();
    let normalized = if last.contains('@') {
        rest.to_owned()
    } else if let Some((_, tag)) = last.split_once(':').filter(|(_, tag)| !tag.is_empty()) {
        format!(
            "{}{}",
            &rest[..rest.len() - tag.len()],
            tag.replace('+', "_")
        )
    } else {
        return Err(FetchError::Reference(
            "the reference names no tag or digest (oci://host/repository/chart:version)".into(),
        ));
    };
    normalized
        .parse::<Reference>()
        .map_err(|e| FetchError::Reference(format!("invalid OCI reference: {e}")))
}

/// Who pulls the reference's blobs: the registry's repository (a registry serves a blob only
/// to a repository it is linked in) and the credentials of `spec.chart.secretRef` (not the
/// pull token, which changes).
fn blob_fetcher(
    reference: &Reference,
    plain: bool,
    credentials: Option<&Auth>,
) -> Result<Fetcher, FetchError> {
    let scheme = if plain { "http" } else { "https" };
    let blobs = registry_url(scheme, reference, "blobs/")?;
    Ok(Fetcher::new(blobs.as_str(), credentials))
}

/// `<scheme>://<registry>/v2/<repository>/<path>` (`/v2/` for an empty path).
pub(super) fn registry_url(
    scheme: &str,
    reference: &Reference,
    path: &str,
) -> Result<Url, FetchError> {
    let text = if path.is_empty() {
        format!("{scheme}://{}/v2/", reference.resolve_registry())
    } else {
        format!(
            "{scheme}://{}/v2/{}/{path}",
            reference.resolve_registry(),
            reference.repository()
        )
    };
    Url::parse(&text).map_err(|e| FetchError::Reference(format!("invalid OCI reference: {e}")))
}

/// The parameters of a `Bearer` challenge (`Bearer realm="…",service="…",scope="…"`).
fn bearer_challenge(header: &str) -> Option<HashMap<String, String>> {
    let (scheme, rest) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut params = HashMap::new();
    let mut rest = rest.trim_start();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let key = key.trim().to_ascii_lowercase();
        let after = after.trim_start();
        let (value, remaining) = if let Some(quoted) = after.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next().map(|(_, c)| c)),
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    c => value.push(c),
                }
            }
            (value, &quoted[end?..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_owned(), &after[end..])
        };
        params.insert(key, value);
        rest = remaining.trim_start().trim_start_matches(',').trim_start();
    }
    Some(params)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::RemoteConfig;

    #[test]
    fn oci_references_need_a_host_and_a_tag_or_digest() {
        let r = oci_reference("oci://127.0.0.1:5000/charts/web:1.2.3").unwrap();
        assert_eq!(
            (r.registry(), r.repository(), r.tag()),
            ("127.0.0.1:5000", "charts/web", Some("1.2.3"))
        );
        let r = oci_reference("oci://registry.example.com/web:1.0.0+build.1").unwrap();
        assert_eq!(r.tag(), Some("1.0.0_build.1"), "+ is stored as _");
        let digest = format!("sha256:{}", "0".repeat(64));
        let r = oci_reference(&format!("oci://localhost:5000/charts/web@{digest}")).unwrap();
        assert_eq!(r.digest(), Some(digest.as_str()));
        let error = oci_reference("oci://user:s3cret@example.com/charts/web:1.0.0")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("carries credentials") && !error.contains("s3cret"),
            "{error}"
        );
        assert_eq!(
            shown_reference("oci://user:s3cret@example.com/charts/web:1.0.0"),
            "oci://example.com/charts/web:1.0.0"
        );
        assert_eq!(
            shown_reference("oci://example.com/a@sha256:00"),
            "oci://example.com/a@sha256:00"
        );
        assert_eq!(shown_reference("oci://u:p@h"), "oci://h");
        for bad in [
            "oci://charts/web:1.0.0",
            "oci://example.com/charts/web",
            "oci://example.com",
            "https://example.com/charts/web:1.0.0",
        ] {
            assert!(
                matches!(oci_reference(bad), Err(FetchError::Reference(_))),
                "{bad}"
            );
        }
    }

    /// Digests that are not a supported algorithm's full hex are refused before any request
    /// (a digest is also a path in the registry's URL and a name in the chart cache).
    #[test]
    fn oci_references_with_bad_digests_are_refused() {
        let sha = |hex: &str| format!("oci://registry.example.com/charts/web@sha256:{hex}");
        for bad in [
            sha("00"),
            sha(&"0".repeat(63)),
            sha(&"0".repeat(65)),
            sha(&"g".repeat(64)),
            sha(&format!("../../../../etc/passwd{}", "0".repeat(43))),
            sha(""),
            format!(
                "oci://registry.example.com/charts/web@md5:{}",
                "0".repeat(32)
            ),
            format!("oci://registry.example.com/charts/web@{}", "0".repeat(64)),
            "oci://registry.example.com/charts/web@".into(),
        ] {
            assert!(
                matches!(oci_reference(&bad), Err(FetchError::Reference(_))),
                "{bad}"
            );
        }
        assert!(oci_reference(&sha(&"a".repeat(64))).is_ok());
    }

    #[test]
    fn loopback_and_listed_registries_use_plain_http() {
        let mut config = RemoteConfig::new(std::env::temp_dir());
        config.insecure_registries = vec!["registry.internal:5000".into(), "plain.lan".into()];
        let remote = RemoteCharts::new(config).unwrap();
        for plain in [
            "127.0.0.1:5000",
            "127.1.2.3",
            "localhost:5000",
            "[::1]:5000",
            "registry.internal:5000",
            "plain.lan:443",
        ] {
            assert!(remote.reach.plain_registry(plain), "{plain}");
        }
        for tls in ["registry.internal:5001", "ghcr.io", "10.0.0.1:5000"] {
            assert!(!remote.reach.plain_registry(tls), "{tls}");
        }
    }

    #[test]
    fn bearer_challenges_are_parsed() {
        let params = bearer_challenge(
            r#"Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:a/b:pull,push""#,
        )
        .unwrap();
        assert_eq!(params["realm"], "https://auth.example.com/token");
        assert_eq!(params["service"], "registry.example.com");
        assert_eq!(params["scope"], "repository:a/b:pull,push");
        let params =
            bearer_challenge(r#"bearer realm=http://127.0.0.1/t, service="a\"b""#).unwrap();
        assert_eq!(params["realm"], "http://127.0.0.1/t");
        assert_eq!(params["service"], "a\"b");
        assert!(bearer_challenge(r#"Basic realm="registry""#).is_none());
        assert!(bearer_challenge(r#"Bearer realm="unterminated"#).is_none());
    }
}
