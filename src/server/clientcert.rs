//! Client certificates on the kubelet port, checked the way kubelet's Go TLS stack checks them
//! (`VerifyClientCertIfGiven` against clientCAFile's bundle): optional (anonymous and
//! bearer-token clients connect without one), chained to one of the bundle's CAs through the
//! intermediates the client sent, each certificate within its validity, and the leaf's extended
//! key usage allowing client auth when it has that extension.
//!
//! Written here rather than taken from rustls/webpki because webpki refuses X.509 v1
//! certificates, and `openssl x509 -req` without extensions signs v1: the control plane's
//! `apiserver-kubelet-client` certificate, the one the API server presents to every kubelet, is
//! one (docs/server.md#x509-v1-client-certificates). Chain signatures are checked with
//! x509-parser (ring); handshake signatures with the certificate's public key directly.
//!
//! The CA file is read again when its modification time changes, as kubelet's dynamic CA
//! content follows its file.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, SubjectPublicKeyInfoDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};
use tracing::{info, warn};
use x509_parser::prelude::*;

/// The CAs of a bundle, as DER.
#[derive(Debug, Default)]
struct Bundle {
    modified: Option<SystemTime>,
    cas: Vec<Vec<u8>>,
}

/// Verifies optional client certificates against a CA bundle file.
#[derive(Debug)]
pub struct ClientCaVerifier {
    path: PathBuf,
    bundle: RwLock<Arc<Bundle>>,
    algs: WebPkiSupportedAlgorithms,
}

impl ClientCaVerifier {
    /// A verifier for the CAs in `path` (PEM); the file must hold at least one certificate.
    pub fn from_file(path: PathBuf) -> anyhow::Result<ClientCaVerifier> {
        let bundle = read_bundle(&path)?;
        info!(file = %path.display(), cas = bundle.cas.len(), "client certificates are verified against this bundle");
        Ok(ClientCaVerifier {
            path,
            bundle: RwLock::new(Arc::new(bundle)),
            algs: rustls::crypto::ring::default_provider().signature_verification_algorithms,
        })
    }

    /// The bundle, read again if the file changed (a bad new file keeps the old bundle).
    fn bundle(&self) -> Arc<Bundle> {
        let current = self.bundle.read().unwrap_or_else(|e| e.into_inner()).clone();
        let modified = std::fs::metadata(&self.path).and_then(|m| m.modified()).ok();
        if modified == current.modified {
            return current;
        }
        match read_bundle(&self.path) {
            Ok(b) => {
                info!(file = %self.path.display(), cas = b.cas.len(), "client CA bundle reloaded");
                let b = Arc::new(b);
                *self.bundle.write().unwrap_or_else(|e| e.into_inner()) = b.clone();
                b
            }
            Err(e) => {
                warn!(error = %format!("{e:#}"), "client CA bundle changed but cannot be read; keeping the old one");
                current
            }
        }
    }
}

fn read_bundle(path: &std::path::Path) -> anyhow::Result<Bundle> {
    use anyhow::Context;
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let data = std::fs::read(path).with_context(|| format!("clientCAFile: reading {}", path.display()))?;
    let mut cas = Vec::new();
    for pem in Pem::iter_from_buffer(&data) {
        let pem = pem.with_context(|| format!("clientCAFile: {}: not PEM", path.display()))?;
        if pem.label != "CERTIFICATE" {
            continue;
        }
        X509Certificate::from_der(&pem.contents)
            .map_err(|e| anyhow::anyhow!("clientCAFile: {}: a certificate does not parse: {e}", path.display()))?;
        cas.push(pem.contents);
    }
    if cas.is_empty() {
        anyhow::bail!("clientCAFile: {} holds no certificate", path.display());
    }
    Ok(Bundle { modified, cas })
}

fn bad(e: CertificateError) -> Error {
    Error::InvalidCertificate(e)
}

fn within(cert: &X509Certificate<'_>, now: i64) -> Result<(), Error> {
    let v = cert.validity();
    if now < v.not_before.timestamp() {
        return Err(bad(CertificateError::NotValidYet));
    }
    if now > v.not_after.timestamp() {
        return Err(bad(CertificateError::Expired));
    }
    Ok(())
}

/// Whether the leaf may authenticate a client: no extended key usage, or one naming client
/// auth or any usage.
fn allows_client_auth(cert: &X509Certificate<'_>) -> bool {
    match cert.extended_key_usage() {
        Ok(Some(eku)) => eku.value.client_auth || eku.value.any,
        Ok(None) => true,
        Err(_) => false,
    }
}

/// Whether an intermediate `cert` may sign certificates: only when its basic constraints say
/// CA, as Go's verifier requires. A v1 certificate has no extensions to say so: trusted as a
/// root from clientCAFile, never as an intermediate, or any holder of a v1 client certificate
/// from the CA (the control plane's are v1) could sign itself a certificate for any user.
fn may_sign(cert: &X509Certificate<'_>) -> bool {
    matches!(cert.basic_constraints(), Ok(Some(bc)) if bc.value.ca)
}

