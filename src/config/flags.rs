//! `ferrolet run`'s flags, named as kubelet names them, and how they apply over the
//! configuration file and the defaults. The flags are those of the settings table
//! ([`super::settings`]): each setting with a flag name is an argument here, shaped by its
//! codec. An unset flag leaves the value alone; a bad value is an error naming the flag.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Arg, ArgMatches, Args, Command, FromArgMatches};

use super::settings::SETTINGS;
use super::Config;

/// Flags named as kubelet names them. Unset flags leave the config file's (or the default)
/// value alone.
#[derive(Args, Debug, Default)]
pub struct RunFlags {
    /// KubeletConfiguration file (kubelet.config.k8s.io/v1beta1).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Every setting's flag, from the settings table.
    #[command(flatten)]
    pub settings: SettingFlags,
}

/// The settings' flags as given: each flag's values (all occurrences), in table order.
#[derive(Debug, Default, Clone)]
pub struct SettingFlags {
    given: Vec<(&'static str, Vec<String>)>,
}

impl SettingFlags {
    /// Whether `--flag` was given.
    pub fn given(&self, flag: &str) -> bool {
        self.given.iter().any(|(f, _)| *f == flag)
    }
}

/// `ferrolet run --help` in sections, as a person looks for a flag: each flag's section.
/// A flag no section names is under "Other" (the test below keeps that empty).
const HEADINGS: &[(&str, &[&str])] = &[
    (
        "Node and state",
        &[
            "hostname-override",
            "root-dir",
            "v",
            "runonce",
            "node-ip",
            "fail-swap-on",
            "oom-score-adj",
        ],
    ),
    (
        "Static pods (no control plane needed)",
        &[
            "pod-manifest-path",
            "manifest-url",
            "manifest-url-header",
            "file-check-frequency",
            "http-check-frequency",
        ],
    ),
    (
        "Joining a cluster",
        &[
            "kubeconfig",
            "bootstrap-kubeconfig",
            "rotate-certificates",
            "register-node",
            "register-with-taints",
            "node-labels",
            "node-status-update-frequency",
            "node-status-max-images",
            "kube-api-qps",
            "kube-api-burst",
            "event-qps",
            "event-burst",
        ],
    ),
    (
        "Pods and containers",
        &[
            "sync-frequency",
            "max-pods",
            "sandbox-pool",
            "pod-max-pids",
            "runtime-request-timeout",
            "allowed-unsafe-sysctls",
            "container-log-max-size",
            "container-log-max-files",
            "container-log-link-dir",
            "minimum-container-ttl-duration",
            "maximum-dead-containers-per-container",
            "maximum-dead-containers",
        ],
    ),
    (
        "Pod network and DNS",
        &[
            "network",
            "pod-cidr",
            "cni-conf-dir",
            "cni-bin-dir",
            "cluster-dns",
            "cluster-domain",
            "resolv-conf",
        ],
    ),
    (
        "Images",
        &[
            "registry-config",
            "image-import-dir",
            "serialize-image-pulls",
            "max-parallel-image-pulls",
            "registry-qps",
            "registry-burst",
            "image-pull-progress-timeout",
            "image-gc-high-threshold",
            "image-gc-low-threshold",
            "minimum-image-gc-age",
            "image-credential-provider-config",
            "image-credential-provider-bin-dir",
        ],
    ),
    (
        "Resources and cgroups",
        &[
            "cgroup-root",
            "cgroups-per-qos",
            "cpu-cfs-quota",
            "cpu-cfs-quota-period",
            "qos-reserved",
            "enforce-node-allocatable",
            "system-reserved-cgroup",
            "kube-reserved-cgroup",
        ],
    ),
    (
        "Eviction and stats",
        &[
            "eviction-hard",
            "eviction-soft",
            "eviction-soft-grace-period",
            "eviction-minimum-reclaim",
            "eviction-pressure-transition-period",
            "eviction-max-pod-grace-period",
            "housekeeping-interval",
            "volume-stats-agg-period",
        ],
    ),
    (
        "The kubelet API (serving, authentication)",
        &[
            "address",
            "port",
            "read-only-port",
            "healthz-port",
            "healthz-bind-address",
            "tls-cert-file",
            "tls-private-key-file",
            "tls-min-version",
            "rotate-server-certificates",
            "client-ca-file",
            "anonymous-auth",
            "authentication-token-webhook",
            "authentication-token-webhook-cache-ttl",
            "authorization-mode",
            "authorization-webhook-cache-authorized-ttl",
            "authorization-webhook-cache-unauthorized-ttl",
            "enable-debugging-handlers",
        ],
    ),
];

fn heading(flag: &str) -> &'static str {
    HEADINGS
        .iter()
        .find(|(_, flags)| flags.contains(&flag))
        .map_or("Other", |(h, _)| h)
}

