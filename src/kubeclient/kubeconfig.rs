//! The node's kubeconfig files: the current context's cluster and client certificate read
//! from one, and the kubeconfig the TLS bootstrap leaves behind (kubelet's
//! writeKubeconfigFromBootstrapping): the bootstrap kubeconfig's server and CA, with the
//! client certificate and key both pointing at the certificate store's current pem.
//! Reading and writing block: call them through `tasks::blocking`.

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use base64::Engine;
use kube::config::{Cluster, Kubeconfig};

use super::certstore::{pem_blocks, Credential};

/// Read a kubeconfig (relative file names in it made absolute).
pub fn read(path: &Path) -> Result<Kubeconfig> {
    Kubeconfig::read_from(path).map_err(|e| anyhow!("{}: {e}", path.display()))
}

/// The current context's cluster.
pub fn current_cluster(kc: &Kubeconfig) -> Result<Cluster> {
    let ctx = current_context(kc)?;
    kc.clusters
        .iter()
        .find(|c| c.name == ctx.cluster)
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| anyhow!("no cluster {:?} (named by the current context)", ctx.cluster))
}

fn current_context(kc: &Kubeconfig) -> Result<kube::config::Context> {
    let name = kc.current_context.clone().unwrap_or_default();
    kc.contexts
        .iter()
        .find(|c| c.name == name)
        .or_else(|| {
            (kc.contexts.len() == 1)
                .then(|| &kc.contexts[0])
                .filter(|_| name.is_empty())
        })
        .and_then(|c| c.context.clone())
        .ok_or_else(|| anyhow!("no context {name:?} (current-context)"))
}

/// The current context's client certificate and key, if it authenticates with one.
pub fn client_credential(kc: &Kubeconfig) -> Result<Option<Credential>> {
    let ctx = current_context(kc)?;
    let Some(user) = ctx.user else {
        return Ok(None);
    };
    let Some(auth) = kc
        .auth_infos
        .iter()
        .find(|a| a.name == user)
        .and_then(|a| a.auth_info.clone())
    else {
        return Err(anyhow!("no user {user:?} (named by the current context)"));
    };
    let data = |inline: Option<&str>, file: Option<&String>, what: &str| -> Result<Option<Vec<u8>>> {
        if let Some(b64) = inline {
            return base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map(Some)
                .with_context(|| format!("{what}-data is not base64"));
        }
        match file {
            Some(f) => std::fs::read(f)
                .map(Some)
                .with_context(|| format!("{what}: reading {f}")),
            None => Ok(None),
        }
    };
    use secrecy::ExposeSecret;
    let cert = data(
        auth.client_certificate_data.as_deref(),
        auth.client_certificate.as_ref(),
        "client-certificate",
    )?;
    let key = data(
        auth.client_key_data.as_ref().map(|k| k.expose_secret()),
        auth.client_key.as_ref(),
        "client-key",
    )?;
    match (cert, key) {
        (None, None) => Ok(None),
        // both may name one file holding both (the store's pem): certificates from the one,
        // the key from the other
        (Some(cert), Some(key)) => {
            let only = |data: &[u8], want: fn(&str) -> bool| -> Vec<u8> {
                pem_blocks(data)
                    .into_iter()
                    .filter(|(label, _)| want(label))
                    .flat_map(|(_, block)| block.into_bytes())
                    .collect()
            };
            let certs = only(&cert, |l| l == "CERTIFICATE");
            let key = only(&key, |l| l.ends_with("PRIVATE KEY"));
            Ok(Some(Credential::new(certs, key).context("client certificate")?))
        }
        (Some(_), None) => Err(anyhow!("client-certificate without client-key")),
        (None, Some(_)) => Err(anyhow!("client-key without client-certificate")),
    }
}

