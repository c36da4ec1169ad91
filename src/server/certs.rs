//! Where the kubelet port's serving certificate comes from, in kubelet's order:
//! - `tlsCertFile` / `tlsPrivateKeyFile` when set;
//! - with `serverTLSBootstrap` in a cluster, a certificate the API server signs
//!   ([`bootstrap`]);
//! - else a self-signed one kept in `<root>/pki/kubelet.crt` and `kubelet.key` (kubelet's names),
//!   made once and reused across restarts (made again only when unreadable or expired), so
//!   clients that pinned it keep working.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use tracing::{info, warn};

use super::tls::ServingCert;
use crate::config::Config;
use crate::kubeclient::certstore::Credential;
use crate::kubeclient::Kube;
use crate::tasks::blocking;

pub mod bootstrap;

/// How long a self-signed serving certificate lasts (kubelet's: one year).
const SELF_SIGNED_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// The serving certificate as configured. `ips` are the node's addresses (for the certificate's
/// names); `kube` the node's API client (for the bootstrap).
pub async fn serving_cert(cfg: &Config, ips: Vec<IpAddr>, kube: Option<Kube>) -> Result<Arc<ServingCert>> {
    let s = &cfg.serving;
    let cert = Arc::new(ServingCert::default());
    if let (Some(c), Some(k)) = (s.tls_cert_file.clone(), s.tls_private_key_file.clone()) {
        let (cp, kp) = (c.clone(), k.clone());
        let (cert_pem, key_pem) = blocking(move || {
            let cert = std::fs::read(&cp).with_context(|| format!("tlsCertFile: reading {}", cp.display()))?;
            let key = std::fs::read(&kp).with_context(|| format!("tlsPrivateKeyFile: reading {}", kp.display()))?;
            Ok((cert, key))
        })
        .await?;
        cert.set(&cert_pem, &key_pem)
            .with_context(|| format!("tlsCertFile {} / tlsPrivateKeyFile {}", c.display(), k.display()))?;
        info!(cert = %c.display(), "serving the configured certificate");
        return Ok(cert);
    }
    if s.server_tls_bootstrap {
        if let Some(kube) = kube {
            bootstrap::start(cfg, ips, kube, cert.clone()).await?;
            return Ok(cert);
        }
    }
    let (root, node) = (cfg.root_dir.clone(), cfg.node_name.clone());
    let cred = blocking(move || self_signed(&root, &node, &ips)).await?;
    cert.set(&cred.cert_pem, &cred.key_pem)
        .context("the self-signed serving certificate")?;
    Ok(cert)
}

/// The self-signed pair under `<root>/pki`, made if missing, unreadable or expired.
pub fn self_signed(root: &Path, host: &str, ips: &[IpAddr]) -> Result<Credential> {
    let dir = root.join("pki");
    let (crt, key) = (dir.join("kubelet.crt"), dir.join("kubelet.key"));
    if let (Ok(c), Ok(k)) = (std::fs::read(&crt), std::fs::read(&key)) {
        match Credential::new(c, k) {
            Ok(cred)
                if cred.valid_at(SystemTime::now())
                    && super::tls::certified_key(&cred.cert_pem, &cred.key_pem).is_ok() =>
            {
                return Ok(cred)
            }
            Ok(_) => warn!(cert = %crt.display(), "the self-signed serving certificate has expired; making a new one"),
            Err(e) => {
                warn!(cert = %crt.display(), "the self-signed serving certificate cannot be read ({e:#}); making a new one")
            }
        }
    }
    let key_pair = crate::kubeclient::csr::new_key()?;
    let mut names: Vec<String> = vec![host.to_string(), "localhost".to_string()];
    names.extend(ips.iter().map(IpAddr::to_string));
    names.push("127.0.0.1".into());
    names.dedup();
    let mut params = rcgen::CertificateParams::new(names).context("serving certificate names")?;
    let now = chrono::Utc::now();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("{host}@{}", now.timestamp()));
    params.not_before = time_of(SystemTime::now() - Duration::from_secs(3600));
    params.not_after = time_of(SystemTime::now() + SELF_SIGNED_VALIDITY);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params
        .self_signed(&key_pair)
        .context("signing the serving certificate")?;
    ferrolet_fsutil::ensure_private_dir(&dir)?;
    ferrolet_fsutil::write_atomic_mode(&key, key_pair.serialize_pem().as_bytes(), 0o600)?;
    ferrolet_fsutil::write_atomic_mode(&crt, cert.pem().as_bytes(), 0o644)?;
    info!(cert = %crt.display(), "made a self-signed serving certificate");
    Credential::new(cert.pem().into_bytes(), key_pair.serialize_pem().into_bytes())
}

fn time_of(t: SystemTime) -> time::OffsetDateTime {
    time::OffsetDateTime::from(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_self_signed_pair_is_private_and_reused() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let ip: IpAddr = "198.51.100.7".parse().unwrap();
        let a = self_signed(root.path(), "node-a", &[ip]).unwrap();
        let key = root.path().join("pki/kubelet.key");
        assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
        let b = self_signed(root.path(), "node-a", &[ip]).unwrap();
        assert_eq!(a.cert_pem, b.cert_pem, "reused across restarts");
        let der = x509_parser::pem::parse_x509_pem(&a.cert_pem).unwrap().1.contents;
        let (_, c) = x509_parser::parse_x509_certificate(&der).unwrap();
        let san = c
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .clone();
        let names: Vec<String> = san
            .iter()
            .map(|n| match n {
                x509_parser::extensions::GeneralName::DNSName(d) => d.to_string(),
                x509_parser::extensions::GeneralName::IPAddress(b) if b.len() == 4 => {
                    IpAddr::from(<[u8; 4]>::try_from(*b).unwrap()).to_string()
                }
                other => format!("{other}"),
            })
            .collect();
        assert_eq!(names, ["node-a", "localhost", "198.51.100.7", "127.0.0.1"]);
        // a broken pair is made again
        std::fs::write(&key, "junk").unwrap();
        let c = self_signed(root.path(), "node-a", &[ip]).unwrap();
        assert_ne!(a.cert_pem, c.cert_pem);
    }
}
