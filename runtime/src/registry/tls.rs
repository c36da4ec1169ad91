//! The rustls client configuration for a registry host (`configs.<host>.tls` of
//! registries.yaml): the system's roots and the host's CA, a client certificate, or no
//! verification. Both the client and the configuration's check at load use it.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

/// `configs.<host>.tls`, with the files' contents read when the configuration was loaded.
/// `Debug` names the files and leaves their contents out (the client key is among them).
#[derive(Clone, Default, PartialEq)]
pub(crate) struct TlsConfig {
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub insecure_skip_verify: bool,
    pub(crate) ca_pem: Option<Vec<u8>>,
    pub(crate) cert_pem: Option<Vec<u8>>,
    pub(crate) key_pem: Option<Vec<u8>>,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("insecure_skip_verify", &self.insecure_skip_verify)
            .finish_non_exhaustive()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn native_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::debug!(error = %e, "loading system CA certificates");
        }
        found.certs
    })
}

/// The rustls client configuration for `tls`: the system's roots plus `ca_file`, a client
/// certificate from `cert_file`/`key_file`, or no verification at all for
/// `insecure_skip_verify`.
pub(crate) fn tls_config(tls: &TlsConfig) -> Result<rustls::ClientConfig, String> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = if tls.insecure_skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider())))
    } else {
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(native_roots().iter().cloned());
        if let Some(pem) = &tls.ca_pem {
            let certs = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("ca_file {}: {e}", show(&tls.ca_file)))?;
            if certs.is_empty() {
                return Err(format!("ca_file {}: no PEM certificate in it", show(&tls.ca_file)));
            }
            for c in certs {
                roots
                    .add(c)
                    .map_err(|e| format!("ca_file {}: {e}", show(&tls.ca_file)))?;
            }
        }
        builder.with_root_certificates(roots)
    };
    match (&tls.cert_pem, &tls.key_pem) {
        (Some(cert), Some(key)) => {
            let certs = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("cert_file {}: {e}", show(&tls.cert_file)))?;
            if certs.is_empty() {
                return Err(format!("cert_file {}: no PEM certificate in it", show(&tls.cert_file)));
            }
            let key =
                PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("key_file {}: {e}", show(&tls.key_file)))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| format!("cert_file/key_file: {e}"))
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

fn show(p: &Option<std::path::PathBuf>) -> String {
    p.as_ref().map(|p| p.display().to_string()).unwrap_or_default()
}

/// `insecure_skip_verify`: any certificate is accepted (signatures are still checked).
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
