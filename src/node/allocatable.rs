//! Capacity and allocatable (kubelet's MachineInfo setter and the container manager's
//! GetNodeAllocatableReservation): what the machine has, what is set aside for the system, the
//! agent and the hard eviction thresholds, and so what pods may have; with the quantities
//! written the way the API server writes them back.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::config::{EvictionHard, Reserved};

/// A node's resources: capacity or allocatable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    pub cpu_milli: i64,
    pub memory: i64,
    pub ephemeral_storage: i64,
    pub pods: i64,
    /// `hugepages-2Mi` -> bytes, one entry per page size the kernel supports.
    pub hugepages: BTreeMap<String, i64>,
}

/// The extended resources device plugins serve (kubelet's device manager GetCapacity): each
/// resource's devices and its healthy ones. A resource no plugin serves any more is not here,
/// and leaves the Node's status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extended {
    pub capacity: BTreeMap<String, i64>,
    pub allocatable: BTreeMap<String, i64>,
}

impl Extended {
    /// The Node status' entries of these resources: (capacity, allocatable), device counts.
    pub fn to_lists(&self) -> (BTreeMap<String, Quantity>, BTreeMap<String, Quantity>) {
        let list = |m: &BTreeMap<String, i64>| m.iter().map(|(k, n)| (k.clone(), Quantity(n.to_string()))).collect();
        (list(&self.capacity), list(&self.allocatable))
    }
}

impl Resources {
    /// The resource list of a Node's status (`capacity` or `allocatable`).
    pub fn to_list(&self) -> BTreeMap<String, Quantity> {
        let mut m = BTreeMap::new();
        m.insert("cpu".to_string(), Quantity(decimal_milli(self.cpu_milli)));
        m.insert("memory".to_string(), Quantity(binary(self.memory)));
        m.insert(
            "ephemeral-storage".to_string(),
            Quantity(binary(self.ephemeral_storage)),
        );
        m.insert("pods".to_string(), Quantity(self.pods.to_string()));
        for (name, bytes) in &self.hugepages {
            m.insert(name.clone(), Quantity(binary(*bytes)));
        }
        m
    }
}

/// Allocatable as kubelet computes it: each resource's capacity less systemReserved,
/// kubeReserved and its hard eviction threshold (memory.available for memory, nodefs.available
/// for ephemeral-storage), never below zero; memory also less the memory held as huge pages.
pub fn allocatable(capacity: &Resources, system: Reserved, kube: Reserved, eviction: &EvictionHard) -> Resources {
    let evict_memory = eviction.memory_available.map_or(0, |t| t.amount(capacity.memory));
    let evict_nodefs = eviction
        .nodefs_available
        .map_or(0, |t| t.amount(capacity.ephemeral_storage));
    let hugepages: i64 = capacity.hugepages.values().fold(0i64, |a, b| a.saturating_add(*b));
    let less = |cap: i64, parts: &[i64]| parts.iter().fold(cap, |a, p| a.saturating_sub(*p)).max(0);
    Resources {
        cpu_milli: less(capacity.cpu_milli, &[system.cpu_milli, kube.cpu_milli]),
        memory: less(capacity.memory, &[system.memory, kube.memory, evict_memory, hugepages]),
        ephemeral_storage: less(
            capacity.ephemeral_storage,
            &[system.ephemeral_storage, kube.ephemeral_storage, evict_nodefs],
        ),
        pods: capacity.pods,
        hugepages: capacity.hugepages.clone(),
    }
}

/// A cpu quantity in the API server's canonical form: whole cores as `4`, else `3500m`.
pub fn decimal_milli(milli: i64) -> String {
    if milli % 1000 == 0 {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    }
}

/// A byte quantity in the API server's canonical BinarySI form: the largest binary suffix that
/// divides it (`8Gi`, `16374928Ki`), else plain bytes.
pub fn binary(bytes: i64) -> String {
    if bytes == 0 {
        return "0".into();
    }
    const UNITS: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let mut v = bytes;
    let mut unit = None;
    for u in UNITS {
        if v % 1024 != 0 {
            break;
        }
        v /= 1024;
        unit = Some(u);
    }
    match unit {
        Some(u) => format!("{v}{u}"),
        None => bytes.to_string(),
    }
}

