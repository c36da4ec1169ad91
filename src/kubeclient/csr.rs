//! Requesting the node's client certificate from the API server (client-go util/certificate/csr
//! as kubelet uses it): an ECDSA P-256 key, a PKCS#10 request for `system:node:<node>` in
//! `system:nodes`, a certificates.k8s.io/v1 CertificateSigningRequest for the
//! `kubernetes.io/kube-apiserver-client-kubelet` signer, and the wait for the signed
//! certificate, which ends with an error on a Denied or Failed condition or at the time limit.

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec};
use kube::api::{Api, ObjectMeta, PostParams};
use sha2::{Digest, Sha512};
use tracing::{info, warn};

/// The signer of kubelet client certificates.
pub const SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// What the certificate is for (an ECDSA key signs; it does not encipher keys).
pub const USAGES: [&str; 2] = ["digital signature", "client auth"];
/// The group every node's user is in.
pub const NODES_GROUP: &str = "system:nodes";

/// The user name of node `node` (`system:node:<node>`).
pub fn node_user(node: &str) -> String {
    format!("system:node:{node}")
}

/// A fresh ECDSA P-256 key.
pub fn new_key() -> Result<rcgen::KeyPair> {
    rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).context("generating an ECDSA P-256 key")
}

/// A key from its PKCS#8 PEM.
pub fn key_from_pem(pem: &str) -> Result<rcgen::KeyPair> {
    rcgen::KeyPair::from_pem(pem).context("reading the private key")
}

/// The PEM of a certificate request for node `node`, signed with `key`.
pub fn node_request(node: &str, key: &rcgen::KeyPair) -> Result<String> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).context("certificate request parameters")?;
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::OrganizationName, NODES_GROUP);
    dn.push(rcgen::DnType::CommonName, node_user(node));
    params.distinguished_name = dn;
    let csr = params
        .serialize_request(key)
        .context("signing the certificate request")?;
    csr.pem().context("encoding the certificate request")
}

/// The signer of kubelet serving certificates.
pub const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// What a serving certificate is for (client-go's certificate manager for kubelet 1.26).
pub const SERVING_USAGES: [&str; 3] = ["digital signature", "key encipherment", "server auth"];

/// The PEM of a serving certificate request for node `node` naming the node's `dns` names and
/// `ips` (kubelet's serving certificate template), signed with `key`.
pub fn node_serving_request(
    node: &str,
    key: &rcgen::KeyPair,
    dns: &[String],
    ips: &[std::net::IpAddr],
) -> Result<String> {
    let mut names: Vec<String> = dns.to_vec();
    names.extend(ips.iter().map(|i| i.to_string()));
    let mut params = rcgen::CertificateParams::new(names).context("certificate request names")?;
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::OrganizationName, NODES_GROUP);
    dn.push(rcgen::DnType::CommonName, node_user(node));
    params.distinguished_name = dn;
    let csr = params
        .serialize_request(key)
        .context("signing the certificate request")?;
    csr.pem().context("encoding the certificate request")
}

/// The bootstrap's request name, derived from the key and what is asked for (kubelet's
/// digestedName), so a restarted agent with the same pending key finds its request again.
pub fn digested_name(node: &str, key: &rcgen::KeyPair) -> String {
    let mut h = Sha512::new();
    let mut field = |b: &[u8]| {
        h.update((b.len() as u64).to_be_bytes());
        h.update(b);
    };
    field(key.public_key_pem().as_bytes());
    field(node_user(node).as_bytes());
    field(NODES_GROUP.as_bytes());
    for u in USAGES {
        field(u.as_bytes());
    }
    let digest = h.finalize();
    format!(
        "node-csr-{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest)
    )
}

/// The CertificateSigningRequest object: named `name`, or with the generated name `csr-...`
/// (client-go's certificate manager, for renewals) when `None`.
pub fn request_object(name: Option<&str>, request_pem: &str) -> CertificateSigningRequest {
    request_object_for(name, request_pem, SIGNER, &USAGES)
}

