//! The stats/v1alpha1 Summary API types (k8s.io/kubelet/pkg/apis/stats/v1alpha1, v1.26), field
//! by field: every JSON name and `omitempty` as the Go structs have them, so metrics-server,
//! `kubectl top` (through metrics-server) and anything decoding kubelet's `/stats/summary`
//! read ferrolet's unchanged. Times are metav1.Time: RFC 3339 in UTC, whole seconds.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// metav1.Time: kept to the nanosecond (the Prometheus timestamps need it), written as RFC 3339
/// with whole seconds as Go's metav1.Time marshals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Time(pub DateTime<Utc>);

impl Default for Time {
    fn default() -> Self {
        Time(DateTime::<Utc>::UNIX_EPOCH)
    }
}

impl Serialize for Time {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0.to_rfc3339_opts(SecondsFormat::Secs, true))
    }
}

impl<'de> Deserialize<'de> for Time {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Time, D::Error> {
        let s = String::deserialize(d)?;
        DateTime::parse_from_rfc3339(&s)
            .map(|t| Time(t.with_timezone(&Utc)))
            .map_err(serde::de::Error::custom)
    }
}

impl Time {
    /// Milliseconds since the epoch (the Prometheus text format's timestamp unit).
    pub fn unix_millis(&self) -> i64 {
        self.0.timestamp_millis()
    }
    /// Seconds since the epoch with the fraction.
    pub fn unix_seconds_f64(&self) -> f64 {
        self.0.timestamp() as f64 + f64::from(self.0.timestamp_subsec_nanos()) / 1e9
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Summary {
    pub node: NodeStats,
    pub pods: Vec<PodStats>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    pub node_name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub system_containers: Vec<ContainerStats>,
    pub start_time: Time,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rlimit: Option<RlimitStats>,
}

/// The names kubelet gives its system containers.
pub const SYSTEM_CONTAINER_KUBELET: &str = "kubelet";
pub const SYSTEM_CONTAINER_PODS: &str = "pods";

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RlimitStats {
    pub time: Time,
    #[serde(rename = "maxpid", skip_serializing_if = "Option::is_none")]
    pub max_pid: Option<i64>,
    #[serde(rename = "curproc", skip_serializing_if = "Option::is_none")]
    pub num_of_running_processes: Option<i64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStats {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_fs: Option<FsStats>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProcessStats {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process_count: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub pod_ref: PodReference,
    pub start_time: Time,
    pub containers: Vec<ContainerStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    #[serde(rename = "volume", default, skip_serializing_if = "Vec::is_empty")]
    pub volume_stats: Vec<VolumeStats>,
    #[serde(rename = "ephemeral-storage", skip_serializing_if = "Option::is_none")]
    pub ephemeral_storage: Option<FsStats>,
    #[serde(rename = "process_stats", skip_serializing_if = "Option::is_none")]
    pub process_stats: Option<ProcessStats>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub name: String,
    pub start_time: Time,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// No accelerators on a ferrolet node: always empty (and so left out, as omitempty does).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accelerators: Vec<AcceleratorStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<FsStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logs: Option<FsStats>,
    /// kubelet never fills these since custom metrics left cAdvisor: always empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_defined_metrics: Vec<UserDefinedMetric>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PodReference {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStats {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rx_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rx_errors: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tx_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tx_errors: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NetworkStats {
    pub time: Time,
    /// The default interface (eth0), inline as Go's `json:",inline"` embeds it.
    #[serde(flatten)]
    pub default: InterfaceStats,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<InterfaceStats>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    pub time: Time,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    pub time: Time,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    #[serde(rename = "rssBytes", skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_faults: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major_page_faults: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AcceleratorStats {
    pub make: String,
    pub model: String,
    pub id: String,
    pub memory_total: u64,
    pub memory_used: u64,
    pub duty_cycle: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStats {
    #[serde(flatten)]
    pub fs: FsStats,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pvc_ref: Option<PvcReference>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PvcReference {
    pub name: String,
    pub namespace: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    pub time: Time,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_free: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_used: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct UserDefinedMetricDescriptor {
    pub name: String,
    #[serde(rename = "type")]
    pub type_: String,
    pub units: String,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct UserDefinedMetric {
    #[serde(flatten)]
    pub descriptor: UserDefinedMetricDescriptor,
    pub time: Time,
    pub value: f64,
}

impl Summary {
    /// kubelet's `only_cpu_and_memory=true` view (GetCPUAndMemoryStats): the node's and each
    /// pod's and container's cpu and memory, nothing else.
    pub fn cpu_and_memory(&self) -> Summary {
        let strip = |c: &ContainerStats| ContainerStats {
            name: c.name.clone(),
            start_time: c.start_time,
            cpu: c.cpu.clone(),
            memory: c.memory.clone(),
            ..Default::default()
        };
        Summary {
            node: NodeStats {
                node_name: self.node.node_name.clone(),
                system_containers: self.node.system_containers.iter().map(strip).collect(),
                start_time: self.node.start_time,
                cpu: self.node.cpu.clone(),
                memory: self.node.memory.clone(),
                ..Default::default()
            },
            pods: self
                .pods
                .iter()
                .map(|p| PodStats {
                    pod_ref: p.pod_ref.clone(),
                    start_time: p.start_time,
                    containers: p.containers.iter().map(strip).collect(),
                    cpu: p.cpu.clone(),
                    memory: p.memory.clone(),
                    ..Default::default()
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_whole_seconds_in_utc() {
        let t = Time(
            DateTime::parse_from_rfc3339("2024-05-01T10:20:30.123456789+02:00")
                .unwrap()
                .with_timezone(&Utc),
        );
        assert_eq!(serde_json::to_string(&t).unwrap(), "\"2024-05-01T08:20:30Z\"");
        assert_eq!(t.unix_millis() % 1000, 123);
    }

    #[test]
    fn omitempty_and_inline_as_go_marshals() {
        let n = NetworkStats {
            time: Time::default(),
            default: InterfaceStats {
                name: "eth0".into(),
                rx_bytes: Some(5),
                ..Default::default()
            },
            interfaces: vec![],
        };
        let v = serde_json::to_value(&n).unwrap();
        assert_eq!(v["name"], "eth0");
        assert_eq!(v["rxBytes"], 5);
        assert!(v.get("txBytes").is_none() && v.get("interfaces").is_none());
        let p = PodStats::default();
        let v = serde_json::to_value(&p).unwrap();
        // `containers` has no omitempty in Go: always there.
        assert!(v["containers"].is_array());
        assert!(v.get("volume").is_none() && v.get("ephemeral-storage").is_none());
        let r = serde_json::to_value(RlimitStats {
            max_pid: Some(4),
            num_of_running_processes: Some(2),
            ..Default::default()
        })
        .unwrap();
        assert_eq!((r["maxpid"].as_i64(), r["curproc"].as_i64()), (Some(4), Some(2)));
    }
}
