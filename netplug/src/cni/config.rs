//! CNI network configuration: finding and parsing the config file, and building what each plugin
//! gets on stdin (the plugin's own config with `name`, `cniVersion`, `runtimeConfig` and
//! `prevResult` injected, as CNI spec 1.0.0 section "Execution of Network Configurations"
//! describes).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use crate::error::{p, Context, Error, Result};
use crate::types::{Protocol, SandboxNetwork};

/// Config versions this runtime can drive (results of these share one shape: `ips`,
/// `interfaces`, `routes`, `dns`).
pub(crate) const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0"];

/// One plugin of a list.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PluginConf {
    /// `type`: the plugin binary's name.
    pub plugin_type: String,
    /// Capabilities the plugin declares (`"capabilities": {"portMappings": true}`).
    pub capabilities: BTreeSet<String>,
    /// The plugin's config object as written.
    pub raw: Map<String, Value>,
}

/// A network configuration list (a single-plugin `.conf` is wrapped into one).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NetConfList {
    pub file: PathBuf,
    pub name: String,
    pub cni_version: String,
    pub disable_check: bool,
    pub plugins: Vec<PluginConf>,
}

impl NetConfList {
    /// The list as JSON (what is cached with a result, and re-parsed for DEL).
    pub(crate) fn to_value(&self) -> Value {
        json!({
            "cniVersion": self.cni_version,
            "name": self.name,
            "disableCheck": self.disable_check,
            "plugins": self.plugins.iter().map(|p| Value::Object(p.raw.clone())).collect::<Vec<_>>(),
        })
    }

    /// Parse the contents of a config file; `.conflist` is a list, anything else a single
    /// plugin config. Errors name the file and the field.
    pub(crate) fn parse(file: &Path, data: &[u8]) -> Result<Self> {
        let v: Value =
            serde_json::from_slice(data).map_err(|e| Error::cni_config(file, format!("invalid JSON: {e}")))?;
        let obj = v
            .as_object()
            .ok_or_else(|| Error::cni_config(file, "top level is not a JSON object"))?;
        let is_list = file.extension().and_then(|e| e.to_str()) == Some("conflist") || obj.contains_key("plugins");
        let name = str_field(file, obj, "name")?;
        let cni_version = str_field(file, obj, "cniVersion")?;
        if !SUPPORTED_VERSIONS.contains(&cni_version.as_str()) {
            return Err(Error::cni_config(
                file,
                format!(
                    "cniVersion {cni_version:?} is not supported (supported: {})",
                    SUPPORTED_VERSIONS.join(", ")
                ),
            ));
        }
        let disable_check = obj.get("disableCheck").and_then(Value::as_bool).unwrap_or(false);
        let raw_plugins: Vec<Value> = if is_list {
            obj.get("plugins")
                .and_then(Value::as_array)
                .cloned()
                .ok_or_else(|| Error::cni_config(file, "field \"plugins\": missing or not an array"))?
        } else {
            vec![v.clone()]
        };
        if raw_plugins.is_empty() {
            return Err(Error::cni_config(file, "field \"plugins\": empty"));
        }
        let mut plugins = Vec::new();
        for (i, rp) in raw_plugins.into_iter().enumerate() {
            let where_ = if is_list {
                format!("plugins[{i}]")
            } else {
                "config".into()
            };
            let Value::Object(raw) = rp else {
                return Err(Error::cni_config(file, format!("{where_}: not a JSON object")));
            };
            let plugin_type = match raw.get("type") {
                Some(Value::String(t)) if !t.is_empty() => t.clone(),
                _ => {
                    return Err(Error::cni_config(
                        file,
                        format!("{where_}: field \"type\" missing or not a non-empty string"),
                    ))
                }
            };
            if plugin_type.contains('/') || plugin_type.starts_with('.') {
                return Err(Error::cni_config(
                    file,
                    format!("{where_}: type {plugin_type:?} is not a plain plugin name"),
                ));
            }
            let capabilities = match raw.get("capabilities") {
                None => BTreeSet::new(),
                Some(Value::Object(caps)) => caps
                    .iter()
                    .filter(|(_, v)| v.as_bool() == Some(true))
                    .map(|(k, _)| k.clone())
                    .collect(),
                Some(_) => {
                    return Err(Error::cni_config(
                        file,
                        format!("{where_}: field \"capabilities\" is not an object"),
                    ))
                }
            };
            plugins.push(PluginConf {
                plugin_type,
                capabilities,
                raw,
            });
        }
        Ok(NetConfList {
            file: file.to_path_buf(),
            name,
            cni_version,
            disable_check,
            plugins,
        })
    }