/// [`request_object`] for another signer and usages (the serving certificate's).
pub fn request_object_for(
    name: Option<&str>,
    request_pem: &str,
    signer: &str,
    usages: &[&str],
) -> CertificateSigningRequest {
    CertificateSigningRequest {
        metadata: ObjectMeta {
            name: name.map(str::to_string),
            generate_name: name.is_none().then(|| "csr-".to_string()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: k8s_openapi::ByteString(request_pem.as_bytes().to_vec()),
            signer_name: signer.to_string(),
            usages: Some(usages.iter().map(|u| u.to_string()).collect()),
            ..Default::default()
        },
        status: None,
    }
}

/// How a request stands.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// Approved and signed: the certificate PEM.
    Issued(Vec<u8>),
    /// Denied or Failed: the error to report.
    Refused(String),
    Pending,
}

/// Where `csr` stands (client-go's WaitForCertificate checks, in its order).
pub fn outcome(csr: &CertificateSigningRequest) -> Outcome {
    let Some(status) = &csr.status else {
        return Outcome::Pending;
    };
    let mut approved = false;
    for c in status.conditions.iter().flatten() {
        let reason = c.reason.as_deref().unwrap_or("");
        let message = c.message.as_deref().unwrap_or("");
        match c.type_.as_str() {
            "Denied" => {
                return Outcome::Refused(format!(
                    "certificate signing request is denied, reason: {reason}, message: {message}"
                ))
            }
            "Failed" => {
                return Outcome::Refused(format!(
                    "certificate signing request failed, reason: {reason}, message: {message}"
                ))
            }
            "Approved" => approved = true,
            _ => {}
        }
    }
    match &status.certificate {
        Some(cert) if approved && !cert.0.is_empty() => Outcome::Issued(cert.0.clone()),
        _ => Outcome::Pending,
    }
}

/// Ask for a certificate for `request_pem` and wait (up to `limit`) until it is issued.
/// `name` is the bootstrap's fixed name (an existing request of that name for the same key is
/// waited on instead of created again); `None` makes a generated one.
pub async fn request_certificate(
    client: kube::Client,
    name: Option<&str>,
    request_pem: &str,
    limit: Duration,
) -> Result<Vec<u8>> {
    request_certificate_for(client, name, request_pem, SIGNER, &USAGES, limit).await
}

/// [`request_certificate`] for another signer and usages (the serving certificate's).
pub async fn request_certificate_for(
    client: kube::Client,
    name: Option<&str>,
    request_pem: &str,
    signer: &str,
    usages: &[&str],
    limit: Duration,
) -> Result<Vec<u8>> {
    let api: Api<CertificateSigningRequest> = Api::all(client);
    let obj = request_object_for(name, request_pem, signer, usages);
    let created = match api.create(&PostParams::default(), &obj).await {
        Ok(c) => c,
        Err(kube::Error::Api(s)) if s.code == 409 && name.is_some() => {
            let name = name.unwrap_or_default();
            let existing = api
                .get(name)
                .await
                .with_context(|| format!("reading the existing CertificateSigningRequest {name}"))?;
            if existing.spec.request.0 != obj.spec.request.0 || existing.spec.signer_name != signer {
                bail!("CertificateSigningRequest {name} exists and asks for something else");
            }
            existing
        }
        Err(e) => return Err(e).context("creating the CertificateSigningRequest"),
    };
    let name = created.metadata.name.clone().unwrap_or_default();
    let uid = created.metadata.uid.clone();
    info!(csr = %name, signer, "certificate signing request created; waiting for its certificate");
    let wait = wait_for_certificate(&api, &name, uid.as_deref());
    match tokio::time::timeout(limit, wait).await {
        Ok(r) => r.with_context(|| format!("CertificateSigningRequest {name}")),
        Err(_) => Err(anyhow!(
            "CertificateSigningRequest {name}: no certificate issued within {}s (is it approved? `kubectl certificate approve {name}`)",
            limit.as_secs()
        )),
    }
}

