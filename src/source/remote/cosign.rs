//! cosign signatures of OCI charts, key-based, in cosign's "legacy" layout (the only one before
//! cosign 3, and cosign 3's with `--new-bundle-format=false`): the signature of the manifest
//! `sha256:<hex>` is an OCI image at tag `sha256-<hex>.sig` of the same repository, each of
//! whose `application/vnd.dev.cosign.simplesigning.v1+json` layers is a simple-signing payload
//! naming the signed manifest digest, with the base64 signature over the payload's bytes in the
//! layer annotation `dev.cosignproject.cosign/signature`
//! (<https://github.com/sigstore/cosign/blob/main/specs/SIGNATURE_SPEC.md>).

use oci_client::Reference;
use oci_client::manifest::{OciDescriptor, OciManifest};
use p256::ecdsa::signature::Verifier;
use p256::ecdsa::{Signature, VerifyingKey};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::cache::sha256_hex;
use super::charts::RemoteCharts;
use super::error::FetchError;
use super::oci::{Grant, NOT_FOUND, registry_url};
use super::verify::VerifyError;

/// Media type of a layer holding a simple-signing payload.
pub const SIMPLE_SIGNING_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation holding the base64 signature.
const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// Most bytes of a signature image's manifest.
const MAX_SIGNATURE_MANIFEST_BYTES: u64 = 1024 * 1024;
/// Most bytes of a payload (cosign's are a few hundred; annotations `-a` add to them).
const MAX_PAYLOAD_BYTES: u64 = 256 * 1024;
/// Most signature layers read (each `cosign sign` of the same digest adds one).
const MAX_SIGNATURES: usize = 16;
/// The manifest media types of a signature image.
const SIGNATURE_MANIFEST_TYPES: &str = "application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json";

/// The parts of a simple-signing payload that are checked.
#[derive(Deserialize)]
struct Payload {
    critical: Critical,
}

#[derive(Deserialize)]
struct Critical {
    image: Image,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct Image {
    #[serde(rename = "docker-manifest-digest")]
    digest: String,
}

/// What one signature layer says about the chart.
#[derive(Debug, PartialEq)]
pub(super) enum Checked {
    /// Signed by one of the keys, for this manifest.
    Good,
    /// None of the keys made the signature.
    OtherKey,
    /// Signed by one of the keys, for another manifest (`sha256:<hex>`).
    OtherDigest(String),
}

impl RemoteCharts {
    /// Accepts the chart manifest `sha256:<manifest_hex>` of `reference` when one of the
    /// signature layers at its `.sig` tag is a payload for that digest signed by one of `keys`.
    pub(super) async fn verify_cosign(
        &self,
        reference: &Reference,
        scheme: &str,
        grant: &Grant,
        manifest_hex: &str,
        keys: &[(String, VerifyingKey)],
        from: &str,
    ) -> Result<(), FetchError> {
        let tag = format!("sha256-{manifest_hex}.sig");
        let url = registry_url(scheme, reference, &format!("manifests/{tag}"))?;
        let body = match self
            .registry_get(
                &url,
                Some(SIGNATURE_MANIFEST_TYPES),
                grant,
                MAX_SIGNATURE_MANIFEST_BYTES,
            )
            .await
        {
            Ok((body, _)) => body,
            Err(FetchError::Registry { message, .. }) if message == NOT_FOUND => {
                return Err(VerifyError::NoSignature(format!(
                    "the registry has no cosign signature tag {tag} (cosign sign --key …)"
                ))
                .into());
            }
            Err(e) => return Err(e),
        };
        let layers = signature_layers(&body)?;
        let mut outcome = Checked::OtherKey;
        for layer in layers.iter().take(MAX_SIGNATURES) {
            let payload = self.payload(reference, scheme, grant, layer).await?;
            let signature = layer
                .annotations
                .as_ref()
                .and_then(|a| a.get(SIGNATURE_ANNOTATION))
                .map_or("", String::as_str);
            match check_signature(keys, &payload, signature, manifest_hex)? {
                Checked::Good => return Ok(()),
                other @ Checked::OtherDigest(_) => outcome = other,
                Checked::OtherKey => {}
            }
        }
        Err(match outcome {
            Checked::OtherDigest(signed) => VerifyError::DigestMismatch {
                what: "payload digest",
                signed,
                actual: format!("sha256:{manifest_hex}"),
            },
            _ => VerifyError::KeyMismatch(from.to_owned()),
        }
        .into())
    }

