//! The PersistentVolumeClaims of a pod's volumes and the PersistentVolumes bound to them
//! (kubelet's desired-state populator: getPVCExtractPV and getPVSpec). A `persistentVolumeClaim`
//! volume names its claim; a generic `ephemeral` volume's claim is `<pod>-<volume>`, made by
//! the ephemeral volume controller and owned by the pod. The claim must be bound and not being
//! deleted, and the volume it is bound to must point back at it; each refusal is kubelet's
//! message. What is found is kept for the pod until it leaves the node (kubelet resolves a
//! pod's volumes once, when it first processes the pod), and in the checkpoint, which serves
//! it while the API server cannot be reached: a StatefulSet's pod starts on its volume after a
//! boot without the server.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, Volume};

use crate::pod;

/// A claim and the volume bound to it.
#[derive(Debug, Clone, PartialEq)]
pub struct BoundClaim {
    pub claim: PersistentVolumeClaim,
    pub volume: PersistentVolume,
}

impl BoundClaim {
    /// The PersistentVolume's name.
    pub fn volume_name(&self) -> &str {
        self.volume.metadata.name.as_deref().unwrap_or("")
    }

    /// `(namespace, name)` of the claim, for the volume's stats (`pvcRef`).
    pub fn claim_ref(&self) -> (String, String) {
        (
            self.claim.metadata.namespace.clone().unwrap_or_default(),
            self.claim.metadata.name.clone().unwrap_or_default(),
        )
    }
}

/// What resolving a volume's claim found, or why it cannot be used.
pub type ClaimLookup = Result<Arc<BoundClaim>, String>;

/// The claim a volume uses: `persistentVolumeClaim.claimName`, or a generic ephemeral volume's
/// `<pod name>-<volume name>` (kubelet's ephemeral.VolumeClaimName); with whether it is an
/// ephemeral volume's. `None` for volumes of other types.
pub fn claim_name(p: &Pod, v: &Volume) -> Option<(String, bool)> {
    if let Some(c) = &v.persistent_volume_claim {
        return Some((c.claim_name.clone(), false));
    }
    v.ephemeral
        .as_ref()
        .map(|_| (format!("{}-{}", p.metadata.name.as_deref().unwrap_or(""), v.name), true))
}

/// Whether the pod has a volume backed by a claim.
pub fn has_claims(p: &Pod) -> bool {
    pod::spec(p)
        .volumes
        .iter()
        .flatten()
        .any(|v| claim_name(p, v).is_some())
}

/// The name of the PersistentVolume `pvc` is bound to, or kubelet's reason the pod cannot use
/// it: being deleted, not bound, or (a generic ephemeral volume's) not made for this pod.
pub fn check_claim(p: &Pod, ephemeral: bool, pvc: &PersistentVolumeClaim) -> Result<String, String> {
    let ns = pvc.metadata.namespace.as_deref().unwrap_or("");
    let name = pvc.metadata.name.as_deref().unwrap_or("");
    if ephemeral {
        let owned = pvc
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true) && Some(o.uid.as_str()) == p.metadata.uid.as_deref());
        if !owned {
            return Err(format!(
                "PVC {ns}/{name} was not created for pod {}/{} (pod is not owner)",
                pod::namespace(p),
                p.metadata.name.as_deref().unwrap_or("")
            ));
        }
    }
    if pvc.metadata.deletion_timestamp.is_some() {
        return Err(format!("can't start pod because PVC {ns}/{name} is being deleted"));
    }
    let phase = pvc.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("");
    let volume = pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()).unwrap_or("");
    if phase != "Bound" || volume.is_empty() {
        return Err(format!(
            "PVC {ns}/{name} has non-bound phase ({phase:?}) or empty pvc.Spec.VolumeName ({volume:?})"
        ));
    }
    Ok(volume.to_string())
}