/// Watch the request until it is issued or refused; a broken watch is started again.
async fn wait_for_certificate(api: &Api<CertificateSigningRequest>, name: &str, uid: Option<&str>) -> Result<Vec<u8>> {
    let mut last_error: Option<String> = None;
    loop {
        let cond = |o: Option<&CertificateSigningRequest>| match o {
            None => true,
            Some(csr) => csr.metadata.uid.as_deref() != uid || outcome(csr) != Outcome::Pending,
        };
        match kube::runtime::wait::await_condition(api.clone(), name, cond).await {
            Ok(None) => bail!("deleted while waiting for its certificate"),
            Ok(Some(csr)) if csr.metadata.uid.as_deref() != uid => {
                bail!("replaced by another request of the same name while waiting for its certificate")
            }
            Ok(Some(csr)) => match outcome(&csr) {
                Outcome::Issued(cert) => return Ok(cert),
                Outcome::Refused(msg) => bail!(msg),
                Outcome::Pending => {}
            },
            Err(e) => {
                let msg = format!("{e:#}");
                if last_error.as_deref() != Some(msg.as_str()) {
                    warn!(csr = %name, "watching the certificate signing request failed: {msg}; retrying");
                    last_error = Some(msg);
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::certificates::v1::{CertificateSigningRequestCondition, CertificateSigningRequestStatus};

    #[test]
    fn request_names_the_node_and_its_group() {
        let key = new_key().unwrap();
        let pem = node_request("node-1", &key).unwrap();
        let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        assert_eq!(pem.label, "CERTIFICATE REQUEST");
        let (_, req) =
            <x509_parser::certification_request::X509CertificationRequest as x509_parser::prelude::FromDer<_>>::from_der(
                &pem.contents,
            )
            .unwrap();
        let subject = &req.certification_request_info.subject;
        let cn: Vec<_> = subject
            .iter_common_name()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        let o: Vec<_> = subject
            .iter_organization()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        assert_eq!(cn, vec!["system:node:node-1"]);
        assert_eq!(o, vec!["system:nodes"]);
        // the key is P-256 ECDSA
        let spki = &req.certification_request_info.subject_pki;
        assert_eq!(spki.algorithm.algorithm.to_id_string(), "1.2.840.10045.2.1");
    }

    #[test]
    fn object_asks_the_kubelet_client_signer_for_client_auth() {
        let obj = request_object(Some("node-csr-x"), "PEM");
        assert_eq!(obj.metadata.name.as_deref(), Some("node-csr-x"));
        assert_eq!(obj.spec.signer_name, "kubernetes.io/kube-apiserver-client-kubelet");
        assert_eq!(
            obj.spec.usages.clone().unwrap(),
            vec!["digital signature", "client auth"]
        );
        assert_eq!(obj.spec.request.0, b"PEM");
        let renewal = request_object(None, "PEM");
        assert_eq!(renewal.metadata.name, None);
        assert_eq!(renewal.metadata.generate_name.as_deref(), Some("csr-"));
    }

    #[test]
    fn digested_name_follows_the_key() {
        let k1 = new_key().unwrap();
        let k2 = new_key().unwrap();
        let n1 = digested_name("n", &k1);
        assert!(n1.starts_with("node-csr-"));
        assert_eq!(n1, digested_name("n", &key_from_pem(&k1.serialize_pem()).unwrap()));
        assert_ne!(n1, digested_name("n", &k2));
        assert_ne!(n1, digested_name("m", &k1));
    }

    fn with(conds: &[(&str, &str)], cert: Option<&[u8]>) -> CertificateSigningRequest {
        let mut obj = request_object(Some("x"), "PEM");
        obj.status = Some(CertificateSigningRequestStatus {
            certificate: cert.map(|c| k8s_openapi::ByteString(c.to_vec())),
            conditions: Some(
                conds
                    .iter()
                    .map(|(t, r)| CertificateSigningRequestCondition {
                        type_: t.to_string(),
                        status: "True".into(),
                        reason: Some(r.to_string()),
                        message: Some("m".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
        });
        obj
    }

    #[test]
    fn outcome_reads_the_conditions() {
        assert_eq!(outcome(&request_object(Some("x"), "P")), Outcome::Pending);
        assert_eq!(outcome(&with(&[("Approved", "AutoApproved")], None)), Outcome::Pending);
        assert_eq!(
            outcome(&with(&[("Approved", "AutoApproved")], Some(b"CERT"))),
            Outcome::Issued(b"CERT".to_vec())
        );
        assert_eq!(
            outcome(&with(&[("Denied", "NotMine")], None)),
            Outcome::Refused("certificate signing request is denied, reason: NotMine, message: m".into())
        );
        assert!(matches!(
            outcome(&with(&[("Approved", "A"), ("Failed", "SignerError")], None)),
            Outcome::Refused(m) if m.starts_with("certificate signing request failed")
        ));
    }
}