    /// A payload blob, read within [`MAX_PAYLOAD_BYTES`] and checked against its digest.
    async fn payload(
        &self,
        reference: &Reference,
        scheme: &str,
        grant: &Grant,
        layer: &OciDescriptor,
    ) -> Result<Vec<u8>, FetchError> {
        let expected = sha256_hex(&layer.digest)?;
        let url = registry_url(scheme, reference, &format!("blobs/{}", layer.digest))?;
        let (body, _) = self
            .registry_get(&url, None, grant, MAX_PAYLOAD_BYTES)
            .await?;
        let actual = format!("{:x}", Sha256::digest(&body));
        if actual != expected {
            return Err(FetchError::DigestMismatch { expected, actual });
        }
        Ok(body)
    }
}

/// The simple-signing layers of a signature image's manifest.
fn signature_layers(body: &[u8]) -> Result<Vec<OciDescriptor>, VerifyError> {
    let manifest: OciManifest = serde_json::from_slice(body).map_err(|e| {
        VerifyError::Malformed(format!(
            "the signature tag is not an OCI image manifest (line {}, column {})",
            e.line(),
            e.column()
        ))
    })?;
    let OciManifest::Image(manifest) = manifest else {
        return Err(VerifyError::Malformed(
            "the signature tag is an image index, not a cosign signature image".into(),
        ));
    };
    let layers: Vec<OciDescriptor> = manifest
        .layers
        .into_iter()
        .filter(|l| l.media_type == SIMPLE_SIGNING_MEDIA_TYPE)
        .collect();
    if layers.is_empty() {
        return Err(VerifyError::NoSignature(format!(
            "the signature image has no {SIMPLE_SIGNING_MEDIA_TYPE} layer"
        )));
    }
    Ok(layers)
}

/// Checks one signature: made over `payload` by one of `keys` (ASN.1 DER, as cosign writes, or
/// the fixed 64-byte form), and a payload naming `sha256:<manifest_hex>`. The payload is read
/// only once its signature is good.
pub(super) fn check_signature(
    keys: &[(String, VerifyingKey)],
    payload: &[u8],
    signature_base64: &str,
    manifest_hex: &str,
) -> Result<Checked, VerifyError> {
    use base64::Engine as _;
    let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(signature_base64.trim()) else {
        return Ok(Checked::OtherKey);
    };
    let Ok(signature) = Signature::from_der(&raw).or_else(|_| Signature::from_slice(&raw)) else {
        return Ok(Checked::OtherKey);
    };
    if !keys
        .iter()
        .any(|(_, key)| key.verify(payload, &signature).is_ok())
    {
        return Ok(Checked::OtherKey);
    }
    let payload: Payload = serde_json::from_slice(payload).map_err(|_| {
        VerifyError::Malformed("the signed payload is not a cosign simple-signing payload".into())
    })?;
    if payload.critical.kind != "cosign container image signature" {
        return Err(VerifyError::Malformed(format!(
            "the signed payload's type is {:?}, not a cosign container image signature",
            super::shown::bounded_text(&payload.critical.kind)
        )));
    }
    let signed = payload.critical.image.digest;
    if signed == format!("sha256:{manifest_hex}") {
        Ok(Checked::Good)
    } else {
        Ok(Checked::OtherDigest(super::shown::bounded_text(&signed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use p256::ecdsa::SigningKey;
    use p256::ecdsa::signature::Signer;

    fn payload(digest: &str) -> Vec<u8> {
        format!(
            r#"{{"critical":{{"identity":{{"docker-reference":"127.0.0.1:5000/charts/web"}},"image":{{"docker-manifest-digest":"{digest}"}},"type":"cosign container image signature"}},"optional":null}}"#
        )
        .into_bytes()
    }

    fn sign(key: &SigningKey, payload: &[u8]) -> String {
        let signature: Signature = key.sign(payload);
        base64::engine::general_purpose::STANDARD.encode(signature.to_der().as_bytes())
    }

    #[test]
    fn a_signature_must_be_by_a_key_and_for_the_manifest() {
        let hex = "ab".repeat(32);
        let (ours, theirs) = (
            SigningKey::from_slice(&[1u8; 32]).unwrap(),
            SigningKey::from_slice(&[2u8; 32]).unwrap(),
        );
        let keys = [("cosign.pub".to_owned(), *ours.verifying_key())];
        let good = payload(&format!("sha256:{hex}"));
        assert_eq!(
            check_signature(&keys, &good, &sign(&ours, &good), &hex).unwrap(),
            Checked::Good
        );
        assert_eq!(
            check_signature(&keys, &good, &sign(&theirs, &good), &hex).unwrap(),
            Checked::OtherKey
        );
        let other = payload(&format!("sha256:{}", "cd".repeat(32)));
        assert_eq!(
            check_signature(&keys, &other, &sign(&ours, &other), &hex).unwrap(),
            Checked::OtherDigest(format!("sha256:{}", "cd".repeat(32)))
        );
        // The payload changed after signing.
        let mut tampered = good.clone();
        tampered[10] ^= 1;
        assert_eq!(
            check_signature(&keys, &tampered, &sign(&ours, &good), &hex).unwrap(),
            Checked::OtherKey
        );
        for garbage in ["", "not base64!", "AAAA"] {
            assert_eq!(
                check_signature(&keys, &good, garbage, &hex).unwrap(),
                Checked::OtherKey
            );
        }
        let not_cosign = br#"{"critical":{"image":{"docker-manifest-digest":"x"},"type":"other"}}"#;
        let error = check_signature(&keys, not_cosign, &sign(&ours, not_cosign), &hex)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("not a cosign container image signature"),
            "{error}"
        );
    }

    #[test]
    fn signature_images_need_a_simple_signing_layer() {
        let manifest = |media_type: &str| {
            format!(
                r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:{z}","size":2}},"layers":[{{"mediaType":"{media_type}","digest":"sha256:{z}","size":2}}]}}"#,
                z = "0".repeat(64)
            )
        };
        assert_eq!(
            signature_layers(manifest(SIMPLE_SIGNING_MEDIA_TYPE).as_bytes())
                .unwrap()
                .len(),
            1
        );
        assert!(matches!(
            signature_layers(manifest("application/octet-stream").as_bytes()),
            Err(VerifyError::NoSignature(_))
        ));
        assert!(matches!(
            signature_layers(b"<html>"),
            Err(VerifyError::Malformed(_))
        ));
    }
}
