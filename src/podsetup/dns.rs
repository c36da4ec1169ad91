//! The files kubelet writes for every pod (its network/dns configurer and hosts file) and mounts into its containers: /etc/hosts (pod IP
//! and hostname, hostAliases; the node's file for hostNetwork pods), /etc/resolv.conf by
//! dnsPolicy, and /etc/hostname.

use std::path::Path;

use k8s_openapi::api::core::v1::Pod;

use crate::config::Config;
use crate::pod;

/// The pod's hostname: spec.hostname, else the pod name cut to 63 characters.
pub fn hostname(p: &Pod) -> String {
    let spec = pod::spec(p);
    if pod::host_network(p) {
        return nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_default();
    }
    match spec.hostname.as_deref().filter(|h| !h.is_empty()) {
        Some(h) => h.to_string(),
        None => {
            let n = pod::name(p);
            n[..n.len().min(63)].trim_end_matches(['-', '.']).to_string()
        }
    }
}

/// kubelet's hostnameMaxLen: the longest FQDN a pod's hostname may be.
const FQDN_MAX: usize = 64;

/// The hostname the pod's UTS namespace gets: [`hostname`], or with `setHostnameAsFQDN` and a
/// subdomain the FQDN `<hostname>.<subdomain>.<namespace>.svc.<clusterDomain>`, which must fit
/// in 64 characters (kubelet's error when it does not: the sandbox is not made).
pub fn uts_hostname(p: &Pod, cluster_domain: &str) -> Result<String, String> {
    let host = hostname(p);
    let spec = pod::spec(p);
    if pod::host_network(p) || spec.set_hostname_as_fqdn != Some(true) {
        return Ok(host);
    }
    let Some(sub) = spec.subdomain.as_deref().filter(|s| !s.is_empty()) else {
        return Ok(host);
    };
    let fqdn = format!("{host}.{sub}.{}.svc.{cluster_domain}", pod::namespace(p));
    if fqdn.len() > FQDN_MAX {
        return Err(format!(
            "failed to construct FQDN from pod hostname and cluster domain, FQDN {fqdn} is too long ({FQDN_MAX} characters is the max, {} characters requested)",
            fqdn.len()
        ));
    }
    Ok(fqdn)
}

/// [`uts_hostname`] where it is known to fit (the pod worker makes no sandbox otherwise):
/// the short hostname stands in for an FQDN too long.
pub fn uts_hostname_or_short(p: &Pod, cluster_domain: &str) -> String {
    uts_hostname(p, cluster_domain).unwrap_or_else(|_| hostname(p))
}

pub fn hosts_file(p: &Pod, pod_ips: &[String], cluster_domain: &str) -> String {
    let mut s = String::new();
    if pod::host_network(p) {
        s.push_str("# Kubernetes-managed hosts file (host network).\n");
        s.push_str(&std::fs::read_to_string("/etc/hosts").unwrap_or_default());
        if !s.ends_with('\n') {
            s.push('\n');
        }
    } else {
        s.push_str("# Kubernetes-managed hosts file.\n");
        s.push_str("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n");
        let host = hostname(p);
        let spec = pod::spec(p);
        let names = match spec.subdomain.as_deref().filter(|s| !s.is_empty()) {
            Some(sub) => format!("{host}.{sub}.{}.svc.{cluster_domain}\t{host}", pod::namespace(p)),
            None => host,
        };
        for ip in pod_ips {
            s.push_str(&format!("{ip}\t{names}\n"));
        }
    }
    let aliases = pod::spec(p).host_aliases.clone().unwrap_or_default();
    if !aliases.is_empty() {
        s.push_str("\n# Entries added by HostAliases.\n");
        for a in aliases {
            let names = a.hostnames.unwrap_or_default().join("\t");
            s.push_str(&format!("{}\t{names}\n", a.ip));
        }
    }
    s
}

#[derive(Debug, Default, PartialEq)]
pub struct ResolvConf {
    pub nameservers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

impl ResolvConf {
    pub fn parse(s: &str) -> ResolvConf {
        let mut r = ResolvConf::default();
        for line in s.lines() {
            let mut f = line.split_whitespace();
            match f.next() {
                Some("nameserver") => r.nameservers.extend(f.next().map(str::to_string)),
                Some("search") | Some("domain") => r.searches = f.map(str::to_string).collect(),
                Some("options") => r.options.extend(f.map(str::to_string)),
                _ => {}
            }
        }
        r
    }

