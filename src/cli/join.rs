//! Joining a cluster with a bootstrap token, as `kubeadm join` does it (token-based discovery
//! with CA pinning): the API server's `kube-public/cluster-info` ConfigMap is read without
//! credentials and without trusting the server yet; its kubeconfig's CA must hash (sha256 of
//! its SubjectPublicKeyInfo) to the `--ca-cert-hash` the person copied from the control plane,
//! and the ConfigMap's `jws-kubeconfig-<token id>` signature (the bootstrap signer's detached
//! JWS, HS256 keyed with the token's secret) must verify, which proves the server knows the
//! token. Only then is the CA trusted and a bootstrap kubeconfig with the token written; the
//! agent's TLS bootstrap takes it from there (docs/systemd.md).

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use k8s_openapi::api::core::v1::ConfigMap;
use sha2::{Digest, Sha256};

/// A bootstrap token, `<id>.<secret>` (6 and 16 of `[a-z0-9]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub id: String,
    pub secret: String,
}

impl std::str::FromStr for Token {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Token> {
        let ok = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        match s.split_once('.') {
            Some((id, secret)) if ok(id, 6) && ok(secret, 16) => Ok(Token {
                id: id.into(),
                secret: secret.into(),
            }),
            _ => {
                bail!("--bootstrap-token: expected <6 of [a-z0-9]>.<16 of [a-z0-9]>, as `kubeadm token create` prints")
            }
        }
    }
}

/// `sha256:<64 hex>` of a CA's SubjectPublicKeyInfo (kubeadm's `--discovery-token-ca-cert-hash`).
pub fn ca_hash(ca_der: &[u8]) -> Result<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(ca_der).map_err(|e| anyhow!("the CA certificate: {e}"))?;
    Ok(format!(
        "sha256:{:x}",
        Sha256::digest(cert.tbs_certificate.subject_pki.raw)
    ))
}

/// Whether `jws` (a detached compact JWS, `header..signature`) signs `payload` with HS256 and
/// the token's secret, as the bootstrap signer signs cluster-info.
pub fn jws_verifies(jws: &str, payload: &str, t: &Token) -> bool {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let Some((header, sig)) = jws.split_once("..") else {
        return false;
    };
    let alg_ok = b64
        .decode(header)
        .ok()
        .and_then(|h| serde_json::from_slice::<serde_json::Value>(&h).ok())
        .is_some_and(|h| h["alg"] == "HS256" && h["kid"] == t.id.as_str());
    let Ok(sig) = b64.decode(sig) else { return false };
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(t.secret.as_bytes()) else {
        return false;
    };
    mac.update(format!("{header}.{}", b64.encode(payload)).as_bytes());
    alg_ok && mac.verify_slice(&sig).is_ok()
}

/// The CA (PEM) of the cluster at `server`, read from its cluster-info and checked against
/// `hash` and the token.
pub async fn discover(server: &str, t: &Token, hash: &str) -> Result<Vec<u8>> {
    let url: axum::http::Uri = server.parse().with_context(|| format!("--server {server:?}"))?;
    let mut cfg = kube::Config::new(url);
    // Not trusted yet: what the server sends is checked against the pinned hash below.
    cfg.accept_invalid_certs = true;
    cfg.connect_timeout = Some(std::time::Duration::from_secs(10));
    cfg.read_timeout = Some(std::time::Duration::from_secs(10));
    let client = kube::Client::try_from(cfg).context("a client for the discovery")?;
    let cms: kube::Api<ConfigMap> = kube::Api::namespaced(client, "kube-public");
    let info = cms
        .get("cluster-info")
        .await
        .with_context(|| format!("reading kube-public/cluster-info from {server} (kubeadm init publishes it)"))?;
    let data = info.data.unwrap_or_default();
    let kubeconfig = data
        .get("kubeconfig")
        .ok_or_else(|| anyhow!("cluster-info has no kubeconfig"))?;
    let jws = data
        .get(&format!("jws-kubeconfig-{}", t.id))
        .ok_or_else(|| anyhow!("cluster-info is not signed for token {:?}: the token is unknown to the cluster, expired, or not for signing", t.id))?;
    if !jws_verifies(jws, kubeconfig, t) {
        bail!("cluster-info's signature does not verify with token {:?}: the token is wrong, or the server is not the cluster's", t.id);
    }
    let kc: serde_json::Value = serde_saphyr::from_str(kubeconfig).context("cluster-info's kubeconfig")?;
    let ca_b64 = kc["clusters"][0]["cluster"]["certificate-authority-data"]
        .as_str()
        .ok_or_else(|| anyhow!("cluster-info's kubeconfig has no certificate-authority-data"))?;
    let ca_pem = base64::engine::general_purpose::STANDARD
        .decode(ca_b64)
        .context("cluster-info's certificate-authority-data")?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&ca_pem).map_err(|e| anyhow!("cluster-info's CA: {e}"))?;
    let got = ca_hash(&pem.contents)?;
    if !got.eq_ignore_ascii_case(hash) {
        bail!("the cluster's CA hashes to {got}, not to --ca-cert-hash {hash}: refusing to trust it");
    }
    Ok(ca_pem)
}

/// The bootstrap kubeconfig the agent's TLS bootstrap reads.
pub fn bootstrap_kubeconfig(server: &str, ca_pem: &[u8], t: &Token) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: cluster\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\ncontexts:\n- name: bootstrap\n  context:\n    cluster: cluster\n    user: bootstrap\ncurrent-context: bootstrap\nusers:\n- name: bootstrap\n  user:\n    token: {}.{}\n",
        t.id, t.secret
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> Token {
        "abcdef.0123456789abcdef".parse().unwrap()
    }

    #[test]
    fn tokens_are_kubeadms_shape() {
        assert_eq!(token().id, "abcdef");
        for bad in [
            "abcdef0123456789abcdef",
            "ABCDEF.0123456789abcdef",
            "abcde.0123456789abcdef",
            "abcdef.0123",
        ] {
            assert!(bad.parse::<Token>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_signature_verifies_only_with_its_token_and_payload() {
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let header = b64.encode(r#"{"alg":"HS256","kid":"abcdef"}"#);
        let mut mac = Hmac::<Sha256>::new_from_slice(b"0123456789abcdef").unwrap();
        mac.update(format!("{header}.{}", b64.encode("kubeconfig")).as_bytes());
        let jws = format!("{header}..{}", b64.encode(mac.finalize().into_bytes()));
        assert!(jws_verifies(&jws, "kubeconfig", &token()));
        assert!(!jws_verifies(&jws, "kubeconfig2", &token()));
        let other: Token = "abcdef.fedcba9876543210".parse().unwrap();
        assert!(!jws_verifies(&jws, "kubeconfig", &other));
        assert!(!jws_verifies("not a jws", "kubeconfig", &token()));
    }

    #[test]
    fn the_ca_hash_is_of_its_public_key() {
        let ck = rcgen::generate_simple_self_signed(vec!["ca".into()]).unwrap();
        let der = ck.cert.der().to_vec();
        let h = ca_hash(&der).unwrap();
        assert!(h.starts_with("sha256:") && h.len() == 7 + 64, "{h}");
        let pem = ck.signing_key.public_key_pem();
        let spki = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap().1.contents;
        assert_eq!(h, format!("sha256:{:x}", Sha256::digest(&spki)));
    }
}