    /// Load the lexically first `*.conflist`, `*.conf` or `*.json` of `dir`.
    pub(crate) fn load_dir(dir: &Path) -> Result<Self> {
        let rd = std::fs::read_dir(dir).with_context(|| format!("reading CNI config dir {}", p(dir)))?;
        let mut files: Vec<PathBuf> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|f| {
                f.is_file()
                    && matches!(
                        f.extension().and_then(|e| e.to_str()),
                        Some("conflist") | Some("conf") | Some("json")
                    )
            })
            .collect();
        files.sort();
        let file = files.into_iter().next().ok_or_else(|| Error::CniConfig {
            file: p(dir),
            reason: "no network config (*.conflist, *.conf, *.json) in the directory".into(),
        })?;
        let data = std::fs::read(&file).with_context(|| format!("reading {}", p(&file)))?;
        Self::parse(&file, &data)
    }

    /// Whether the config's version knows the CHECK command (0.4.0 and later).
    pub(crate) fn supports_check(&self) -> bool {
        !self.cni_version.starts_with("0.3.")
    }
}

fn str_field(file: &Path, obj: &Map<String, Value>, key: &str) -> Result<String> {
    match obj.get(key) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(_) => Err(Error::cni_config(
            file,
            format!("field {key:?}: not a non-empty string"),
        )),
        None => Err(Error::cni_config(file, format!("field {key:?}: missing"))),
    }
}

/// The runtime's values for the well-known capabilities (only those it has).
pub(crate) fn capability_args(req: &SandboxNetwork) -> Map<String, Value> {
    let mut caps = Map::new();
    if !req.port_mappings.is_empty() {
        let pms: Vec<Value> = req
            .port_mappings
            .iter()
            .map(|pm| {
                let mut o = json!({
                    "hostPort": pm.host_port,
                    "containerPort": pm.container_port,
                    "protocol": match pm.protocol { Protocol::Tcp => "tcp", Protocol::Udp => "udp", Protocol::Sctp => "sctp" },
                });
                if let Some(ip) = pm.effective_host_ip() {
                    o["hostIP"] = json!(ip.to_string());
                }
                o
            })
            .collect();
        caps.insert("portMappings".into(), Value::Array(pms));
    }
    if let Some(bw) = &req.bandwidth {
        let mut o = Map::new();
        if bw.ingress_rate > 0 {
            o.insert("ingressRate".into(), json!(bw.ingress_rate));
            o.insert("ingressBurst".into(), json!(bw.ingress_burst));
        }
        if bw.egress_rate > 0 {
            o.insert("egressRate".into(), json!(bw.egress_rate));
            o.insert("egressBurst".into(), json!(bw.egress_burst));
        }
        if !o.is_empty() {
            caps.insert("bandwidth".into(), Value::Object(o));
        }
    }
    if !req.requested_ips.is_empty() {
        caps.insert(
            "ips".into(),
            Value::Array(req.requested_ips.iter().map(|ip| json!(ip.to_string())).collect()),
        );
    }
    caps
}

/// `CNI_ARGS` for a pod, as kubelet passes them.
pub(crate) fn cni_args(req: &SandboxNetwork) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={}",
        req.pod_namespace, req.pod_name, req.sandbox_id, req.pod_uid
    )
}

