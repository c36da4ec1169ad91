//! Image pulls in a cluster: a pod's imagePullSecrets are Secrets the node reads through the
//! API server (the Node authorizer lets it read those its pods reference); the pull goes to a
//! real docker-registry (TLS with a test CA, htpasswd) on the cluster namespace's loopback, and
//! the pod's status and events say what happened, as kubelet's do.

use std::time::Duration;

use base64::Engine;
use libtest_mimic::Trial;

use crate::common::registry::{images_dir, images_missing, tools_missing, Auth, Registry, PASSWORD, USER};
use crate::{cluster, test};

pub fn tests() -> Vec<Trial> {
    vec![test(
        "image_pull_secrets_from_the_api_server",
        image_pull_secrets_from_the_api_server,
    )]
}

fn event_messages(c: &crate::common::cluster::Cluster, pod: &str) -> Vec<(String, String)> {
    c.get_json(&["events", "--field-selector", &format!("involvedObject.name={pod}")])
        .and_then(|l| l["items"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .map(|e| {
            (
                e["reason"].as_str().unwrap_or_default().to_string(),
                e["message"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn image_pull_secrets_from_the_api_server() {
    if let Some(why) = tools_missing().or_else(images_missing) {
        eprintln!("\n*** SKIPPED image_pull_secrets_from_the_api_server: {why} ***\n");
        return;
    }
    let c = cluster();
    c.wait("the default ServiceAccount", Duration::from_secs(60), || {
        c.kubectl(&["get", "serviceaccount", "default"]).status.success()
    });
    let reg = Registry::start_in("cluster", true, Auth::Basic, Some(&c.net.path));
    let two = images_dir().join("two.oci.tar");
    reg.push(&two, "1", "demo/two:1", false, None);
    reg.push(&two, "1", "demo/two:2", false, None);
    let registries = reg.dir.join("registries.yaml");
    std::fs::write(
        &registries,
        format!(
            "configs:\n  \"{}\":\n    tls:\n      ca_file: {}\n",
            reg.host(),
            reg.ca_file.as_ref().unwrap().display()
        ),
    )
    .unwrap();
    let node = c.node_with(
        "pullsecret",
        &["--kubeconfig", c.node_kubeconfig("node-pullsecret").to_str().unwrap()],
        &format!("registryConfigFile: {}\n", registries.display()),
    );
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    let dockerconfig = serde_json::json!({"auths": {reg.host(): {"auth": auth}}}).to_string();
    let dockerconfig = base64::engine::general_purpose::STANDARD.encode(dockerconfig);
    let host = reg.host();
    c.apply(&format!(
        r#"
apiVersion: v1
kind: Secret
metadata: {{name: regcred, namespace: default}}
type: kubernetes.io/dockerconfigjson
data: {{.dockerconfigjson: {dockerconfig}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: pulled, namespace: default}}
spec:
  nodeName: {node}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  imagePullSecrets: [{{name: regcred}}]
  containers:
  - name: app
    image: {host}/demo/two:1
    command: [sh, -c, "cat /etc/two-release; sleep 3600"]
---
apiVersion: v1
kind: Pod
metadata: {{name: nosecret, namespace: default}}
spec:
  nodeName: {node}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {host}/demo/two:2
    command: [sleep, "3600"]
"#,
        node = node.node
    ));
    c.wait("the pod with the pull secret to run", Duration::from_secs(90), || {
        c.get_json(&["pod", "pulled"])
            .is_some_and(|p| p["status"]["phase"] == "Running")
    });
    let p = c.get_json(&["pod", "pulled"]).unwrap();
    let id = p["status"]["containerStatuses"][0]["imageID"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(id, format!("{host}/demo/two@{}", reg.digest_of("demo/two:1")), "{p}");
    let events = event_messages(c, "pulled");
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "Pulled" && m.starts_with("Successfully pulled image") && m.contains("Image size:")),
        "{events:?}"
    );
    // Without the secret the registry says no, in the pod's status.
    c.wait(
        "ErrImagePull or ImagePullBackOff without a secret",
        Duration::from_secs(60),
        || {
            c.get_json(&["pod", "nosecret"]).is_some_and(|p| {
                let w = &p["status"]["containerStatuses"][0]["state"]["waiting"];
                (w["reason"] == "ErrImagePull" || w["reason"] == "ImagePullBackOff")
                    && w["message"].as_str().is_some_and(|m| m.contains("unauthorized"))
            })
        },
    );
    let _ = c.kubectl(&[
        "delete",
        "pod",
        "pulled",
        "nosecret",
        "--grace-period=0",
        "--force",
        "--wait=false",
    ]);
    let _ = c.kubectl(&["delete", "secret", "regcred"]);
    drop(node);
    drop(reg);
}
