//! CNI mode: drive plugins from a network configuration list as the CNI 1.0.0 spec says.
//!
//! - `NetPlug::new` loads the lexically first config of `conf_dir`, checks every plugin binary
//!   is in `bin_dirs` and asks each (VERSION) whether it supports the config's `cniVersion`.
//! - `NetPlug::reload` (the agent calls it every few seconds, as kubelet's network status sync
//!   and containerd's watch of the directory do, and each ADD calls it first: a read of the
//!   directory and one file, the checks only when it changed) loads the directory again: a changed config
//!   that passes the same checks is the one new attachments are made with; one that does not
//!   (or none at all) refuses new attachments with its error until the directory is fixed.
//!   Attachments made before are checked and deleted with the config they were made with.
//! - ADD runs the plugins in order, each result becoming the next one's `prevResult`; the
//!   final result is cached with the config it was made with (`results/`, like libcni's
//!   /var/lib/cni/results). A failed ADD is undone with DEL before the error is returned.
//! - DEL runs the plugins in reverse order with the cached config and result; it goes on past
//!   a failing plugin (DEL is idempotent by spec) and reports the first failure. A namespace
//!   that is gone is passed as an empty `CNI_NETNS`.
//! - CHECK runs the plugins in order with the cached result (configs of 0.4.0 and later).
//! - Before anything is executed for a sandbox, a record (`sandboxes/<id>.json`) holds the
//!   request, the config and the arguments, so `teardown_by_id` and `gc` can DEL after a crash.

mod config;
mod exec;
mod result;

use config::NetConfList;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use tracing::{info, warn};

use crate::error::{Error, Result};
use crate::netns::{netns_exists, open_netns};
use crate::record::Records;
use crate::types::{CniConfig, NetworkStatus, SandboxNetwork};
use ferrolet_fsutil::{self as fsutil, chain};

use exec::{exec_plugin, find_plugin, parse_result, Invocation};

/// What is needed to DEL a sandbox's attachment without anything else.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    sandbox_id: String,
    netns: PathBuf,
    ifname: String,
    network: String,
    cni_args: String,
    capability_args: Map<String, Value>,
    /// The configuration list the attachment was made with.
    config: Value,
    /// True once ADD succeeded and the result is cached.
    ready: bool,
}

/// The result cache, in libcni's shape.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CachedResult {
    kind: String,
    #[serde(rename = "containerId")]
    container_id: String,
    #[serde(rename = "ifName")]
    ifname: String,
    #[serde(rename = "networkName")]
    network: String,
    #[serde(rename = "cniArgs")]
    cni_args: Vec<[String; 2]>,
    #[serde(rename = "capabilityArgs")]
    capability_args: Map<String, Value>,
    config: Value,
    result: Value,
}

pub(crate) struct CniNet {
    cfg: CniConfig,
    /// The configuration new attachments are made with ([`CniNet::reload`] replaces it).
    current: RwLock<Current>,
    cni_path: String,
    records: Records,
    results_dir: PathBuf,
}

/// The directory's configuration as last loaded.
struct Current {
    /// The last configuration that passed every check.
    list: Arc<NetConfList>,
    /// Why the directory's configuration, changed since, does not: new attachments are refused
    /// with it (those made before keep theirs).
    broken: Option<String>,
}

fn split_args(args: &str) -> Vec<[String; 2]> {
    args.split(';')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| [k.to_string(), v.to_string()])
        .collect()
}

