//! kubelet's eviction admit handler: what a node under pressure still takes.

use k8s_openapi::api::core::v1::Pod;

use super::signals::Condition;
use crate::lifecycle::admit::Rejection;
use crate::pod::qos;

/// kubelet's eviction manager admit handler: with no pressure every pod is admitted; critical
/// pods ([`super::rank::is_critical`]) always are; under memory pressure alone, pods
/// that are not BestEffort are, and BestEffort ones that tolerate the
/// `node.kubernetes.io/memory-pressure:NoSchedule` taint; otherwise the pod is refused with
/// reason Evicted and "The node had condition: [..]. ".
pub fn eviction_admit(p: &Pod, conditions: &[Condition], in_cluster: bool) -> Result<(), Rejection> {
    if conditions.is_empty() || super::rank::is_critical(p, in_cluster) {
        return Ok(());
    }
    if conditions == [Condition::MemoryPressure] {
        if qos::qos_class(p) != qos::QosClass::BestEffort {
            return Ok(());
        }
        let tolerates = crate::pod::spec(p).tolerations.iter().flatten().any(|t| {
            let key = match t.key.as_deref().unwrap_or("") {
                "" => t.operator.as_deref() == Some("Exists"),
                k => k == "node.kubernetes.io/memory-pressure",
            };
            let effect = matches!(t.effect.as_deref(), None | Some("") | Some("NoSchedule"));
            let value = t.operator.as_deref() == Some("Exists") || t.value.as_deref().unwrap_or("").is_empty();
            key && effect && value
        });
        if tolerates {
            return Ok(());
        }
    }
    let names: Vec<&str> = conditions.iter().map(|c| c.name()).collect();
    Err(Rejection {
        reason: super::REASON.into(),
        message: format!("The node had condition: [{}]. ", names.join(" ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(extra: &str) -> Pod {
        serde_saphyr::from_str(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  containers:\n  - name: c\n    image: x\n{extra}"
        ))
        .unwrap()
    }

    #[test]
    fn memory_pressure_refuses_besteffort_only() {
        let be = pod("");
        let burstable = pod("    resources: {requests: {memory: 10Mi}}\n");
        let mem = [Condition::MemoryPressure];
        let r = eviction_admit(&be, &mem, false).unwrap_err();
        assert_eq!(r.reason, "Evicted");
        assert_eq!(r.message, "The node had condition: [MemoryPressure]. ");
        assert!(eviction_admit(&burstable, &mem, false).is_ok());
        assert!(eviction_admit(&be, &[], false).is_ok());
        let tolerant =
            pod("  tolerations: [{key: node.kubernetes.io/memory-pressure, operator: Exists, effect: NoSchedule}]\n");
        assert!(eviction_admit(&tolerant, &mem, false).is_ok());
    }

    #[test]
    fn disk_pressure_refuses_everyone_but_critical_pods() {
        let burstable = pod("    resources: {requests: {memory: 10Mi}}\n");
        let both = [Condition::MemoryPressure, Condition::DiskPressure];
        assert_eq!(
            eviction_admit(&burstable, &both, false).unwrap_err().message,
            "The node had condition: [MemoryPressure DiskPressure]. "
        );
        let mut critical = pod("");
        critical.spec.as_mut().unwrap().priority = Some(2_000_001_000);
        assert!(eviction_admit(&critical, &[Condition::DiskPressure], false).is_ok());
        // A static pod is critical in a cluster (kubelet's rule), not on a standalone node.
        let mut static_pod = pod("");
        static_pod
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(crate::pod::CONFIG_SOURCE.into(), "file".into());
        assert!(eviction_admit(&static_pod, &[Condition::DiskPressure], true).is_ok());
        assert!(eviction_admit(&static_pod, &[Condition::DiskPressure], false).is_err());
    }
}