/// The node kubeconfig's text: `cluster`'s server and CA (its data if it has it, else its file,
/// as kubelet writes it), client certificate and key from `pem`.
pub fn node_kubeconfig(cluster: &Cluster, pem: &Path) -> Result<String> {
    let server = cluster
        .server
        .as_deref()
        .ok_or_else(|| anyhow!("the bootstrap kubeconfig's cluster has no server"))?;
    let mut c = serde_json::json!({ "server": server });
    if let Some(data) = &cluster.certificate_authority_data {
        c["certificate-authority-data"] = data.clone().into();
    } else if let Some(file) = &cluster.certificate_authority {
        c["certificate-authority"] = file.clone().into();
    }
    if cluster.insecure_skip_tls_verify == Some(true) {
        c["insecure-skip-tls-verify"] = true.into();
    }
    if let Some(name) = &cluster.tls_server_name {
        c["tls-server-name"] = name.clone().into();
    }
    let pem = pem.to_string_lossy();
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "default-cluster", "cluster": c }],
        "contexts": [{ "name": "default-context", "context": {
            "cluster": "default-cluster", "namespace": "default", "user": "default-auth" } }],
        "current-context": "default-context",
        "users": [{ "name": "default-auth", "user": {
            "client-certificate": pem, "client-key": pem } }],
        "preferences": {},
    });
    serde_saphyr::to_string(&doc).context("encoding the kubeconfig")
}

/// Write the node kubeconfig at `path` atomically (mode 0600, as kubelet writes it).
pub fn write_node_kubeconfig(path: &Path, cluster: &Cluster, pem: &Path) -> Result<()> {
    let text = node_kubeconfig(cluster, pem)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        ferrolet_fsutil::ensure_dir(dir)?;
    }
    ferrolet_fsutil::write_atomic_mode(path, text.as_bytes(), 0o600)
        .with_context(|| format!("writing the kubeconfig {}", path.display()))
}

/// The client settings of kubeconfig `kc` (its current context), with `cred` as the client
/// certificate instead of whatever the kubeconfig names.
pub async fn client_config(kc: Kubeconfig, cred: Option<&Credential>) -> Result<kube::Config> {
    let mut config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| anyhow!("{e}"))?;
    if let Some(cred) = cred {
        let b64 = |d: &[u8]| base64::engine::general_purpose::STANDARD.encode(d);
        let auth = &mut config.auth_info;
        auth.client_certificate = None;
        auth.client_key = None;
        auth.client_certificate_data = Some(b64(&cred.cert_pem));
        auth.client_key_data = Some(secrecy::SecretString::from(b64(&cred.key_pem)));
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubeclient::certstore::tests::self_signed;

    #[test]
    fn written_kubeconfig_points_at_the_store_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let ca_data = base64::engine::general_purpose::STANDARD.encode("CA");
        let bootstrap = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: {ca_data}\ncontexts:\n- name: b\n  context:\n    cluster: k\n    user: t\ncurrent-context: b\nusers:\n- name: t\n  user:\n    token: abc.0123456789abcdef\n"
        );
        let bpath = dir.path().join("bootstrap.kubeconfig");
        std::fs::write(&bpath, bootstrap).unwrap();
        let bkc = read(&bpath).unwrap();
        assert!(
            client_credential(&bkc).unwrap().is_none(),
            "a token is not a certificate"
        );
        let cluster = current_cluster(&bkc).unwrap();

        let (cert, key) = self_signed("system:node:n", 1_000_000_000, 4_000_000_000);
        let pem = dir.path().join("pki/kubelet-client-current.pem");
        std::fs::create_dir_all(pem.parent().unwrap()).unwrap();
        std::fs::write(&pem, format!("{cert}{key}")).unwrap();
        let out = dir.path().join("etc/kubelet.conf");
        write_node_kubeconfig(&out, &cluster, &pem).unwrap();

        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&out).unwrap().permissions().mode() & 0o777, 0o600);
        let kc = read(&out).unwrap();
        let c = current_cluster(&kc).unwrap();
        assert_eq!(c.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert_eq!(c.certificate_authority_data.as_deref(), Some(ca_data.as_str()));
        let user = &kc.auth_infos[0].auth_info.as_ref().unwrap();
        assert_eq!(user.client_certificate.as_deref(), Some(pem.to_str().unwrap()));
        assert_eq!(user.client_key.as_deref(), Some(pem.to_str().unwrap()));
        let cred = client_credential(&kc).unwrap().unwrap();
        assert_eq!(cred.cert_pem, cert.into_bytes());
        assert_eq!(cred.key_pem, key.into_bytes());
    }

    #[test]
    fn ca_file_is_kept_as_a_file() {
        let cluster = Cluster {
            server: Some("https://h:1".into()),
            certificate_authority: Some("/etc/ca.crt".into()),
            ..Default::default()
        };
        let text = node_kubeconfig(&cluster, Path::new("/r/pki/kubelet-client-current.pem")).unwrap();
        assert!(text.contains("certificate-authority: /etc/ca.crt"), "{text}");
        assert!(!text.contains("certificate-authority-data"), "{text}");
    }
}