fn plugin_types(list: &NetConfList) -> String {
    list.plugins
        .iter()
        .map(|p| p.plugin_type.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// What a configuration must pass to be used: every plugin's binary is in `bin_dirs`, and each
/// distinct plugin (asked once, VERSION) supports the config's cniVersion.
async fn probe(list: &NetConfList, cfg: &CniConfig, cni_path: &str) -> Result<()> {
    let mut seen = BTreeSet::new();
    for pc in &list.plugins {
        let bin = find_plugin(&pc.plugin_type, &cfg.bin_dirs)
            .map_err(|e| Error::cni_config(&list.file, format!("network {:?}: {}", list.name, chain(&e))))?;
        if !seen.insert(pc.plugin_type.clone()) {
            continue;
        }
        let inv = Invocation {
            command: "VERSION",
            container_id: "",
            netns: "",
            ifname: "",
            args: "",
            path: cni_path,
        };
        let stdin = json!({"cniVersion": list.cni_version}).to_string();
        let out = exec_plugin(&bin, &pc.plugin_type, &inv, stdin.as_bytes(), cfg.timeout).await?;
        let v = parse_result(&pc.plugin_type, "VERSION", &out)?;
        let supported: Vec<String> = v["supportedVersions"]
            .as_array()
            .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        if !supported.contains(&list.cni_version) {
            return Err(Error::cni_config(
                &list.file,
                format!(
                    "plugin {} does not support cniVersion {} (it supports: {})",
                    pc.plugin_type,
                    list.cni_version,
                    supported.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

impl CniNet {
    pub(crate) async fn new(cfg: CniConfig) -> Result<Self> {
        if cfg.bin_dirs.is_empty() {
            return Err(Error::invalid_config("bin_dirs", "empty"));
        }
        if cfg.timeout.is_zero() {
            return Err(Error::invalid_config("timeout", "zero"));
        }
        let cni_path = std::env::join_paths(&cfg.bin_dirs)
            .map_err(|e| Error::invalid_config("bin_dirs", e.to_string()))?
            .to_string_lossy()
            .into_owned();
        let list = NetConfList::load_dir(&cfg.conf_dir)?;
        probe(&list, &cfg, &cni_path).await?;
        let records = Records::new(&cfg.state_dir)?;
        let results_dir = cfg.state_dir.join("results");
        fsutil::ensure_dir(&results_dir)?;
        info!(config = %list.file.display(), network = %list.name, version = %list.cni_version,
              plugins = %plugin_types(&list), "CNI network ready");
        Ok(CniNet {
            cfg,
            current: RwLock::new(Current {
                list: Arc::new(list),
                broken: None,
            }),
            cni_path,
            records,
            results_dir,
        })
    }

    /// Load the config directory again. Ok(true): its configuration changed, passed the checks
    /// of [`CniNet::new`] and is the one new attachments are made with from now on. An error:
    /// it changed and does not pass (or the directory has none): new attachments are refused
    /// with that error until a reload succeeds.
    pub(crate) async fn reload(&self) -> Result<bool> {
        let loaded = match NetConfList::load_dir(&self.cfg.conf_dir) {
            Ok(l) if l == *self.list() => Ok(None),
            Ok(l) => probe(&l, &self.cfg, &self.cni_path).await.map(|()| Some(l)),
            Err(e) => Err(e),
        };
        let mut cur = self.current.write().unwrap_or_else(|e| e.into_inner());
        match loaded {
            Ok(None) => {
                if cur.broken.take().is_some() {
                    info!(config = %cur.list.file.display(), "CNI config usable again, unchanged");
                }
                Ok(false)
            }
            Ok(Some(list)) => {
                info!(config = %list.file.display(), network = %list.name, version = %list.cni_version,
                      plugins = %plugin_types(&list), "CNI config changed; new pods use it");
                *cur = Current {
                    list: Arc::new(list),
                    broken: None,
                };
                Ok(true)
            }
            Err(e) => {
                let why = chain(&e).to_string();
                if cur.broken.as_ref() != Some(&why) {
                    warn!(error = %why, "CNI config changed and cannot be used; new pods wait for a good one");
                }
                cur.broken = Some(why);
                Err(e)
            }
        }
    }

    /// The configuration in force.
    fn list(&self) -> Arc<NetConfList> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).list.clone()
    }

    /// The configuration for a new attachment, or why there is none.
    fn list_for_setup(&self) -> Result<Arc<NetConfList>> {
        let cur = self.current.read().unwrap_or_else(|e| e.into_inner());
        match &cur.broken {
            Some(why) => Err(Error::CniConfig {
                file: self.cfg.conf_dir.display().to_string(),
                reason: format!("the directory's configuration changed and cannot be used: {why}"),
            }),
            None => Ok(cur.list.clone()),
        }
    }

    fn cache_path(&self, network: &str, id: &str, ifname: &str) -> PathBuf {
        self.results_dir
            .join(fsutil::safe_name(&format!("{network}-{id}-{ifname}")))
    }

    /// Run `command` on the plugins of `list` (in the given order).
    #[allow(clippy::too_many_arguments)]
    async fn run_plugin(
        &self,
        list: &NetConfList,
        idx: usize,
        command: &str,
        rec: &Record,
        netns: &str,
        prev: Option<&Value>,
    ) -> Result<Vec<u8>> {
        let pc = &list.plugins[idx];
        let bin = find_plugin(&pc.plugin_type, &self.cfg.bin_dirs)?;
        let stdin = config::plugin_stdin(list, pc, &rec.capability_args, prev).to_string();
        let inv = Invocation {
            command,
            container_id: &rec.sandbox_id,
            netns,
            ifname: &rec.ifname,
            args: &rec.cni_args,
            path: &self.cni_path,
        };
        exec_plugin(&bin, &pc.plugin_type, &inv, stdin.as_bytes(), self.cfg.timeout).await
    }

    pub(crate) async fn setup(&self, req: &SandboxNetwork) -> Result<NetworkStatus> {
        let id = &req.sandbox_id;
        // The directory as it is now: a pod made right after its config changed gets the new
        // one (an error is kept by reload and returned just below).
        let _ = self.reload().await;
        let list = self.list_for_setup()?;
        if let Some(old) = self.records.read::<Record>(id)? {
            warn!(sandbox = %id, "sandbox already has a CNI attachment; deleting it first");
            self.del(&old).await?;
        }
        open_netns(&req.netns)?;
        let rec = Record {
            sandbox_id: id.clone(),
            netns: req.netns.clone(),
            ifname: req.ifname.clone(),
            network: list.name.clone(),
            cni_args: config::cni_args(req),
            capability_args: config::capability_args(req),
            config: list.to_value(),
            ready: false,
        };
        self.records.write(id, &rec).await?;
        let netns = req.netns.to_string_lossy().into_owned();
        let mut prev: Option<Value> = None;
        let mut failure = None;
        for idx in 0..list.plugins.len() {
            let ptype = list.plugins[idx].plugin_type.clone();
            match self
                .run_plugin(&list, idx, "ADD", &rec, &netns, prev.as_ref())
                .await
                .and_then(|out| parse_result(&ptype, "ADD", &out))
            {
                Ok(v) => {
                    info!(sandbox = %id, plugin = %ptype, "CNI ADD done");
                    prev = Some(v);
                    crate::failpoint("cni-after-add").await;
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let result = match (failure, prev) {
            (Some(e), _) => Err(e),
            (None, Some(result)) => {
                let status = result::status_from_result(&result, &req.ifname);
                if status.ips.is_empty() {
                    Err(Error::PluginOutput {
                        plugin: list.plugins.last().map(|p| p.plugin_type.clone()).unwrap_or_default(),
                        command: "ADD".into(),
                        reason: "the result of the plugin chain has no IP address".into(),
                    })
                } else {
                    Ok((status, result))
                }
            }
            (None, None) => unreachable!("a config list has at least one plugin"),
        };
        match result {
            Ok((status, result)) => {
                let cache = CachedResult {
                    kind: "cniCacheV1".into(),
                    container_id: id.clone(),
                    ifname: req.ifname.clone(),
                    network: list.name.clone(),
                    cni_args: split_args(&rec.cni_args),
                    capability_args: rec.capability_args.clone(),
                    config: rec.config.clone(),
                    result,
                };
                let cache_path = self.cache_path(&list.name, id, &req.ifname);
                crate::blocking(move || fsutil::write_json_atomic(&cache_path, &cache)).await?;
                let rec = Record { ready: true, ..rec };
                self.records.write(id, &rec).await?;
                info!(sandbox = %id, network = %list.name, ips = ?status.ips, "CNI network set up");
                Ok(status)
            }
            Err(e) => {
                warn!(sandbox = %id, error = %chain(&e), "CNI ADD failed; running DEL to undo");
                if let Err(e2) = self.del(&rec).await {
                    warn!(sandbox = %id, error = %chain(&e2), "DEL after a failed ADD failed; gc will retry");
                }
                Err(e)
            }
        }
    }

    /// DEL an attachment from its record (and cached result), then forget it.
    async fn del(&self, rec: &Record) -> Result<()> {
        let cache_path = self.cache_path(&rec.network, &rec.sandbox_id, &rec.ifname);
        let cache: Option<CachedResult> = fsutil::read_json_opt(&cache_path).unwrap_or_else(|e| {
            warn!(sandbox = %rec.sandbox_id, error = %chain(&e), "unreadable CNI result cache; DEL without prevResult");
            None
        });
        let config = cache
            .as_ref()
            .map(|c| c.config.clone())
            .unwrap_or_else(|| rec.config.clone());
        let list = NetConfList::parse(&cache_path, config.to_string().as_bytes())?;
        let prev = cache.map(|c| c.result);
        let netns = if netns_exists(&rec.netns) {
            rec.netns.to_string_lossy().into_owned()
        } else {
            String::new()
        };
        let mut first_err = None;
        for idx in (0..list.plugins.len()).rev() {
            let ptype = &list.plugins[idx].plugin_type;
            match self.run_plugin(&list, idx, "DEL", rec, &netns, prev.as_ref()).await {
                Ok(_) => info!(sandbox = %rec.sandbox_id, plugin = %ptype, "CNI DEL done"),
                Err(e) => {
                    warn!(sandbox = %rec.sandbox_id, plugin = %ptype, error = %chain(&e), "CNI DEL failed");
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        crate::blocking(move || fsutil::remove_file_opt(&cache_path)).await?;
        self.records.remove(&rec.sandbox_id).await?;
        info!(sandbox = %rec.sandbox_id, network = %rec.network, "CNI network torn down");
        Ok(())
    }

    /// The sandbox's record; for a sandbox known only from a cached result (or from the
    /// request), or whose record cannot be read, one made from those (or from the current
    /// configuration, interface eth0, no namespace: what DEL needs to release by id).
    fn record_for(&self, id: &str, req: Option<&SandboxNetwork>) -> Result<Option<Record>> {
        let mut unreadable = false;
        match self.records.read::<Record>(id) {
            Ok(Some(rec)) => return Ok(Some(rec)),
            Ok(None) => {}
            Err(e) => {
                warn!(sandbox = %id, error = %chain(&e), "unreadable CNI record; DEL with the cached result or the current configuration");
                unreadable = true;
            }
        }
        let fallback = SandboxNetwork::new(id, PathBuf::new());
        let req = req.or(unreadable.then_some(&fallback));
        // a cached result without a record: find it by container id
        for name in fsutil::list_names(&self.results_dir)? {
            let Ok(Some(c)) = fsutil::read_json_opt::<CachedResult>(&self.results_dir.join(&name)) else {
                continue;
            };
            if c.container_id == id {
                return Ok(Some(Record {
                    sandbox_id: id.to_string(),
                    netns: req.map(|r| r.netns.clone()).unwrap_or_default(),
                    ifname: c.ifname,
                    network: c.network,
                    cni_args: c
                        .cni_args
                        .iter()
                        .map(|[k, v]| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(";"),
                    capability_args: c.capability_args,
                    config: c.config,
                    ready: true,
                }));
            }
        }
        let list = self.list();
        Ok(req.map(|req| Record {
            sandbox_id: id.to_string(),
            netns: req.netns.clone(),
            ifname: req.ifname.clone(),
            network: list.name.clone(),
            cni_args: config::cni_args(req),
            capability_args: config::capability_args(req),
            config: list.to_value(),
            ready: false,
        }))
    }

    pub(crate) async fn teardown(&self, req: &SandboxNetwork) -> Result<()> {
        match self.record_for(&req.sandbox_id, Some(req))? {
            Some(rec) => self.del(&rec).await,
            None => Ok(()),
        }
    }

    pub(crate) async fn teardown_by_id(&self, id: &str) -> Result<()> {
        match self.record_for(id, None)? {
            Some(rec) => self.del(&rec).await,
            None => Ok(()),
        }
    }

    pub(crate) async fn check(&self, req: &SandboxNetwork) -> Result<()> {
        let id = &req.sandbox_id;
        let rec: Record = self
            .records
            .read(id)?
            .ok_or_else(|| Error::check(id, "no CNI attachment recorded (setup was not run or was torn down)"))?;
        if !rec.ready {
            return Err(Error::check(id, "ADD did not finish"));
        }
        let cache_path = self.cache_path(&rec.network, id, &rec.ifname);
        let cache: CachedResult = fsutil::read_json_opt(&cache_path)?
            .ok_or_else(|| Error::check(id, format!("no cached result at {}", cache_path.display())))?;
        let list = NetConfList::parse(&cache_path, cache.config.to_string().as_bytes())?;
        if !list.supports_check() {
            return Err(Error::check(
                id,
                format!(
                    "cniVersion {} of network {} does not support CHECK",
                    list.cni_version, list.name
                ),
            ));
        }
        if list.disable_check {
            return Ok(());
        }
        if !netns_exists(&req.netns) {
            return Err(Error::check(
                id,
                format!("network namespace {} is gone", req.netns.display()),
            ));
        }
        let netns = req.netns.to_string_lossy().into_owned();
        for idx in 0..list.plugins.len() {
            self.run_plugin(&list, idx, "CHECK", &rec, &netns, Some(&cache.result))
                .await?;
        }
        Ok(())
    }

    /// Ids of every sandbox with a record or a cached result.
    pub(crate) fn gc_candidates(&self) -> Result<BTreeSet<String>> {
        let mut ids: BTreeSet<String> = self.records.ids()?.into_iter().collect();
        for name in fsutil::list_names(&self.results_dir)? {
            if let Ok(Some(c)) = fsutil::read_json_opt::<CachedResult>(&self.results_dir.join(&name)) {
                ids.insert(c.container_id);
            }
        }
        Ok(ids)
    }
}
