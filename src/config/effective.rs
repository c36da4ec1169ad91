//! The effective configuration as a KubeletConfiguration (kubelet.config.k8s.io/v1beta1 JSON
//! field names), for `/configz`: every setting ([`super::settings`]) with a
//! file field, with the value in force after defaults, the file and the flags, and the
//! mode-dependent defaults resolved. Durations are written as Go writes them (`2m0s`),
//! quantities as strings, integers as integers.

use serde_json::{Map, Value};

use super::settings::SETTINGS;
use super::Config;

/// `cfg` as KubeletConfiguration JSON.
pub fn kubelet_configuration(cfg: &Config) -> Value {
    let cfg = cfg.resolved();
    let mut root = Map::new();
    // ferrolet manages cgroups through cgroupfs only.
    root.insert("cgroupDriver".into(), "cgroupfs".into());
    for s in SETTINGS.iter() {
        let Some(json) = s.json else { continue };
        if s.has("quiet") {
            continue;
        }
        // The objects on the way exist even when the field is unset (`"x509": {}`), as
        // kubelet's.
        let mut parts: Vec<&str> = json.split('.').collect();
        let leaf = parts.pop().unwrap_or_default();
        let mut m = &mut root;
        for p in parts {
            let next = m.entry(p).or_insert_with(|| Value::Object(Map::new()));
            m = match next {
                Value::Object(o) => o,
                // settings::tests::names_are_unique rules this out.
                _ => unreachable!("{json}: {p} is a setting and an object"),
            };
        }
        // kubelet's JSON leaves unset optional fields out.
        match (s.show)(&cfg) {
            Value::Null => {}
            v => {
                m.insert(leaf.into(), v);
            }
        }
    }
    Value::Object(root)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn run_once_and_the_log_link_dir_are_shown() {
        let v = kubelet_configuration(&Config::default());
        assert_eq!(v["runOnce"], false);
        // kubelet's int32, never 50.0
        assert!(v["kubeAPIQPS"].is_i64(), "{}", v["kubeAPIQPS"]);
        assert_eq!(v["ferrolet"]["containerLogLinkDir"], "/var/log/containers");
    }

    #[test]
    fn fields_use_kubelet_names_and_resolved_defaults() {
        let cfg = Config::default();
        let v = kubelet_configuration(&cfg);
        assert_eq!(v["port"], 10250);
        assert_eq!(v["healthzPort"], 10248);
        assert_eq!(v["enableDebuggingHandlers"], true);
        assert_eq!(
            v["authentication"]["webhook"]["enabled"], false,
            "standalone: no token review"
        );
        assert_eq!(v["authentication"]["webhook"]["cacheTTL"], "2m0s");
        assert_eq!(v["authorization"]["mode"], "AlwaysAllow");
        assert_eq!(v["authorization"]["webhook"]["cacheAuthorizedTTL"], "5m0s");
        assert_eq!(v["authorization"]["webhook"]["cacheUnauthorizedTTL"], "30s");
        assert_eq!(v["evictionHard"]["nodefs.available"], "10%");
        assert_eq!(v["tlsMinVersion"], "VersionTLS12");
        assert_eq!(v["serializeImagePulls"], true);
        assert_eq!(v["registryPullQPS"], 5);
        assert_eq!(v["registryBurst"], 10);
        assert_eq!(v["imageGCHighThresholdPercent"], 85);
        assert_eq!(v["imageGCLowThresholdPercent"], 80);
        assert_eq!(v["imageMinimumGCAge"], "2m0s");
        assert_eq!(v["nodeStatusMaxImages"], 50);
        assert!(v.get("maxParallelImagePulls").is_none());
        assert_eq!(v["ferrolet"]["registryConfigFile"], "/var/lib/ferrolet/registries.yaml");
        assert_eq!(v["ferrolet"]["imagePullProgressTimeout"], "1m0s");
        assert!(v.get("tlsCertFile").is_none());
        assert_eq!(v["authentication"]["x509"], json!({}));
        let mut cluster = Config::default();
        cluster.cluster.kubeconfig = Some("/etc/kubelet.conf".into());
        let v = kubelet_configuration(&cluster);
        assert_eq!(v["authentication"]["webhook"]["enabled"], true);
        assert_eq!(v["authorization"]["mode"], "Webhook");
    }
}