/// What `plugin` reads on stdin: its config with the list's `name` and `cniVersion`, a
/// `runtimeConfig` holding the capability args it declared (and only those), and `prevResult`.
pub(crate) fn plugin_stdin(
    list: &NetConfList,
    plugin: &PluginConf,
    caps: &Map<String, Value>,
    prev_result: Option<&Value>,
) -> Value {
    let mut obj = plugin.raw.clone();
    obj.insert("name".into(), json!(list.name));
    obj.insert("cniVersion".into(), json!(list.cni_version));
    let rc: Map<String, Value> = caps
        .iter()
        .filter(|(k, _)| plugin.capabilities.contains(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !rc.is_empty() {
        obj.insert("runtimeConfig".into(), Value::Object(rc));
    } else {
        obj.remove("runtimeConfig");
    }
    match prev_result {
        Some(prev) => {
            obj.insert("prevResult".into(), prev.clone());
        }
        None => {
            obj.remove("prevResult");
        }
    }
    Value::Object(obj)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Bandwidth, PortMapping};

    const LIST: &str = r#"{
        "cniVersion": "1.0.0",
        "name": "podnet",
        "plugins": [
            {"type": "bridge", "bridge": "cni0", "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.22.0.0/16"}]]}},
            {"type": "portmap", "capabilities": {"portMappings": true, "bandwidth": false}},
            {"type": "bandwidth", "capabilities": {"bandwidth": true}}
        ]
    }"#;

    fn list() -> NetConfList {
        NetConfList::parse(Path::new("/etc/cni/net.d/10-pod.conflist"), LIST.as_bytes()).unwrap()
    }

    fn req() -> SandboxNetwork {
        let mut r = SandboxNetwork::new("abc", "/run/netns/x");
        r.pod_name = "web".into();
        r.pod_namespace = "default".into();
        r.pod_uid = "u-1".into();
        r.port_mappings = vec![PortMapping {
            host_port: 8080,
            container_port: 80,
            protocol: Protocol::Tcp,
            host_ip: Some("192.0.2.1".parse().unwrap()),
        }];
        r.bandwidth = Some(Bandwidth {
            ingress_rate: 1000,
            ingress_burst: 2000,
            egress_rate: 0,
            egress_burst: 0,
        });
        r
    }

    #[test]
    fn parses_a_list() {
        let l = list();
        assert_eq!(l.name, "podnet");
        assert_eq!(l.plugins.len(), 3);
        assert_eq!(l.plugins[1].plugin_type, "portmap");
        assert_eq!(
            l.plugins[1].capabilities.iter().collect::<Vec<_>>(),
            vec!["portMappings"]
        );
        assert!(l.supports_check());
        // round trip through the cached form
        let again = NetConfList::parse(&l.file, l.to_value().to_string().as_bytes()).unwrap();
        assert_eq!(again, l);
    }

    #[test]
    fn wraps_a_single_conf() {
        let conf = r#"{"cniVersion": "0.3.1", "name": "one", "type": "bridge", "bridge": "br0"}"#;
        let l = NetConfList::parse(Path::new("/x/10-one.conf"), conf.as_bytes()).unwrap();
        assert_eq!(l.plugins.len(), 1);
        assert_eq!(l.plugins[0].plugin_type, "bridge");
        assert_eq!(l.plugins[0].raw["bridge"], "br0");
        assert!(!l.supports_check());
    }

    #[test]
    fn errors_name_file_and_field() {
        let f = Path::new("/x/bad.conflist");
        let e = NetConfList::parse(f, b"{ not json").unwrap_err().to_string();
        assert!(e.starts_with("CNI config /x/bad.conflist: invalid JSON"), "{e}");
        let e = NetConfList::parse(f, br#"{"cniVersion":"1.0.0","plugins":[]}"#)
            .unwrap_err()
            .to_string();
        assert_eq!(e, "CNI config /x/bad.conflist: field \"name\": missing");
        let e = NetConfList::parse(
            f,
            br#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"a"},{"x":1}]}"#,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "CNI config /x/bad.conflist: plugins[1]: field \"type\" missing or not a non-empty string"
        );
        let e = NetConfList::parse(f, br#"{"cniVersion":"9.9.9","name":"n","plugins":[{"type":"a"}]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cniVersion \"9.9.9\" is not supported"), "{e}");
        let e = NetConfList::parse(f, br#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"../x"}]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a plain plugin name"), "{e}");
    }

    #[test]
    fn injection_only_declared_capabilities() {
        let l = list();
        let caps = capability_args(&req());
        let prev = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.22.0.5/16"}]});
        let bridge = plugin_stdin(&l, &l.plugins[0], &caps, None);
        assert_eq!(bridge["name"], "podnet");
        assert_eq!(bridge["cniVersion"], "1.0.0");
        assert!(bridge.get("runtimeConfig").is_none());
        assert!(bridge.get("prevResult").is_none());
        assert_eq!(bridge["ipam"]["type"], "host-local");

        let portmap = plugin_stdin(&l, &l.plugins[1], &caps, Some(&prev));
        assert_eq!(
            portmap["runtimeConfig"],
            json!({"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": "192.0.2.1"}]})
        );
        assert_eq!(portmap["prevResult"], prev);

        let bw = plugin_stdin(&l, &l.plugins[2], &caps, Some(&prev));
        assert_eq!(
            bw["runtimeConfig"],
            json!({"bandwidth": {"ingressRate": 1000, "ingressBurst": 2000}})
        );
    }

    #[test]
    fn cni_args_as_kubelet() {
        assert_eq!(
            cni_args(&req()),
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1"
        );
    }

    #[test]
    fn load_dir_takes_the_lexically_first() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("20-b.conflist"), LIST).unwrap();
        std::fs::write(
            dir.path().join("10-a.conf"),
            r#"{"cniVersion":"1.0.0","name":"a","type":"loopback"}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("00-ignored.txt"), "x").unwrap();
        let l = NetConfList::load_dir(dir.path()).unwrap();
        assert_eq!(l.name, "a");
        let empty = tempfile::tempdir().unwrap();
        let e = NetConfList::load_dir(empty.path()).unwrap_err().to_string();
        assert!(e.contains("no network config"), "{e}");
    }
}
