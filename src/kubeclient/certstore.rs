//! The node's client certificate on disk, kept as kubelet's certificate store keeps it
//! (client-go util/certificate FileStore): each certificate with its private key in
//! `<root>/pki/kubelet-client-<timestamp>.pem` (mode 0600), and `kubelet-client-current.pem`, a
//! symlink swapped atomically to the newest one. The kubeconfig the bootstrap writes points at
//! the symlink, so a restart after a rotation reads the rotated certificate.
//! Everything here blocks: call it through `tasks::blocking`.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};

/// The store's file name prefix (kubelet's "kubelet-client").
const PAIR: &str = "kubelet-client";

/// A client certificate (PEM, with any chain after it) and its private key (PEM).
#[derive(Clone)]
pub struct Credential {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl Credential {
    /// A credential from its certificate PEM and key PEM; the validity is the leaf's.
    pub fn new(cert_pem: Vec<u8>, key_pem: Vec<u8>) -> Result<Credential> {
        let (not_before, not_after) = validity(&cert_pem)?;
        if !pem_blocks(&key_pem)
            .iter()
            .any(|(label, _)| label.ends_with("PRIVATE KEY"))
        {
            bail!("no private key in the PEM data");
        }
        Ok(Credential {
            cert_pem,
            key_pem,
            not_before,
            not_after,
        })
    }

    /// A credential from one PEM holding both the certificate(s) and the key (the store's files).
    pub fn from_combined(pem: &[u8]) -> Result<Credential> {
        let mut certs = String::new();
        let mut key = String::new();
        for (label, block) in pem_blocks(pem) {
            if label == "CERTIFICATE" {
                certs.push_str(&block);
            } else if label.ends_with("PRIVATE KEY") && key.is_empty() {
                key.push_str(&block);
            }
        }
        if certs.is_empty() {
            bail!("no certificate in the PEM data");
        }
        Credential::new(certs.into_bytes(), key.into_bytes())
    }

    /// Certificate(s) then key, as the store writes them.
    pub fn combined(&self) -> Vec<u8> {
        let mut out = self.cert_pem.clone();
        if !out.ends_with(b"\n") {
            out.push(b'\n');
        }
        out.extend_from_slice(&self.key_pem);
        out
    }

    /// Whether `now` falls inside the certificate's validity.
    pub fn valid_at(&self, now: SystemTime) -> bool {
        self.not_before <= now && now <= self.not_after
    }
}

/// The PEM blocks of `data`: (label, whole block text with its BEGIN/END lines).
pub fn pem_blocks(data: &[u8]) -> Vec<(String, String)> {
    let text = String::from_utf8_lossy(data);
    let mut out = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        let line = line.trim_end();
        if let Some(label) = line.strip_prefix("-----BEGIN ").and_then(|l| l.strip_suffix("-----")) {
            current = Some((label.to_string(), format!("{line}\n")));
        } else if let Some((label, mut block)) = current.take() {
            block.push_str(line);
            block.push('\n');
            if line == format!("-----END {label}-----") {
                out.push((label, block));
            } else {
                current = Some((label, block));
            }
        }
    }
    out
}

/// The validity window of the first certificate in `cert_pem`, and that each one in it parses.
pub fn validity(cert_pem: &[u8]) -> Result<(SystemTime, SystemTime)> {
    let mut first = None;
    for (label, block) in pem_blocks(cert_pem) {
        if label != "CERTIFICATE" {
            continue;
        }
        let (_, pem) = x509_parser::pem::parse_x509_pem(block.as_bytes()).map_err(|e| anyhow!("reading PEM: {e}"))?;
        let cert = pem.parse_x509().map_err(|e| anyhow!("parsing the certificate: {e}"))?;
        let v = cert.validity();
        let at = |ts: i64| {
            u64::try_from(ts)
                .map(|s| UNIX_EPOCH + Duration::from_secs(s))
                .unwrap_or(UNIX_EPOCH)
        };
        if first.is_none() {
            first = Some((at(v.not_before.timestamp()), at(v.not_after.timestamp())));
        }
    }
    first.ok_or_else(|| anyhow!("no certificate in the PEM data"))
}

/// The store under `<root>/pki`.
#[derive(Clone, Debug)]
pub struct CertStore {
    dir: PathBuf,
    /// The file name prefix: kubelet-client, or kubelet-server for the serving certificate.
    pair: &'static str,
}

impl CertStore {
    pub fn new(root_dir: &Path) -> CertStore {
        CertStore::with_pair(root_dir, PAIR)
    }