    pub fn render(&self) -> String {
        let mut s = String::new();
        for n in &self.nameservers {
            s.push_str(&format!("nameserver {n}\n"));
        }
        if !self.searches.is_empty() {
            s.push_str(&format!("search {}\n", self.searches.join(" ")));
        }
        if !self.options.is_empty() {
            s.push_str(&format!("options {}\n", self.options.join(" ")));
        }
        s
    }
}

/// The pod's resolv.conf by dnsPolicy (kubelet's GetPodDNS): ClusterFirst uses clusterDNS and
/// the cluster search path, falling back to the node's file when no cluster DNS is configured
/// (as kubelet does); Default copies the node's; None uses dnsConfig alone; dnsConfig is
/// merged last.
pub fn resolv_conf(p: &Pod, cfg: &Config) -> String {
    let spec = pod::spec(p);
    let node = ResolvConf::parse(&std::fs::read_to_string(&cfg.resolv_conf).unwrap_or_default());
    let policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    let host_net = pod::host_network(p);
    let cluster = match policy {
        "ClusterFirstWithHostNet" => true,
        "ClusterFirst" => !host_net,
        _ => false,
    };
    let mut r = if policy == "None" {
        ResolvConf::default()
    } else if cluster && !cfg.cluster_dns.is_empty() {
        let d = &cfg.cluster_domain;
        let ns = pod::namespace(p);
        let mut searches = vec![format!("{ns}.svc.{d}"), format!("svc.{d}"), d.clone()];
        searches.extend(node.searches.iter().cloned());
        ResolvConf {
            nameservers: cfg.cluster_dns.iter().map(|i| i.to_string()).collect(),
            searches,
            options: vec!["ndots:5".into()],
        }
    } else {
        node
    };
    if let Some(dc) = &spec.dns_config {
        for n in dc.nameservers.iter().flatten() {
            if !r.nameservers.contains(n) {
                r.nameservers.push(n.clone());
            }
        }
        for s in dc.searches.iter().flatten() {
            if !r.searches.contains(s) {
                r.searches.push(s.clone());
            }
        }
        for o in dc.options.iter().flatten() {
            let opt = match &o.value {
                Some(v) => format!("{}:{v}", o.name.clone().unwrap_or_default()),
                None => o.name.clone().unwrap_or_default(),
            };
            let key = opt.split(':').next().unwrap_or("").to_string();
            r.options.retain(|x| x.split(':').next() != Some(key.as_str()));
            r.options.push(opt);
        }
    }
    r.nameservers.truncate(3);
    r.searches.truncate(32);
    r.render()
}

/// Write the three files (`etc-hosts`, `resolv.conf`, `hostname`) under `dir`, each only when
/// its content changed. They are made from the pod and the node's config on every sync, so they
/// are replaced atomically but not fsynced: whatever a power loss leaves is rewritten by the
/// next sync.
pub fn write_files(dir: &Path, p: &Pod, pod_ips: &[String], cfg: &Config) -> anyhow::Result<()> {
    use anyhow::Context;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let w = |name: &str, data: String| -> ferrolet_fsutil::Result<()> {
        let path = dir.join(name);
        if std::fs::read(&path).is_ok_and(|old| old == data.as_bytes()) {
            return Ok(());
        }
        ferrolet_fsutil::write_atomic_unsynced(&path, data.as_bytes())
    };
    w("etc-hosts", hosts_file(p, pod_ips, &cfg.cluster_domain))?;
    w("resolv.conf", resolv_conf(p, cfg))?;
    let host = uts_hostname_or_short(p, &cfg.cluster_domain);
    w("hostname", format!("{host}\n"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata":{"name":"web-node1","namespace":"ns"},"spec":spec}))
            .unwrap()
    }

    #[test]
    fn hosts_has_ip_hostname_and_aliases() {
        let p = pod(serde_json::json!({"containers":[],"hostname":"h","subdomain":"s",
            "hostAliases":[{"ip":"1.2.3.4","hostnames":["a","b"]}]}));
        let h = hosts_file(&p, &["10.88.0.2".into()], "cluster.local");
        assert!(h.contains("10.88.0.2\th.s.ns.svc.cluster.local\th\n"), "{h}");
        assert!(h.contains("1.2.3.4\ta\tb\n"), "{h}");
    }

    #[test]
    fn cluster_first_and_none() {
        let mut cfg = Config {
            resolv_conf: "/nonexistent".into(),
            ..Default::default()
        };
        let p = pod(serde_json::json!({"containers":[]}));
        assert_eq!(resolv_conf(&p, &cfg), "", "no cluster DNS and no node file");
        cfg.cluster_dns = vec!["10.96.0.10".parse().unwrap()];
        let r = resolv_conf(&p, &cfg);
        assert!(
            r.contains("nameserver 10.96.0.10")
                && r.contains("search ns.svc.cluster.local svc.cluster.local cluster.local")
                && r.contains("ndots:5"),
            "{r}"
        );
        let p = pod(
            serde_json::json!({"containers":[],"dnsPolicy":"None","dnsConfig":{"nameservers":["9.9.9.9"],"searches":["x"],"options":[{"name":"ndots","value":"2"}]}}),
        );
        assert_eq!(resolv_conf(&p, &cfg), "nameserver 9.9.9.9\nsearch x\noptions ndots:2\n");
    }

    #[test]
    fn files_are_rewritten_only_when_they_change() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            resolv_conf: "/nonexistent".into(),
            ..Default::default()
        };
        let p = pod(serde_json::json!({"containers":[]}));
        let ino = |n: &str| std::fs::metadata(dir.path().join(n)).unwrap().ino();
        write_files(dir.path(), &p, &["10.88.0.2".into()], &cfg).unwrap();
        let (hosts, name) = (ino("etc-hosts"), ino("hostname"));
        write_files(dir.path(), &p, &["10.88.0.2".into()], &cfg).unwrap();
        assert_eq!(
            (ino("etc-hosts"), ino("hostname")),
            (hosts, name),
            "unchanged: left alone"
        );
        write_files(dir.path(), &p, &["10.88.0.3".into()], &cfg).unwrap();
        assert_ne!(ino("etc-hosts"), hosts, "a new pod IP replaces the hosts file");
        assert_eq!(ino("hostname"), name);
        let h = std::fs::read_to_string(dir.path().join("etc-hosts")).unwrap();
        assert!(h.contains("10.88.0.3\tweb-node1"), "{h}");
    }

    #[test]
    fn hostname_defaults_to_pod_name() {
        assert_eq!(hostname(&pod(serde_json::json!({"containers":[]}))), "web-node1");
    }
}
