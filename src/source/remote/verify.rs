//! Signature verification of fetched charts (`spec.chart.verify`): the public keys a chart must
//! be signed with, parsed from the entries of a Secret or ConfigMap the reconciler read, and the
//! errors of a refused chart. The checks themselves are in `cosign.rs` (OCI charts) and
//! `provenance.rs` (Helm repositories' `.prov` files).

use p256::ecdsa::VerifyingKey;
use p256::pkcs8::DecodePublicKey;
use pgp::composed::{PublicOrSecret, SignedPublicKey};

use crate::api::{ChartVerification, VerificationProvider};

/// The entries of the Secret or ConfigMap `spec.chart.verify` names, as read by the
/// reconciler (in the Manifest's namespace, as the operator).
#[derive(Clone, Debug, Default)]
pub struct KeyMaterial {
    /// Where they come from, as `Secret <name>` or `ConfigMap <name>` (for messages).
    pub from: String,
    /// `(key, bytes)` of every entry of the object.
    pub entries: Vec<(String, Vec<u8>)>,
}

/// The keys a chart must be signed with, and where they come from.
pub(super) struct Trust {
    /// The parsed keys.
    pub(super) keys: TrustedKeys,
    /// `Secret <name>` or `ConfigMap <name>`.
    pub(super) from: String,
}

/// Parsed public keys of one provider.
pub(super) enum TrustedKeys {
    /// ECDSA P-256 keys (what `cosign generate-key-pair` makes), with where each came from.
    Cosign(Vec<(String, VerifyingKey)>),
    /// OpenPGP public keys (primary keys and their subkeys are tried).
    Helm(Vec<SignedPublicKey>),
}

/// Why a chart's signature was not accepted. Every one is permanent: it waits for a change of
/// the chart, its signature, the keys or the spec.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// `spec.chart.verify` is set but no key material was given to the resolver.
    #[error("no public keys were read for spec.chart.verify")]
    NoKeyMaterial,
    /// the Secret or ConfigMap holds no entry that could be a key.
    #[error("{from} holds no public key ({wanted})")]
    NoKeys {
        /// `Secret <name>` or `ConfigMap <name>`.
        from: String,
        /// What was looked for.
        wanted: String,
    },
    /// an entry is not a key of the provider's kind.
    #[error("{from} key {key}: {reason}")]
    BadKey {
        /// `Secret <name>` or `ConfigMap <name>`.
        from: String,
        /// The entry.
        key: String,
        /// What it should have been.
        reason: String,
    },
    /// the chart has no signature where the provider keeps it.
    #[error("no signature found: {0}")]
    NoSignature(String),
    /// a signature exists, but none of the keys made it.
    #[error("the signature does not match the keys of {0}")]
    KeyMismatch(String),
    /// the signature is good but signs another chart.
    #[error("{what} mismatch: the signature is for {signed}, the chart is {actual}")]
    DigestMismatch {
        /// What was compared, e.g. `payload digest`.
        what: &'static str,
        /// What the signature signs.
        signed: String,
        /// What was fetched.
        actual: String,
    },
    /// the provider does not sign this kind of chart (the CRD refuses such a spec).
    #[error("verify.provider {0} is for {1}")]
    Provider(&'static str, &'static str),
    /// the signature or its payload cannot be read.
    #[error("malformed signature: {0}")]
    Malformed(String),
}