impl Args for SettingFlags {
    fn augment_args(mut cmd: Command) -> Command {
        // In the sections' order, each section's flags in its order.
        let mut settings: Vec<_> = SETTINGS.iter().filter(|s| s.flag.is_some()).collect();
        let rank = |flag: &str| {
            HEADINGS
                .iter()
                .enumerate()
                .find_map(|(i, (_, flags))| flags.iter().position(|f| *f == flag).map(|j| (i, j)))
                .unwrap_or((HEADINGS.len(), 0))
        };
        settings.sort_by_key(|s| rank(s.flag.unwrap_or("")));
        for s in settings {
            let Some(flag) = s.flag else { continue };
            let mut a = Arg::new(flag)
                .long(flag)
                .help(s.help())
                .hide(s.has("hidden"))
                .value_name(s.value_name)
                .help_heading(heading(flag));
            if let [c] = flag.as_bytes() {
                a = a.short(*c as char);
            }
            cmd = cmd.arg((s.arg)(a));
        }
        cmd
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for SettingFlags {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut f = SettingFlags::default();
        f.update_from_arg_matches(m)?;
        Ok(f)
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        for flag in SETTINGS.iter().filter_map(|s| s.flag) {
            let Ok(Some(raw)) = m.try_get_raw(flag) else { continue };
            let vals = raw.map(|v| v.to_string_lossy().into_owned()).collect();
            self.given.retain(|(f, _)| *f != flag);
            self.given.push((flag, vals));
        }
        Ok(())
    }
}

/// Apply `ferrolet run` flags (kubelet's names) over the file and defaults.
pub fn apply(cfg: &mut Config, f: &RunFlags) -> Result<()> {
    let flags = &f.settings;
    for s in SETTINGS.iter() {
        let Some(flag) = s.flag else { continue };
        if let Some((_, vals)) = flags.given.iter().find(|(g, _)| *g == flag) {
            (s.apply_flag)(cfg, flag, vals)?;
        }
    }
    // Image archives are imported from under the root dir given, unless a place was given.
    if flags.given("root-dir") && !flags.given("image-import-dir") {
        cfg.image_import_dir = cfg.root_dir.join("images/import");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::path::Path;
    use std::time::Duration;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        flags: RunFlags,
    }

    fn load(args: &[&str]) -> Result<Config> {
        let cmd = Cmd::try_parse_from(std::iter::once("run").chain(args.iter().copied()))?;
        let mut cfg = Config::default();
        apply(&mut cfg, &cmd.flags)?;
        cfg.validate()?;
        Ok(cfg)
    }

    #[test]
    fn every_flag_has_help_and_a_section() {
        use clap::CommandFactory;
        let mut c = Cmd::command();
        c.build();
        let mut without_help = Vec::new();
        for a in c.get_arguments().filter(|a| !a.is_hide_set() && a.get_long().is_some()) {
            let long = a.get_long().unwrap_or("");
            let help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
            if help.trim().is_empty() {
                without_help.push(long);
            }
            if long != "config" && long != "help" {
                assert_ne!(heading(long), "Other", "--{long} is in no section of HEADINGS");
            }
        }
        assert!(without_help.is_empty(), "flags without help: {without_help:?}");
        for (_, flags) in HEADINGS {
            for f in *flags {
                assert!(
                    SETTINGS.iter().any(|s| s.flag == Some(*f)),
                    "HEADINGS names --{f}, which no setting has"
                );
            }
        }
    }

    #[test]
    fn every_flag_parses_and_help_renders() {
        use clap::CommandFactory;
        let mut c = Cmd::command();
        c.build();
        let help = c.render_long_help().to_string();
        for flag in ["--pod-manifest-path", "--eviction-hard", "--kubeconfig", "-v, --v"] {
            assert!(help.contains(flag), "{flag} missing in\n{help}");
        }
        assert!(!help.contains("initial-container-restart-period"));
        let c = load(&[
            "--fail-swap-on",
            "-v",
            "4",
            "--cluster-dns=10.0.0.10,10.0.0.11",
            "--cluster-dns",
            "10.0.0.12",
        ])
        .unwrap();
        assert!(c.fail_swap_on);
        assert_eq!(c.verbosity, 4);
        assert_eq!(c.cluster_dns.len(), 3);
        assert!(Cmd::try_parse_from(["run", "--max-pods=many"]).is_err());
    }

    #[test]
    fn eviction_and_container_gc_flags() {
        use super::super::Threshold;
        use std::time::Duration;
        let c = load(&[
            "--eviction-hard=memory.available<200Mi, nodefs.available<5%",
            "--eviction-soft=memory.available<1Gi",
            "--eviction-soft-grace-period=memory.available=1m30s",
            "--eviction-minimum-reclaim=nodefs.available=500Mi",
            "--eviction-pressure-transition-period=30s",
            "--eviction-max-pod-grace-period=60",
            "--minimum-container-ttl-duration=1m",
            "--maximum-dead-containers-per-container=2",
            "--maximum-dead-containers=10",
        ])
        .unwrap();
        assert_eq!(c.eviction_hard.memory_available, Some(Threshold::Quantity(200 << 20)));
        assert_eq!(c.eviction_hard.nodefs_available, Some(Threshold::Percent(5.0)));
        // The flag replaces the map, as kubelet's does: the other defaults are gone.
        assert_eq!(c.eviction_hard.imagefs_available, None);
        assert_eq!(c.eviction.soft.memory_available, Some(Threshold::Quantity(1 << 30)));
        assert_eq!(
            c.eviction.soft_grace_period["memory.available"],
            Duration::from_secs(90)
        );
        assert_eq!(
            c.eviction.minimum_reclaim["nodefs.available"],
            Threshold::Quantity(500 << 20)
        );
        assert_eq!(c.eviction.pressure_transition_period, Duration::from_secs(30));
        assert_eq!(c.eviction.max_pod_grace_period, 60);
        assert_eq!(c.eviction.container_gc.min_age, Duration::from_secs(60));
        assert_eq!(c.eviction.container_gc.max_per_pod_container, 2);
        assert_eq!(c.eviction.container_gc.max_containers, 10);

        let err = |args: &[&str]| format!("{:#}", load(args).unwrap_err());
        assert!(err(&["--eviction-hard=memory.available=1Gi"]).contains("--eviction-hard"));
        assert!(err(&["--eviction-hard=cpu.available<1"]).contains("unsupported eviction signal \"cpu.available\""));
        assert!(err(&["--eviction-soft=memory.available<1Gi"]).contains("grace period must be specified"));
        assert!(err(&["--eviction-minimum-reclaim=nodefs.available=lots"]).contains("--eviction-minimum-reclaim"));
    }

    #[test]
    fn runonce_and_log_link_dir_flags() {
        let c = load(&["--runonce", "--container-log-link-dir=/srv/links"]).unwrap();
        assert!(c.run_once);
        assert_eq!(c.container_log_link_dir, PathBuf::from("/srv/links"));
        assert!(!load(&["--runonce=false"]).unwrap().run_once);
    }

    #[test]
    fn image_flags() {
        let c = load(&[
            "--registry-config=/etc/reg.yaml",
            "--serialize-image-pulls=false",
            "--max-parallel-image-pulls=4",
            "--registry-qps=0",
            "--registry-burst=3",
            "--image-gc-high-threshold=95",
            "--image-gc-low-threshold=90",
            "--minimum-image-gc-age=30s",
            "--image-pull-progress-timeout=0",
            "--node-status-max-images",
            "-1",
            "--image-credential-provider-config=/etc/cp.yaml",
            "--image-credential-provider-bin-dir=/usr/libexec/cp",
        ])
        .unwrap();
        let i = &c.images;
        assert_eq!(c.registry_config_file(), Path::new("/etc/reg.yaml"));
        assert!(!i.serialize_image_pulls);
        assert_eq!(i.max_parallel_image_pulls, Some(4));
        assert_eq!((i.registry_pull_qps, i.registry_burst), (0, 3));
        assert_eq!(
            (i.image_gc_high_threshold_percent, i.image_gc_low_threshold_percent),
            (95, 90)
        );
        assert_eq!(i.image_minimum_gc_age, Duration::from_secs(30));
        assert!(i.image_pull_progress_timeout.is_zero());
        assert_eq!(i.node_status_max_images, -1);
        assert_eq!(
            i.credential_provider_bin_dir.as_deref(),
            Some(Path::new("/usr/libexec/cp"))
        );
        let d = load(&["--root-dir=/srv/f"]).unwrap();
        assert_eq!(
            d.registry_config_file(),
            Path::new("/srv/f/registries.yaml"),
            "default under the root dir"
        );
        let e = load(&["--registry-burst", "-2"]).unwrap_err().to_string();
        assert!(
            e.contains("registryBurst (--registry-burst) -2 must not be a negative number"),
            "{e}"
        );
        let e = load(&["--minimum-image-gc-age=soon"]).unwrap_err().to_string();
        assert!(e.contains("--minimum-image-gc-age"), "{e}");
    }
}