/// The resource name of a huge page size given in kB as the kernel names it
/// (`/sys/kernel/mm/hugepages/hugepages-2048kB` -> `hugepages-2Mi`).
pub fn hugepage_resource(size_kb: u64) -> String {
    format!("hugepages-{}", binary((size_kb as i64).saturating_mul(1024)))
}

/// A 4-cpu, 8Gi node with a 512Mi pool of 2Mi pages, for unit tests here and in the container
/// manager.
#[cfg(test)]
pub fn test_capacity() -> Resources {
    Resources {
        cpu_milli: 4000,
        memory: 8 << 30,
        ephemeral_storage: 100 << 30,
        pods: 110,
        hugepages: [
            ("hugepages-2Mi".to_string(), 512 << 20),
            ("hugepages-1Gi".to_string(), 0),
        ]
        .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Threshold;

    fn capacity() -> Resources {
        test_capacity()
    }

    #[test]
    fn kubelets_defaults_take_100mi_and_10_percent() {
        let a = allocatable(
            &capacity(),
            Reserved::default(),
            Reserved::default(),
            &EvictionHard::default(),
        );
        assert_eq!(a.cpu_milli, 4000);
        assert_eq!(a.memory, (8 << 30) - (100 << 20) - (512 << 20));
        assert_eq!(a.ephemeral_storage, (100 << 30) - (10 << 30));
        assert_eq!(a.pods, 110);
        assert_eq!(a.hugepages["hugepages-2Mi"], 512 << 20);
    }

    #[test]
    fn reservations_add_up_and_never_go_negative() {
        let system = Reserved {
            cpu_milli: 500,
            memory: 1 << 30,
            ephemeral_storage: 1 << 30,
            pid: 0,
        };
        let kube = Reserved {
            cpu_milli: 250,
            memory: 512 << 20,
            ephemeral_storage: 0,
            pid: 0,
        };
        let ev = EvictionHard {
            memory_available: Some(Threshold::Percent(5.0)),
            nodefs_available: Some(Threshold::Quantity(2 << 30)),
            pid_available: None,
            ..EvictionHard::none()
        };
        let mut cap = capacity();
        cap.hugepages.clear();
        let a = allocatable(&cap, system, kube, &ev);
        assert_eq!(a.cpu_milli, 3250);
        let five_percent = ((8i64 << 30) as f64 * 0.05).round() as i64;
        assert_eq!(a.memory, (8 << 30) - (1 << 30) - (512 << 20) - five_percent);
        assert_eq!(a.ephemeral_storage, (100 << 30) - (1 << 30) - (2 << 30));

        let huge = Reserved {
            cpu_milli: 10_000,
            memory: i64::MAX,
            ephemeral_storage: i64::MAX,
            pid: 0,
        };
        let a = allocatable(&cap, huge, huge, &ev);
        assert_eq!((a.cpu_milli, a.memory, a.ephemeral_storage), (0, 0, 0));
    }

    #[test]
    fn quantities_are_canonical() {
        assert_eq!(decimal_milli(4000), "4");
        assert_eq!(decimal_milli(3500), "3500m");
        assert_eq!(binary(8 << 30), "8Gi");
        assert_eq!(binary(16_767_926_272), "16374928Ki");
        assert_eq!(binary(1000), "1000");
        assert_eq!(binary(0), "0");
        assert_eq!(hugepage_resource(2048), "hugepages-2Mi");
        assert_eq!(hugepage_resource(1_048_576), "hugepages-1Gi");
        let l = capacity().to_list();
        assert_eq!(l["cpu"].0, "4");
        assert_eq!(l["pods"].0, "110");
        assert_eq!(l["hugepages-1Gi"].0, "0");
        assert_eq!(l["hugepages-2Mi"].0, "512Mi");
    }
}