    /// The store of another pair under `<root>/pki` (`kubelet-server` for the serving
    /// certificate, as kubelet names it).
    pub fn with_pair(root_dir: &Path, pair: &'static str) -> CertStore {
        CertStore {
            dir: root_dir.join("pki"),
            pair,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `kubelet-client-current.pem`: what the written kubeconfig points at.
    pub fn current_path(&self) -> PathBuf {
        self.dir.join(format!("{}-current.pem", self.pair))
    }

    /// Where the bootstrap keeps the key of a request still in flight, so that an agent
    /// restarted meanwhile asks again with the same key and finds its earlier request
    /// (kubelet's `kubelet-client.key.tmp`).
    pub fn pending_key_path(&self) -> PathBuf {
        self.dir.join(format!("{}.key.tmp", self.pair))
    }

    /// The current credential; `None` when there is none yet.
    pub fn current(&self) -> Result<Option<Credential>> {
        let path = self.current_path();
        let data = match std::fs::read(&path) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        Credential::from_combined(&data)
            .with_context(|| format!("{}", path.display()))
            .map(Some)
    }

    /// Store `cred` as a new timestamped file and point the current symlink at it.
    pub fn update(&self, cred: &Credential) -> Result<PathBuf> {
        ferrolet_fsutil::ensure_private_dir(&self.dir)?;
        let stamp = chrono::Utc::now().format("%Y-%m-%d-%H-%M-%S");
        let pair = self.pair;
        let mut name = format!("{pair}-{stamp}.pem");
        // two renewals within one second (only a test's shortened threshold does that) must not
        // overwrite the file the current link still names
        if self.dir.join(&name).exists() {
            name = format!("{pair}-{stamp}-{}.pem", ferrolet_fsutil::unique());
        }
        let file = self.dir.join(&name);
        ferrolet_fsutil::write_atomic_mode(&file, &cred.combined(), 0o600)?;
        // kubelet's updateSymlink: a fresh link beside the current one, renamed over it
        let updated = self
            .dir
            .join(format!(".{pair}-updated.pem.{}", ferrolet_fsutil::unique()));
        std::os::unix::fs::symlink(&name, &updated)
            .with_context(|| format!("creating the link {}", updated.display()))?;
        let current = self.current_path();
        if let Err(e) = std::fs::rename(&updated, &current) {
            let _ = std::fs::remove_file(&updated);
            return Err(e).with_context(|| format!("replacing {}", current.display()));
        }
        ferrolet_fsutil::sync_dir(&self.dir);
        Ok(file)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A self-signed certificate valid from `not_before` to `not_after` (unix seconds), with its key.
    pub(crate) fn self_signed(cn: &str, not_before: i64, not_after: i64) -> (String, String) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        params.not_before = time::OffsetDateTime::from_unix_timestamp(not_before).unwrap();
        params.not_after = time::OffsetDateTime::from_unix_timestamp(not_after).unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn combined_pem_round_trips_with_its_validity() {
        let (cert, key) = self_signed("system:node:n1", 1_000_000_000, 2_000_000_000);
        let cred = Credential::new(cert.clone().into_bytes(), key.clone().into_bytes()).unwrap();
        assert_eq!(cred.not_before, UNIX_EPOCH + Duration::from_secs(1_000_000_000));
        assert_eq!(cred.not_after, UNIX_EPOCH + Duration::from_secs(2_000_000_000));
        let back = Credential::from_combined(&cred.combined()).unwrap();
        assert_eq!(back.cert_pem, cert.into_bytes());
        assert_eq!(back.key_pem, key.into_bytes());
        assert!(back.valid_at(UNIX_EPOCH + Duration::from_secs(1_500_000_000)));
        assert!(!back.valid_at(UNIX_EPOCH + Duration::from_secs(2_000_000_001)));
        assert!(Credential::from_combined(b"junk").is_err());
    }

    #[test]
    fn update_writes_a_private_file_and_swaps_the_link() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let store = CertStore::new(root.path());
        assert!(store.current().unwrap().is_none());
        let (c1, k1) = self_signed("a", 1_000_000_000, 2_000_000_000);
        let (c2, k2) = self_signed("b", 1_100_000_000, 2_100_000_000);
        let first = store.update(&Credential::new(c1.into(), k1.into()).unwrap()).unwrap();
        let second = store.update(&Credential::new(c2.into(), k2.into()).unwrap()).unwrap();
        assert_ne!(first, second);
        assert!(first.exists(), "older certificates stay, as kubelet's do");
        let mode = std::fs::metadata(&second).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let link = std::fs::read_link(store.current_path()).unwrap();
        assert_eq!(link, second.file_name().unwrap());
        let name = second.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with("kubelet-client-20") && name.ends_with(".pem"),
            "{name}"
        );
        let cur = store.current().unwrap().unwrap();
        assert_eq!(cur.not_after, UNIX_EPOCH + Duration::from_secs(2_100_000_000));
        let names = ferrolet_fsutil::list_names(store.dir()).unwrap();
        assert_eq!(names.len(), 3, "two pems and the link, no leftovers: {names:?}");
    }
}