/// The public keys of `material` for `verify`'s provider: the entry `verify.key`, or every
/// entry named like a key of the provider (`*.pub` for cosign, as Flux; `*.gpg`/`*.asc` for
/// helm).
pub(super) fn trusted_keys(
    verify: &ChartVerification,
    material: &KeyMaterial,
) -> Result<TrustedKeys, VerifyError> {
    let (suffixes, wanted): (&[&str], _) = match verify.provider {
        VerificationProvider::Cosign => (&[".pub"], "an entry named *.pub"),
        VerificationProvider::Helm => (&[".gpg", ".asc"], "an entry named *.gpg or *.asc"),
    };
    let chosen: Vec<&(String, Vec<u8>)> = match &verify.key {
        Some(key) => material.entries.iter().filter(|(k, _)| k == key).collect(),
        None => material
            .entries
            .iter()
            .filter(|(k, _)| suffixes.iter().any(|s| k.ends_with(s)))
            .collect(),
    };
    if chosen.is_empty() {
        return Err(VerifyError::NoKeys {
            from: material.from.clone(),
            wanted: verify
                .key
                .as_ref()
                .map_or_else(|| wanted.to_owned(), |k| format!("no entry {k}")),
        });
    }
    let bad = |key: &str, reason: String| VerifyError::BadKey {
        from: material.from.clone(),
        key: key.to_owned(),
        reason,
    };
    match verify.provider {
        VerificationProvider::Cosign => chosen
            .into_iter()
            .map(|(name, bytes)| Ok((name.clone(), cosign_key(bytes).map_err(|r| bad(name, r))?)))
            .collect::<Result<_, _>>()
            .map(TrustedKeys::Cosign),
        VerificationProvider::Helm => {
            let mut keys = Vec::new();
            for (name, bytes) in chosen {
                keys.extend(openpgp_keys(bytes).map_err(|r| bad(name, r))?);
            }
            Ok(TrustedKeys::Helm(keys))
        }
    }
}

/// A PEM `PUBLIC KEY` (SubjectPublicKeyInfo) of an ECDSA P-256 key.
fn cosign_key(bytes: &[u8]) -> Result<VerifyingKey, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not a PEM text".to_owned())?;
    VerifyingKey::from_public_key_pem(text.trim()).map_err(|_| {
        "not a PEM ECDSA P-256 public key (the cosign.pub `cosign generate-key-pair` writes)"
            .to_owned()
    })
}

/// Every public key of an OpenPGP keyring, binary (`gpg --export`) or ASCII-armored; the public
/// half of any secret key in it.
fn openpgp_keys(bytes: &[u8]) -> Result<Vec<SignedPublicKey>, String> {
    let unreadable = |_| "not an OpenPGP keyring (gpg --export [--armor])".to_owned();
    let (keys, _) = PublicOrSecret::from_reader_many(bytes).map_err(unreadable)?;
    let mut public = Vec::new();
    for key in keys {
        public.push(match key.map_err(unreadable)? {
            PublicOrSecret::Public(key) => key,
            PublicOrSecret::Secret(key) => key.to_public_key(),
        });
    }
    if public.is_empty() {
        return Err("the keyring holds no key".into());
    }
    Ok(public)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::LocalObjectReference;

    fn verify(provider: VerificationProvider, key: Option<&str>) -> ChartVerification {
        ChartVerification {
            provider,
            secret_ref: Some(LocalObjectReference { name: "k".into() }),
            config_map_ref: None,
            key: key.map(str::to_owned),
        }
    }

    fn material(entries: &[(&str, &[u8])]) -> KeyMaterial {
        KeyMaterial {
            from: "Secret keys".into(),
            entries: entries
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.to_vec()))
                .collect(),
        }
    }

    #[test]
    fn keys_are_chosen_by_name_and_parsed_for_their_provider() {
        let signing = p256::ecdsa::SigningKey::from_slice(&[7u8; 32]).unwrap();
        let pem = p256::pkcs8::EncodePublicKey::to_public_key_pem(
            signing.verifying_key(),
            p256::pkcs8::LineEnding::LF,
        )
        .unwrap();
        let cosign = verify(VerificationProvider::Cosign, None);
        let both = material(&[("cosign.pub", pem.as_bytes()), ("notes", b"x")]);
        let Ok(TrustedKeys::Cosign(keys)) = trusted_keys(&cosign, &both) else {
            panic!("a cosign key")
        };
        assert_eq!(keys.len(), 1, "only *.pub entries by default");
        let named = verify(VerificationProvider::Cosign, Some("notes"));
        let error = trusted_keys(&named, &both).err().unwrap().to_string();
        assert!(
            error.starts_with("Secret keys key notes: not a PEM ECDSA P-256"),
            "{error}"
        );
        let none = trusted_keys(&cosign, &material(&[("notes", b"x")]))
            .err()
            .unwrap()
            .to_string();
        assert_eq!(
            none,
            "Secret keys holds no public key (an entry named *.pub)"
        );
        let helm = verify(VerificationProvider::Helm, Some("pubring.gpg"));
        let error = trusted_keys(&helm, &material(&[("pubring.gpg", b"garbage")]))
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("not an OpenPGP keyring"), "{error}");
    }
}
