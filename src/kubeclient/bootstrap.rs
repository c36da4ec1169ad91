//! The TLS bootstrap (kubelet's pkg/kubelet/certificate/bootstrap LoadClientCert): when the
//! node's kubeconfig is missing or its client certificate has expired, ask the API server for
//! a client certificate with the bootstrap kubeconfig's credential, store it in the certificate
//! store, and write the node's kubeconfig pointing at it.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, bail, Context, Result};
use tracing::{info, warn};

use super::certstore::{CertStore, Credential};
use super::ratelimit::RateLimitLayer;
use super::{csr, kubeconfig};
use crate::tasks::blocking;

/// How long the bootstrap waits for its certificate (kubelet's one hour).
pub const WAIT_LIMIT: Duration = Duration::from_secs(3600);

/// How the node's kubeconfig stands.
enum Existing {
    /// Usable: a current client certificate, or a credential of another kind.
    Usable,
    /// Missing, unreadable or expired: why.
    Unusable(String),
}

/// Check the kubeconfig at `path` as kubelet's isClientConfigStillValid does: it must exist,
/// read, and (unless `any_auth`) hold a client certificate valid now.
fn check(path: &Path, any_auth: bool) -> Existing {
    if !path.exists() {
        return Existing::Unusable("does not exist".into());
    }
    let kc = match kubeconfig::read(path) {
        Ok(kc) => kc,
        Err(e) => return Existing::Unusable(format!("{e:#}")),
    };
    match kubeconfig::client_credential(&kc) {
        Ok(Some(cred)) if cred.valid_at(SystemTime::now()) => Existing::Usable,
        Ok(Some(cred)) => Existing::Unusable(format!(
            "its client certificate is not valid now (valid from {} to {})",
            chrono::DateTime::<chrono::Utc>::from(cred.not_before).to_rfc3339(),
            chrono::DateTime::<chrono::Utc>::from(cred.not_after).to_rfc3339()
        )),
        Ok(None) if any_auth => Existing::Usable,
        Ok(None) => Existing::Unusable("it has no client certificate".into()),
        Err(e) => Existing::Unusable(format!("{e:#}")),
    }
}

/// Make sure the node's kubeconfig (`--kubeconfig`) is usable, bootstrapping a client
/// certificate with `--bootstrap-kubeconfig` when it is not.
pub async fn ensure_kubeconfig(
    kubeconfig_path: &Path,
    bootstrap: Option<&Path>,
    store: &CertStore,
    node: &str,
    limit: &RateLimitLayer,
) -> Result<()> {
    let (path, has_bootstrap) = (kubeconfig_path.to_path_buf(), bootstrap.is_some());
    let existing = blocking(move || Ok(check(&path, !has_bootstrap))).await?;
    let why = match existing {
        Existing::Usable => return Ok(()),
        Existing::Unusable(why) => why,
    };
    let Some(bootstrap) = bootstrap else {
        bail!(
            "--kubeconfig {}: {why}, and there is no --bootstrap-kubeconfig to request a client certificate with",
            kubeconfig_path.display()
        );
    };
    info!(kubeconfig = %kubeconfig_path.display(), "node kubeconfig unusable ({why}); bootstrapping a client certificate");
    bootstrap_certificate(kubeconfig_path, bootstrap, store, node, limit)
        .await
        .with_context(|| {
            format!(
                "--kubeconfig {} ({why}): bootstrapping a client certificate with --bootstrap-kubeconfig {}",
                kubeconfig_path.display(),
                bootstrap.display()
            )
        })
}

