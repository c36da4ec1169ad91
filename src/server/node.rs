//! The node's own descriptions on the kubelet API: `/runningpods/` (pods as the runtime sees
//! them, kubelet's GetRunningPods: name, namespace and UID, containers with name and image
//! only), `/configz` (the effective configuration) and `/spec` (cAdvisor's MachineInfo).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State as AxumState;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::State;
use crate::kuberuntime::labels::{LABEL_CONTAINER_NAME, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID};

fn json(v: impl serde::Serialize) -> Response {
    match serde_json::to_string(&v) {
        Ok(s) => ([(header::CONTENT_TYPE, "application/json")], s).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Pods with running containers, from the runtime's records.
pub fn running_pods(containers: &[ferrolet_runtime::ContainerInfo]) -> Vec<Pod> {
    let mut pods: BTreeMap<String, Pod> = BTreeMap::new();
    for c in containers.iter().filter(|c| c.is_running()) {
        let l = &c.record.labels;
        let Some(uid) = l.get(LABEL_POD_UID) else {
            continue;
        };
        let pod = pods.entry(uid.clone()).or_insert_with(|| Pod {
            metadata: ObjectMeta {
                name: l.get(LABEL_POD_NAME).cloned(),
                namespace: l.get(LABEL_POD_NAMESPACE).cloned(),
                uid: Some(uid.clone()),
                ..Default::default()
            },
            spec: Some(PodSpec::default()),
            status: None,
        });
        let spec = pod.spec.get_or_insert_with(Default::default);
        spec.containers.push(Container {
            name: l
                .get(LABEL_CONTAINER_NAME)
                .cloned()
                .unwrap_or_else(|| c.record.name.clone()),
            image: Some(c.record.image.clone()),
            ..Default::default()
        });
    }
    let mut out: Vec<Pod> = pods.into_values().collect();
    for p in &mut out {
        if let Some(s) = p.spec.as_mut() {
            s.containers.sort_by(|a, b| a.name.cmp(&b.name));
        }
    }
    out
}

pub async fn runningpods(AxumState(st): AxumState<Arc<State>>) -> Response {
    let rt = st.rt.clone();
    let list = match ferrolet_fsutil::spawn_blocking(move || rt.list()).await {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => return (StatusCode::INTERNAL_SERVER_ERROR, format!("listing containers: {e}")).into_response(),
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    json(serde_json::json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {},
        "items": running_pods(&list),
    }))
}

pub async fn configz(AxumState(st): AxumState<Arc<State>>) -> Response {
    json(serde_json::json!({"kubeletconfig": crate::config::effective::kubelet_configuration(&st.config)}))
}

pub async fn spec() -> Response {
    match ferrolet_fsutil::spawn_blocking(crate::node::machine_info::machine_info).await {
        Ok(info) => json(info),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}