/// kubelet's check that the volume a claim names is bound to that claim.
pub fn check_volume(pvc: &PersistentVolumeClaim, pv: &PersistentVolume) -> Result<(), String> {
    let name = pv.metadata.name.as_deref().unwrap_or("");
    let claim_uid = pvc.metadata.uid.as_deref().unwrap_or("");
    let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return Err(format!(
            "found PV object {name} but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim"
        ));
    };
    let ref_uid = r.uid.as_deref().unwrap_or("");
    if ref_uid != claim_uid {
        return Err(format!(
            "found PV object {name} but its pv.Spec.ClaimRef.UID ({ref_uid}) does not point to claim.UID ({claim_uid})"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-0", "namespace": "ns", "uid": "pod-uid"},
            "spec": {"containers": [{"name": "c"}], "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}},
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                {"name": "tmp", "emptyDir": {}}
            ]}
        }))
        .unwrap()
    }

    fn claim(j: serde_json::Value) -> PersistentVolumeClaim {
        let mut base = serde_json::json!({
            "metadata": {"name": "data-web-0", "namespace": "ns", "uid": "claim-uid"},
            "spec": {"volumeName": "pv-1"},
            "status": {"phase": "Bound"}
        });
        json_patch(&mut base, j);
        serde_json::from_value(base).unwrap()
    }

    fn json_patch(base: &mut serde_json::Value, patch: serde_json::Value) {
        match (base, patch) {
            (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
                for (k, v) in p {
                    json_patch(b.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (b, p) => *b = p,
        }
    }

    #[test]
    fn claim_names_of_claims_and_ephemeral_volumes() {
        let p = pod();
        let names: Vec<_> = pod::spec(&p)
            .volumes
            .iter()
            .flatten()
            .map(|v| claim_name(&p, v))
            .collect();
        assert_eq!(
            names,
            [
                Some(("data-web-0".to_string(), false)),
                Some(("web-0-scratch".to_string(), true)),
                None
            ]
        );
        assert!(has_claims(&p));
    }

    #[test]
    fn kubelets_refusals_of_a_claim() {
        let p = pod();
        assert_eq!(check_claim(&p, false, &claim(serde_json::json!({}))), Ok("pv-1".into()));
        assert_eq!(
            check_claim(
                &p,
                false,
                &claim(serde_json::json!({"status": {"phase": "Pending"}, "spec": {"volumeName": null}}))
            ),
            Err("PVC ns/data-web-0 has non-bound phase (\"Pending\") or empty pvc.Spec.VolumeName (\"\")".into())
        );
        assert_eq!(
            check_claim(
                &p,
                false,
                &claim(serde_json::json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}))
            ),
            Err("can't start pod because PVC ns/data-web-0 is being deleted".into())
        );
        // An ephemeral volume's claim must be the pod's own.
        assert_eq!(
            check_claim(&p, true, &claim(serde_json::json!({}))),
            Err("PVC ns/data-web-0 was not created for pod ns/web-0 (pod is not owner)".into())
        );
        let owned = claim(serde_json::json!({"metadata": {"ownerReferences": [
            {"apiVersion": "v1", "kind": "Pod", "name": "web-0", "uid": "pod-uid", "controller": true}
        ]}}));
        assert_eq!(check_claim(&p, true, &owned), Ok("pv-1".into()));
    }

    #[test]
    fn the_volume_must_point_back_at_the_claim() {
        let c = claim(serde_json::json!({}));
        let pv = |r: serde_json::Value| -> PersistentVolume {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "pv-1"}, "spec": {"claimRef": r}})).unwrap()
        };
        assert_eq!(check_volume(&c, &pv(serde_json::json!({"uid": "claim-uid"}))), Ok(()));
        assert_eq!(
            check_volume(&c, &pv(serde_json::json!({"uid": "other"}))),
            Err(
                "found PV object pv-1 but its pv.Spec.ClaimRef.UID (other) does not point to claim.UID (claim-uid)"
                    .into()
            )
        );
        assert!(check_volume(&c, &pv(serde_json::Value::Null))
            .unwrap_err()
            .contains("nil pv.Spec.ClaimRef"));
    }
}
