//! Helm provenance files: `<chart url>.prov`, an OpenPGP clear-signed message whose text is the
//! chart's `Chart.yaml`, a `...` line, and a `files:` map of the archive's name to its
//! `sha256:` digest (<https://helm.sh/docs/topics/provenance/>). A chart is accepted when one of
//! the keyring's keys (a primary key or a subkey) made the signature and the signed digest of
//! the archive's file name is the digest the archive is checked against, as `helm verify` does.

use std::collections::HashMap;

use pgp::composed::{CleartextSignedMessage, SignedPublicKey};
use reqwest::Url;
use serde::Deserialize;

use super::charts::RemoteCharts;
use super::credentials::Auth;
use super::error::FetchError;
use super::shown::{bounded_text, shown};
use super::verify::VerifyError;

/// Most bytes of a provenance file (it holds a Chart.yaml and a signature).
const MAX_PROVENANCE_BYTES: u64 = 1024 * 1024;

#[derive(Deserialize)]
struct Files {
    files: HashMap<String, String>,
}

impl RemoteCharts {
    /// Fetches `<chart_url>.prov` and accepts the archive `sha256:<hex>` behind `chart_url`
    /// when the provenance file is signed by one of `keys` and names that digest. `auth`: the
    /// repository's credentials, sent only if the file is on the repository's own host.
    pub(super) async fn verify_provenance(
        &self,
        chart_url: &Url,
        auth: Option<(&Auth, &Url)>,
        hex: &str,
        keys: &[SignedPublicKey],
        from: &str,
    ) -> Result<(), FetchError> {
        let mut url = chart_url.clone();
        url.set_path(&format!("{}.prov", chart_url.path()));
        let bytes = match self.get_bounded(&url, auth, MAX_PROVENANCE_BYTES).await {
            Ok(bytes) => bytes,
            Err(FetchError::Status { status: 404, .. }) => {
                return Err(VerifyError::NoSignature(format!(
                    "{} answered HTTP 404 (helm package --sign writes the .prov file)",
                    shown(&url)
                ))
                .into());
            }
            Err(e) => return Err(e),
        };
        let file = chart_url
            .path_segments()
            .and_then(|mut s| s.next_back())
            .unwrap_or_default();
        let file = percent_decoded(file);
        check_provenance(&bytes, &file, hex, keys, from)?;
        Ok(())
    }
}

fn percent_decoded(text: &str) -> String {
    // A path's `%XX` only: `+` stays `+` (`helm package` names a 1.0.0+build.1 chart
    // `web-1.0.0+build.1.tgz`, and `helm repo index` keeps the `+` in its URL).
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

/// Checks a provenance file: signed by one of `keys`, then its `files:` entry for `file` is
/// `sha256:<hex>`. The signed text is read only once its signature is good.
pub(super) fn check_provenance(
    bytes: &[u8],
    file: &str,
    hex: &str,
    keys: &[SignedPublicKey],
    from: &str,
) -> Result<(), VerifyError> {
    let malformed = |what: &str| VerifyError::Malformed(format!("the provenance file {what}"));
    let text = std::str::from_utf8(bytes).map_err(|_| malformed("is not UTF-8"))?;
    let (message, _) = CleartextSignedMessage::from_string(text)
        .map_err(|_| malformed("is not an OpenPGP clear-signed message"))?;
    let signed_by_a_key = keys.iter().any(|key| {
        message.verify(key).is_ok()
            || key
                .public_subkeys
                .iter()
                .any(|subkey| message.verify(subkey).is_ok())
    });
    if !signed_by_a_key {
        return Err(VerifyError::KeyMismatch(from.to_owned()));
    }
    let signed = message.signed_text().replace("\r\n", "\n");
    let files = signed
        .split("\n...\n")
        .nth(1)
        .ok_or_else(|| malformed("has no `...` line before its files"))?;
    crate::source::yaml::refuse_aliases(files)
        .map_err(|_| malformed("lists its files in YAML with anchors or aliases"))?;
    let files: Files =
        serde_yaml_ng::from_str(files).map_err(|_| malformed("has no `files:` map"))?;
    let expected = format!("sha256:{hex}");
    match files.files.get(file) {
        None => Err(VerifyError::NoSignature(format!(
            "the provenance file has no digest for {}",
            bounded_text(file)
        ))),
        Some(digest) if *digest == expected => Ok(()),
        Some(digest) => Err(VerifyError::DigestMismatch {
            what: "archive digest",
            signed: bounded_text(digest),
            actual: expected,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsigned_or_unreadable_provenance_files_are_refused() {
        let hex = "ab".repeat(32);
        let unsigned = format!("name: web\n...\nfiles:\n  web-1.0.0.tgz: sha256:{hex}\n");
        for bytes in [unsigned.as_bytes(), b"\xff\xfe", b""] {
            let error = check_provenance(bytes, "web-1.0.0.tgz", &hex, &[], "Secret k")
                .unwrap_err()
                .to_string();
            assert!(
                error.starts_with("malformed signature: the provenance file"),
                "{error}"
            );
        }
        assert_eq!(percent_decoded("web%2B1.tgz"), "web+1.tgz");
        assert_eq!(
            percent_decoded("web-1.0.0+build.1.tgz"),
            "web-1.0.0+build.1.tgz"
        );
        assert_eq!(percent_decoded("a%26b=c.tgz"), "a&b=c.tgz");
        assert_eq!(percent_decoded("web-1.0.0.tgz"), "web-1.0.0.tgz");
    }
}