async fn bootstrap_certificate(
    kubeconfig_path: &Path,
    bootstrap: &Path,
    store: &CertStore,
    node: &str,
    limit: &RateLimitLayer,
) -> Result<()> {
    let bpath = bootstrap.to_path_buf();
    let bkc = blocking(move || kubeconfig::read(&bpath)).await?;
    let cluster = kubeconfig::current_cluster(&bkc)?;

    // a current certificate already in the store (the kubeconfig was lost, not the
    // certificate): point a new kubeconfig at it without asking again
    let s = store.clone();
    let current = blocking(move || s.current()).await.unwrap_or_else(|e| {
        warn!("reading the current client certificate: {e:#}; requesting a new one");
        None
    });
    if !current.as_ref().is_some_and(|c| c.valid_at(SystemTime::now())) {
        let client = super::build_client(kubeconfig::client_config(bkc, None).await?, limit)?;
        let (s, n) = (store.clone(), node.to_string());
        let key_pem = blocking(move || pending_key(&s)).await?;
        let key = csr::key_from_pem(&key_pem)?;
        let request = csr::node_request(&n, &key)?;
        let name = csr::digested_name(&n, &key);
        let cert = csr::request_certificate(client, Some(&name), &request, WAIT_LIMIT).await?;
        let cred = Credential::new(cert, key_pem.into_bytes()).context("the issued certificate")?;
        let s = store.clone();
        let file = blocking(move || {
            let file = s.update(&cred)?;
            ferrolet_fsutil::remove_file_opt(&s.pending_key_path())?;
            Ok(file)
        })
        .await?;
        info!(csr = %name, file = %file.display(), "client certificate issued and stored");
    }
    let (out, pem): (PathBuf, PathBuf) = (kubeconfig_path.to_path_buf(), store.current_path());
    blocking(move || kubeconfig::write_node_kubeconfig(&out, &cluster, &pem)).await?;
    info!(kubeconfig = %kubeconfig_path.display(), "node kubeconfig written");
    Ok(())
}

/// The key of the request in flight: the one kept from an earlier attempt if there is one,
/// else a fresh one, kept (0600) before it is used.
fn pending_key(store: &CertStore) -> Result<String> {
    let path = store.pending_key_path();
    match std::fs::read_to_string(&path) {
        Ok(pem) if csr::key_from_pem(&pem).is_ok() => return Ok(pem),
        Ok(_) => warn!(file = %path.display(), "unreadable pending key; making a new one"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(anyhow!(e).context(format!("reading {}", path.display()))),
    }
    let pem = csr::new_key()?.serialize_pem();
    ferrolet_fsutil::ensure_private_dir(store.dir())?;
    ferrolet_fsutil::write_atomic_mode(&path, pem.as_bytes(), 0o600)?;
    Ok(pem)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubeclient::certstore::tests::self_signed;

    fn kubeconfig_with(dir: &Path, cert: &str, key: &str) -> PathBuf {
        let pem = dir.join("client.pem");
        std::fs::write(&pem, format!("{cert}{key}")).unwrap();
        let cluster = kube::config::Cluster {
            server: Some("https://127.0.0.1:1".into()),
            ..Default::default()
        };
        let path = dir.join("kubelet.conf");
        kubeconfig::write_node_kubeconfig(&path, &cluster, &pem).unwrap();
        path
    }

    #[test]
    fn a_current_certificate_is_usable_an_expired_one_not() {
        let dir = tempfile::tempdir().unwrap();
        let now = chrono::Utc::now().timestamp();
        let (c, k) = self_signed("system:node:n", now - 60, now + 3600);
        let good = kubeconfig_with(dir.path(), &c, &k);
        assert!(matches!(check(&good, false), Existing::Usable));
        let (c, k) = self_signed("system:node:n", now - 7200, now - 60);
        let expired = kubeconfig_with(dir.path(), &c, &k);
        match check(&expired, false) {
            Existing::Unusable(why) => assert!(why.contains("not valid now"), "{why}"),
            Existing::Usable => panic!("an expired certificate is not usable"),
        }
        match check(&dir.path().join("missing"), true) {
            Existing::Unusable(why) => assert_eq!(why, "does not exist"),
            Existing::Usable => panic!("a missing kubeconfig is not usable"),
        }
    }

    #[tokio::test]
    async fn neither_file_usable_names_both_flags() {
        let dir = tempfile::tempdir().unwrap();
        let store = CertStore::new(dir.path());
        let limit = RateLimitLayer::new(5.0, 10);
        let err = ensure_kubeconfig(&dir.path().join("kubelet.conf"), None, &store, "n", &limit)
            .await
            .unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.contains("--kubeconfig") && msg.contains("--bootstrap-kubeconfig"),
            "{msg}"
        );
        let err = ensure_kubeconfig(
            &dir.path().join("kubelet.conf"),
            Some(&dir.path().join("bootstrap.conf")),
            &store,
            "n",
            &limit,
        )
        .await
        .unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.contains("--kubeconfig") && msg.contains("--bootstrap-kubeconfig"),
            "{msg}"
        );
        assert!(msg.contains("bootstrap.conf"), "{msg}");
    }

    #[test]
    fn pending_key_is_kept_between_attempts() {
        let dir = tempfile::tempdir().unwrap();
        let store = CertStore::new(dir.path());
        let first = pending_key(&store).unwrap();
        assert_eq!(pending_key(&store).unwrap(), first);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(store.pending_key_path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