/// Verify `leaf` (with the client's `intermediates`, DER) against the CAs at unix time `now`.
pub fn verify_chain(cas: &[Vec<u8>], leaf: &[u8], intermediates: &[&[u8]], now: i64) -> Result<(), Error> {
    let (_, leaf) = X509Certificate::from_der(leaf).map_err(|_| bad(CertificateError::BadEncoding))?;
    within(&leaf, now)?;
    if !allows_client_auth(&leaf) {
        return Err(bad(CertificateError::InvalidPurpose));
    }
    let cas: Vec<X509Certificate<'_>> = cas
        .iter()
        .filter_map(|d| X509Certificate::from_der(d).ok().map(|(_, c)| c))
        .collect();
    let inters: Vec<X509Certificate<'_>> = intermediates
        .iter()
        .filter_map(|d| X509Certificate::from_der(d).ok().map(|(_, c)| c))
        .collect();
    let mut current = &leaf;
    // each step climbs one certificate; a chain longer than what was sent is a loop
    for _ in 0..=inters.len() {
        let signed_by = |issuer: &X509Certificate<'_>| {
            issuer.subject().as_raw() == current.issuer().as_raw()
                && current.verify_signature(Some(issuer.public_key())).is_ok()
        };
        if let Some(ca) = cas.iter().find(|ca| signed_by(ca)) {
            return within(ca, now);
        }
        match inters.iter().find(|i| signed_by(i) && may_sign(i)) {
            Some(next) => {
                within(next, now)?;
                current = next;
            }
            None => break,
        }
    }
    Err(bad(CertificateError::UnknownIssuer))
}

