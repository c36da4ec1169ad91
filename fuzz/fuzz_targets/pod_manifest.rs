//! A static pod manifest on arbitrary text (anything dropped into, or symlinked into, the
//! manifest directory): decoding, static identity, defaulting and validation must not panic,
//! and every pod that comes out valid must go through what the agent then does with a pod
//! (QoS class, cgroup limits, admission sums, env, ports, bandwidth, /etc/hosts, resolv.conf)
//! without panicking either.
#![no_main]

use ferrolet::config::Config;
use ferrolet::pod::fieldpath::PodFacts;
use ferrolet::pod::manifest::Source;
use ferrolet::podconfig::source::pods_from_manifest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (pods, _errors) = pods_from_manifest(text, &Source::File("/etc/ferrolet/manifests/x.yaml".into()), "node1");
    let cfg = Config {
        resolv_conf: "/nonexistent".into(),
        cluster_dns: vec!["10.96.0.10".parse().unwrap()],
        ..Config::default()
    };
    let facts = PodFacts {
        pod_ips: vec!["10.88.0.2".into()],
        host_ips: vec!["192.0.2.1".into()],
        node_cpu_milli: 2000,
        node_memory: 1 << 30,
        node_ephemeral_storage: 1 << 34,
    };
    for p in pods {
        assert!(
            ferrolet::pod::validation::validate(&p).is_empty(),
            "a returned pod is valid"
        );
        assert!(!ferrolet::pod::uid(&p).is_empty());
        assert!(ferrolet::pod::name(&p).ends_with("-node1"));
        let _ = ferrolet::pod::qos::qos_class(&p);
        let _ = ferrolet::pod::qos::pod_requests(&p, "cpu");
        let _ = ferrolet::pod::qos::pod_requests(&p, "memory");
        let _ = ferrolet::cm::pod_container_manager::PodCgroups::limits_for(&p, &Default::default());
        let _ = ferrolet::pod::validation::unsupported(&p);
        let _ = ferrolet::podsetup::network::port_mappings(&p);
        let _ = ferrolet::podsetup::network::bandwidth(&p);
        let _ = ferrolet::podsetup::dns::hosts_file(&p, &facts.pod_ips, "cluster.local");
        let _ = ferrolet::podsetup::dns::resolv_conf(&p, &cfg);
        for c in ferrolet::pod::all_containers(&p) {
            if let Ok(env) = ferrolet::kuberuntime::env::build(&p, c, &facts, &Default::default()) {
                let _ = ferrolet::pod::expansion::expand_all(c.command.as_deref().unwrap_or(&[]), &env);
                for m in c.volume_mounts.iter().flatten() {
                    if let Some(e) = m.sub_path_expr.as_deref() {
                        if let Ok(sp) = ferrolet::volumemanager::volumes::expand_sub_path(e, &env) {
                            assert!(!sp.starts_with('/') && !sp.split('/').any(|x| x == ".."), "{sp}");
                        }
                    }
                }
            }
        }
    }
});
