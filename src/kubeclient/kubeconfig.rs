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

/// Read a kubeconfig as client-go reads one: YAML or JSON, its documents merged (the first to
/// set a value wins), relative file names in it made absolute against its directory. Decoded
/// by the agent's YAML reader and JSON decoders rather than kube's `Kubeconfig::read_from`,
/// whose YAML decoder of kube's types weighs 0.3 MB in the binary (docs/static-build.md).
pub fn read(path: &Path) -> Result<Kubeconfig> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse(&text, path.parent()).with_context(|| path.display().to_string())
}

fn parse(text: &str, dir: Option<&Path>) -> Result<Kubeconfig> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let docs = crate::pod::manifest::yaml_documents(text).map_err(|e| anyhow!(e))?;
    let mut merged: Option<Kubeconfig> = None;
    for (i, doc) in docs.iter().enumerate().filter(|(_, d)| !d.is_null()) {
        let mut kc: Kubeconfig =
            ferrolet_fsutil::json::decode_value(doc).map_err(|e| anyhow!("document {}: {e}", i + 1))?;
        if let Some(dir) = dir.filter(|d| !d.as_os_str().is_empty()) {
            make_files_absolute(&mut kc, dir);
        }
        merged = Some(match merged {
            Some(m) => m.merge(kc)?,
            None => kc,
        });
    }
    Ok(merged.unwrap_or_default())
}

/// The files a kubeconfig names relative to its own directory, as client-go resolves them
/// (ResolveLocalPaths): the CA, client certificate and key, token file, and an exec plugin's
/// command when it has a path separator (a bare name is looked up in PATH).
fn make_files_absolute(kc: &mut Kubeconfig, dir: &Path) {
    let absolute = |f: &mut Option<String>| {
        if let Some(name) = f.as_deref().filter(|n| !n.is_empty() && Path::new(n).is_relative()) {
            if let Some(joined) = dir.join(name).to_str() {
                *f = Some(joined.to_string());
            }
        }
    };
    for c in kc.clusters.iter_mut().filter_map(|n| n.cluster.as_mut()) {
        absolute(&mut c.certificate_authority);
    }
    for a in kc.auth_infos.iter_mut().filter_map(|n| n.auth_info.as_mut()) {
        absolute(&mut a.client_certificate);
        absolute(&mut a.client_key);
        absolute(&mut a.token_file);
        if let Some(exec) = a.exec.as_mut() {
            if exec.command.as_deref().is_some_and(|c| c.contains('/')) {
                absolute(&mut exec.command);
            }
        }
    }
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
    fn documents_merge_first_wins_and_relative_files_become_absolute() {
        let text = "\u{feff}apiVersion: v1\nkind: Config\ncurrent-context: a\nclusters:\n- name: k\n  cluster:\n    server: https://one:6443\n    certificate-authority: pki/ca.crt\nusers:\n- name: u\n  user:\n    client-certificate: u.crt\n    client-key: /abs/u.key\n    tokenFile: ../t\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: bin/cred\n- name: v\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: cred\n---\n{\"current-context\": \"b\", \"clusters\": [{\"name\": \"k\", \"cluster\": {\"server\": \"https://two:6443\"}}, {\"name\": \"l\", \"cluster\": {\"server\": \"https://three:6443\"}}]}\n";
        let kc = parse(text, Some(Path::new("/etc/kube"))).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("a"));
        let servers: Vec<_> = kc
            .clusters
            .iter()
            .map(|c| c.cluster.as_ref().unwrap().server.clone().unwrap())
            .collect();
        assert_eq!(servers, ["https://one:6443", "https://three:6443"]);
        let c = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(c.certificate_authority.as_deref(), Some("/etc/kube/pki/ca.crt"));
        let u = kc.auth_infos[0].auth_info.as_ref().unwrap();
        assert_eq!(u.client_certificate.as_deref(), Some("/etc/kube/u.crt"));
        assert_eq!(u.client_key.as_deref(), Some("/abs/u.key"));
        assert_eq!(u.token_file.as_deref(), Some("/etc/kube/../t"));
        assert_eq!(u.exec.as_ref().unwrap().command.as_deref(), Some("/etc/kube/bin/cred"));
        let v = kc.auth_infos[1].auth_info.as_ref().unwrap();
        assert_eq!(
            v.exec.as_ref().unwrap().command.as_deref(),
            Some("cred"),
            "a bare command is looked up in PATH"
        );
        assert_eq!(parse("", None).unwrap().clusters.len(), 0);
    }

    #[test]
    fn bad_kubeconfigs_name_the_field_and_never_quote_the_file() {
        let e = parse("clusters:\n- name: k\n  cluster:\n    server: [1]\n", None).unwrap_err();
        assert_eq!(
            format!("{e:#}"),
            "document 1: clusters[0].cluster.server: invalid type: sequence, expected a string"
        );
        let e = parse(
            "users:\n- name: u\n  user:\n    client-key-data: \"c2VjcmV0\n  - x: [\n",
            None,
        )
        .unwrap_err();
        let e = format!("{e:#}");
        assert!(e.starts_with("invalid YAML"), "{e}");
        assert!(!e.contains("c2VjcmV0"), "{e}");
        let e = parse("kind: Config\n---\nkind: Other\n", None).unwrap_err();
        assert!(format!("{e:#}").contains("kind"), "{e:#}");
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