/// The SPKI of a certificate (v1 or v3).
fn spki(cert: &CertificateDer<'_>) -> Result<SubjectPublicKeyInfoDer<'static>, Error> {
    let (_, c) = X509Certificate::from_der(cert.as_ref()).map_err(|_| bad(CertificateError::BadEncoding))?;
    Ok(SubjectPublicKeyInfoDer::from(c.public_key().raw.to_vec()))
}

impl ClientCertVerifier for ClientCaVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    /// No hints: a Go client then offers its certificate whatever the issuer (hints that went
    /// stale with a reloaded bundle would make it withhold a good one).
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        let bundle = self.bundle();
        let inters: Vec<&[u8]> = intermediates.iter().map(|c| c.as_ref()).collect();
        verify_chain(&bundle.cas, end_entity.as_ref(), &inters, now.as_secs() as i64)?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        let spki = spki(cert)?;
        let key = webpki::RawPublicKeyEntity::try_from(&spki).map_err(|_| bad(CertificateError::BadEncoding))?;
        let candidates = self
            .algs
            .mapping
            .iter()
            .find(|(s, _)| *s == dss.scheme)
            .map(|(_, algs)| *algs)
            .ok_or(Error::PeerMisbehaved(
                rustls::PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme,
            ))?;
        for alg in candidates {
            if key.verify_signature(*alg, message, dss.signature()).is_ok() {
                return Ok(HandshakeSignatureValid::assertion());
            }
        }
        Err(bad(CertificateError::BadSignature))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature_with_raw_key(message, &spki(cert)?, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

/// The user a verified client certificate names: its common name (the last one when there are
/// several, as Go's pkix reads a subject), and its organizations as groups (kubelet's x509
/// CommonNameUserConversion).
pub fn user_of(cert: &[u8]) -> Option<(String, Vec<String>)> {
    let (_, c) = X509Certificate::from_der(cert).ok()?;
    let name = c.subject().iter_common_name().last()?.as_str().ok()?.to_string();
    if name.is_empty() {
        return None;
    }
    let groups = c
        .subject()
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Some((name, groups))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn openssl(dir: &std::path::Path, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn der(dir: &std::path::Path, file: &str) -> Vec<u8> {
        let data = std::fs::read(dir.join(file)).unwrap();
        Pem::iter_from_buffer(&data).next().unwrap().unwrap().contents
    }

    /// A CA and a v1 client certificate signed by it, as the control plane makes them.
    fn v1_chain(dir: &std::path::Path) {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=test-ca",
            ],
        );
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "c.key",
                "-out",
                "c.csr",
                "-subj",
                "/O=system:masters/CN=kube-apiserver-kubelet-client",
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "c.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "c.crt",
                "-days",
                "1",
            ],
        );
    }

    #[test]
    fn a_v1_client_certificate_cannot_sign_for_another_user() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        v1_chain(d);
        // The holder of c.crt (a v1 leaf from the CA) signs a certificate for someone else.
        openssl(
            d,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "m.key",
                "-out",
                "m.csr",
                "-subj",
                "/O=system:masters/CN=mallory",
            ],
        );
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                "m.csr",
                "-CA",
                "c.crt",
                "-CAkey",
                "c.key",
                "-CAcreateserial",
                "-out",
                "m.crt",
                "-days",
                "1",
            ],
        );
        let (ca, c, m) = (der(d, "ca.crt"), der(d, "c.crt"), der(d, "m.crt"));
        assert!(verify_chain(std::slice::from_ref(&ca), &c, &[], now()).is_ok());
        assert!(verify_chain(&[ca], &m, &[&c], now()).is_err());
    }

    fn now() -> i64 {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    #[test]
    fn a_v1_client_certificate_from_the_ca_verifies() {
        let dir = tempfile::tempdir().unwrap();
        v1_chain(dir.path());
        let (ca, leaf) = (der(dir.path(), "ca.crt"), der(dir.path(), "c.crt"));
        let (_, parsed) = X509Certificate::from_der(&leaf).unwrap();
        assert_eq!(parsed.version(), X509Version::V1, "openssl without extensions signs v1");
        verify_chain(std::slice::from_ref(&ca), &leaf, &[], now()).unwrap();
        assert_eq!(
            user_of(&leaf),
            Some(("kube-apiserver-kubelet-client".into(), vec!["system:masters".into()]))
        );
        // outside its validity
        assert!(matches!(
            verify_chain(std::slice::from_ref(&ca), &leaf, &[], now() + 3 * 86400),
            Err(Error::InvalidCertificate(CertificateError::Expired))
        ));
        // another CA
        let other = tempfile::tempdir().unwrap();
        v1_chain(other.path());
        assert!(matches!(
            verify_chain(&[der(other.path(), "ca.crt")], &leaf, &[], now()),
            Err(Error::InvalidCertificate(CertificateError::UnknownIssuer))
        ));
        // a self-signed certificate with the CA's subject is not the CA
        let fake = rcgen_cert("test-ca", None, &[]).0;
        assert!(verify_chain(&[ca], &fake, &[], now()).is_err());
    }

    /// An rcgen certificate (v3) named `cn`, signed by `issuer` (cert params, key) or
    /// self-signed, with extended key usages `eku`.
    fn rcgen_cert(
        cn: &str,
        issuer: Option<&rcgen::Issuer<'static, rcgen::KeyPair>>,
        eku: &[rcgen::ExtendedKeyUsagePurpose],
    ) -> (Vec<u8>, rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        p.distinguished_name.push(rcgen::DnType::OrganizationName, "team");
        p.extended_key_usages = eku.to_vec();
        let cert = match issuer {
            Some(i) => p.signed_by(&key, i).unwrap(),
            None => p.self_signed(&key).unwrap(),
        };
        (cert.der().to_vec(), key)
    }

    fn rcgen_ca(cn: &str) -> (Vec<u8>, rcgen::Issuer<'static, rcgen::KeyPair>) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = p.self_signed(&key).unwrap();
        (cert.der().to_vec(), rcgen::Issuer::new(p, key))
    }

    #[test]
    fn v3_certificates_chain_through_intermediates_and_need_client_auth() {
        let (ca, ca_issuer) = rcgen_ca("root");
        let (leaf, _) = rcgen_cert("alice", Some(&ca_issuer), &[rcgen::ExtendedKeyUsagePurpose::ClientAuth]);
        verify_chain(std::slice::from_ref(&ca), &leaf, &[], now()).unwrap();
        assert_eq!(user_of(&leaf), Some(("alice".into(), vec!["team".into()])));
        // a server-only certificate is refused
        let (server, _) = rcgen_cert("srv", Some(&ca_issuer), &[rcgen::ExtendedKeyUsagePurpose::ServerAuth]);
        assert!(matches!(
            verify_chain(std::slice::from_ref(&ca), &server, &[], now()),
            Err(Error::InvalidCertificate(CertificateError::InvalidPurpose))
        ));
        // through an intermediate CA the client sends
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, "intermediate");
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let inter = p.signed_by(&key, &ca_issuer).unwrap().der().to_vec();
        let inter_issuer = rcgen::Issuer::new(p, key);
        let (bob, _) = rcgen_cert("bob", Some(&inter_issuer), &[]);
        verify_chain(std::slice::from_ref(&ca), &bob, &[&inter], now()).unwrap();
        assert!(
            verify_chain(&[ca], &bob, &[], now()).is_err(),
            "the intermediate is needed"
        );
        // a leaf (not a CA) cannot stand in for an intermediate
        let (other_ca, other_issuer) = rcgen_ca("other");
        let (not_ca, not_ca_key) = rcgen_cert("carol", Some(&other_issuer), &[]);
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, "carol");
        p.distinguished_name.push(rcgen::DnType::OrganizationName, "team");
        let fake_issuer = rcgen::Issuer::new(p, not_ca_key);
        let (eve, _) = rcgen_cert("eve", Some(&fake_issuer), &[]);
        assert!(matches!(
            verify_chain(&[other_ca], &eve, &[&not_ca], now()),
            Err(Error::InvalidCertificate(CertificateError::UnknownIssuer))
        ));
    }
}
