//! The plugin watcher and the CSI node side against a real CSI node plugin
//! (tests/common/csiplugin.rs: tonic servers on unix sockets, volumes backed by directories and
//! real bind mounts): driven through the library, and with a real agent and pod (an inline
//! `csi` volume). The CSINode object is tested against the control plane in
//! tests/cluster/csi.rs. Root, for the mounts; every mount under the test's directory is undone
//! even when the test fails.

mod common;
#[path = "common/csiplugin.rs"]
mod csiplugin;
#[path = "common/deviceplugin.rs"]
mod deviceplugin;

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Agent, IMAGE};
use csiplugin::{is_mount_point, MountGuard, Options, TestCsiPlugin};
use ferrolet::pluginmanager::{Handlers, PluginManager};
use ferrolet::volumemanager::csi::client::{AccessMode, Capability, CsiClient, VolumeRequest};
use ferrolet::volumemanager::csi::{self as csi, CsiDrivers, CsiHandler, VolData};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The watcher on `<root>/plugins_registry` with the CSI handler (standalone: no API server).
fn watcher(rt: &tokio::runtime::Runtime, root: &Path) -> (PluginManager, CsiDrivers) {
    let drivers = CsiDrivers::default();
    let mut h = Handlers::new();
    h.insert(
        ferrolet::apis::pluginregistration::v1::CSI_PLUGIN.into(),
        Arc::new(CsiHandler::new(drivers.clone(), None)),
    );
    let _g = rt.enter();
    let m = PluginManager::start(&ferrolet::pluginmanager::registry_dir(root), h).unwrap();
    (m, drivers)
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn plugin_watcher_registers_refuses_and_deregisters_csi_drivers() {
    let t = tempfile::tempdir().unwrap();
    let rt = runtime();
    let registry = ferrolet::pluginmanager::registry_dir(t.path());
    // A plugin there before the watcher starts is found by its first scan; one that hangs
    // (accepts and never answers) stalls nobody.
    std::fs::create_dir_all(&registry).unwrap();
    let hanging = std::os::unix::net::UnixListener::bind(registry.join("hanging.sock")).unwrap();
    let early = TestCsiPlugin::start(&registry, &t.path().join("early"), "early.csi.test", Options::default());
    let started = Instant::now();
    let (m, drivers) = watcher(&rt, t.path());
    assert_eq!(early.first_notification(Duration::from_secs(5)), (true, String::new()));
    let d = drivers.get("early.csi.test").expect("registered");
    assert_eq!(d.node_id, "test-node-id");
    assert_eq!(d.endpoint, early.endpoint);
    assert_eq!(d.version, (1, 7, 0));

    // One that comes later, with a volume limit and topology.
    let mut good = TestCsiPlugin::start(
        &registry,
        &t.path().join("good"),
        "good.csi.test",
        Options {
            versions: vec!["0.3.0".into(), "1.5.0".into()],
            max_volumes: 7,
            topology: [("topology.csi.test/zone".to_string(), "z1".to_string())].into(),
            node_id: "n-good".into(),
            ..Options::default()
        },
    );
    assert_eq!(good.first_notification(Duration::from_secs(5)), (true, String::new()));
    let d = drivers.get("good.csi.test").unwrap();
    assert_eq!(
        (d.node_id.as_str(), d.max_volumes, d.version),
        ("n-good", Some(7), (1, 5, 0))
    );
    assert_eq!(d.topology["topology.csi.test/zone"], "z1");
    assert!(good.calls().contains(&"NodeGetInfo".to_string()));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the hanging socket held the others up: {:?}",
        started.elapsed()
    );

    // Refusals name the field.
    let bad_type = TestCsiPlugin::start(
        &registry,
        &t.path().join("bad-type"),
        "bad-type.csi.test",
        Options {
            kind: "VolumePlugin".into(),
            ..Options::default()
        },
    );
    let (ok, why) = bad_type.first_notification(Duration::from_secs(5));
    assert!(!ok && why.starts_with("type: "), "{why}");
    assert!(why.contains("\"VolumePlugin\""), "{why}");
    let bad_versions = TestCsiPlugin::start(
        &registry,
        &t.path().join("bad-versions"),
        "bad-versions.csi.test",
        Options {
            versions: vec!["0.3.0".into(), "2.0.0".into()],
            ..Options::default()
        },
    );
    let (ok, why) = bad_versions.first_notification(Duration::from_secs(5));
    assert!(!ok && why.contains("supported_versions: "), "{why}");
    let no_node_id = TestCsiPlugin::start(
        &registry,
        &t.path().join("no-node-id"),
        "no-node-id.csi.test",
        Options {
            node_id: String::new(),
            ..Options::default()
        },
    );
    let (ok, why) = no_node_id.first_notification(Duration::from_secs(5));
    assert!(!ok && why.contains("node_id: "), "{why}");
    for name in ["bad-type.csi.test", "bad-versions.csi.test", "no-node-id.csi.test"] {
        assert!(drivers.get(name).is_none(), "{name} was registered");
    }

    // The registration socket goes: the driver is deregistered; the other stays.
    good.unregister();
    wait_for("good.csi.test deregistered", Duration::from_secs(5), || {
        drivers.get("good.csi.test").is_none()
    });
    assert!(drivers.get("early.csi.test").is_some());
    let listed: Vec<String> = m.plugins().into_iter().map(|p| p.name).collect();
    assert_eq!(listed, ["early.csi.test"]);
    drop(hanging);
    drop(rt);
}

/// A client on `rt` with `plugin` registered through the watcher.
fn client_for(rt: &tokio::runtime::Runtime, root: &Path, plugin: &TestCsiPlugin) -> (PluginManager, CsiClient) {
    let (m, drivers) = watcher(rt, root);
    assert!(plugin.first_notification(Duration::from_secs(5)).0);
    let _g = rt.enter();
    (m, CsiClient::new(drivers, None, "node-a", root))
}

fn request(driver: &str, handle: &str) -> VolumeRequest {
    VolumeRequest {
        driver: driver.into(),
        volume_handle: handle.into(),
        capability: Capability {
            fs_type: "ext4".into(),
            access_mode: AccessMode::ReadWriteOnce,
            mount_flags: Vec::new(),
        },
        volume_context: [("k".to_string(), "v".to_string())].into(),
        ..Default::default()
    }
}

#[test]
fn csi_client_stages_publishes_and_tears_down_with_real_bind_mounts() {
    let t = tempfile::tempdir().unwrap();
    let _mounts = MountGuard(t.path().to_path_buf());
    let rt = runtime();
    let root = t.path().join("root");
    let plugin = TestCsiPlugin::start(
        &ferrolet::pluginmanager::registry_dir(&root),
        &t.path().join("plugin"),
        "dirs.csi.test",
        Options::default(),
    );
    let (_m, c) = client_for(&rt, &root, &plugin);
    let backing = plugin.volume("vol-1");
    std::fs::write(backing.join("hello"), "from the volume").unwrap();
    let req = request("dirs.csi.test", "vol-1");

    // Staging, at kubelet's path.
    let staging = csi::staging_path(&root, "dirs.csi.test", "vol-1");
    assert!(c.block_on(c.stage(&req, &staging)).unwrap());
    assert!(is_mount_point(&staging));
    assert_eq!(
        std::fs::read_to_string(staging.join("hello")).unwrap(),
        "from the volume"
    );
    let staged = VolData::load(staging.parent().unwrap()).unwrap();
    assert_eq!(
        (staged.driver_name.as_str(), staged.volume_handle.as_str()),
        ("dirs.csi.test", "vol-1")
    );

    // Two pods: one writes, one reads only.
    let pod = |uid: &str| root.join("pods").join(uid);
    let data = |name: &str| VolData {
        spec_vol_id: "pv-1".into(),
        volume_handle: "vol-1".into(),
        driver_name: "dirs.csi.test".into(),
        node_name: "node-a".into(),
        volume_lifecycle_mode: "Persistent".into(),
        pod_volume_name: name.into(),
        ..Default::default()
    };
    let rw = csi::target_path(&pod("u1"), "data");
    let ro = csi::target_path(&pod("u2"), "shared");
    c.block_on(c.publish(&req, Some(&staging), &rw, false, &data("data")))
        .unwrap();
    c.block_on(c.publish(&req, Some(&staging), &ro, true, &data("shared")))
        .unwrap();
    assert_eq!(VolData::load(rw.parent().unwrap()).unwrap(), data("data"));
    std::fs::File::create(rw.join("written"))
        .unwrap()
        .write_all(b"by pod 1")
        .unwrap();
    assert_eq!(std::fs::read_to_string(backing.join("written")).unwrap(), "by pod 1");
    assert_eq!(std::fs::read_to_string(ro.join("written")).unwrap(), "by pod 1");
    let e = std::fs::write(ro.join("nope"), "x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");

    let stats = c
        .block_on(c.volume_stats("dirs.csi.test", "vol-1", &rw, Some(&staging)))
        .unwrap()
        .expect("the driver has GET_VOLUME_STATS");
    let bytes = stats.bytes.unwrap();
    assert!(
        bytes.total > 0 && bytes.used + bytes.available <= bytes.total,
        "{bytes:?}"
    );
    assert!(stats.inodes.is_some());

    // Tear-down: the targets and their directories go, then the staging.
    for target in [&rw, &ro] {
        c.block_on(c.unpublish("dirs.csi.test", "vol-1", target)).unwrap();
        assert!(!target.parent().unwrap().exists(), "{}", target.display());
    }
    c.block_on(c.unstage("dirs.csi.test", "vol-1", &staging)).unwrap();
    assert!(!is_mount_point(&staging));
    assert!(!staging.parent().unwrap().exists());
    assert_eq!(std::fs::read_to_string(backing.join("written")).unwrap(), "by pod 1");
    let calls = plugin.calls();
    let named: Vec<&str> = calls
        .iter()
        .filter(|c| !c.starts_with("NodeGet"))
        .map(|c| c.split(' ').next().unwrap())
        .collect();
    assert_eq!(
        named,
        [
            "NodeStageVolume",
            "NodePublishVolume",
            "NodePublishVolume",
            "NodeUnpublishVolume",
            "NodeUnpublishVolume",
            "NodeUnstageVolume"
        ]
    );
    assert!(calls.iter().any(|c| c.ends_with(" ro")));

    // Errors name the driver and the call.
    let e = c
        .block_on(c.stage(
            &request("dirs.csi.test", "missing"),
            &csi::staging_path(&root, "dirs.csi.test", "missing"),
        ))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("NodeStageVolume of CSI driver \"dirs.csi.test\" failed: rpc error: code = NotFound"),
        "{e}"
    );
    let e = c
        .block_on(c.stage(&request("nobody.csi.test", "vol-1"), &staging))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "driver name nobody.csi.test not found in the list of registered CSI drivers"
    );
    drop(rt);
}

#[test]
fn csi_client_publishes_directly_for_a_driver_that_does_not_stage() {
    let t = tempfile::tempdir().unwrap();
    let _mounts = MountGuard(t.path().to_path_buf());
    let rt = runtime();
    let root = t.path().join("root");
    let plugin = TestCsiPlugin::start(
        &ferrolet::pluginmanager::registry_dir(&root),
        &t.path().join("plugin"),
        "flat.csi.test",
        Options {
            stage: false,
            ..Options::default()
        },
    );
    let (_m, c) = client_for(&rt, &root, &plugin);
    std::fs::write(plugin.volume("vol-2").join("f"), "flat").unwrap();
    let req = request("flat.csi.test", "vol-2");
    let staging = csi::staging_path(&root, "flat.csi.test", "vol-2");
    assert!(!c.block_on(c.stage(&req, &staging)).unwrap());
    assert!(!staging.exists());
    let target = csi::target_path(&root.join("pods/u3"), "v");
    let data = VolData {
        volume_handle: "vol-2".into(),
        driver_name: "flat.csi.test".into(),
        pod_volume_name: "v".into(),
        ..Default::default()
    };
    c.block_on(c.publish(&req, None, &target, false, &data)).unwrap();
    assert_eq!(std::fs::read_to_string(target.join("f")).unwrap(), "flat");
    c.block_on(c.unpublish("flat.csi.test", "vol-2", &target)).unwrap();
    c.block_on(c.unstage("flat.csi.test", "vol-2", &staging)).unwrap();
    assert!(!target.parent().unwrap().exists());
    let calls: Vec<String> = plugin
        .calls()
        .into_iter()
        .filter(|c| !c.starts_with("NodeGet"))
        .collect();
    assert_eq!(calls.len(), 2, "{calls:?}");
    drop(rt);
}

/// An inline `csi` volume of a static pod: published by the driver into the pod with its
/// nodePublishSecretRef's data, seen and written by its container, kept as it is across an agent restart (reconstructed from
/// vol_data.json, not published again), unpublished when the pod goes.
#[test]
fn a_pods_inline_csi_volume_is_published_kept_across_a_restart_and_torn_down() {
    let mut a = Agent::start_with_config("csiinline", &[], "syncFrequency: 2s\n");
    let _mounts = MountGuard(a.dir.clone());
    let plugin = TestCsiPlugin::start(
        &a.root.join("plugins_registry"),
        &a.dir.join("csi-plugin"),
        "inline.csi.test",
        Options {
            create_on_publish: true,
            ..Options::default()
        },
    );
    assert_eq!(
        plugin.first_notification(Duration::from_secs(10)),
        (true, String::new())
    );
    a.write(
        "p.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: p}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {IMAGE}
    command: [sh, -c, "echo from-the-pod > /data/written; sleep 3600"]
    volumeMounts: [{{name: data, mountPath: /data}}]
  volumes: [{{name: data, csi: {{driver: inline.csi.test, volumeAttributes: {{size: small}}, nodePublishSecretRef: {{name: creds}}}}}}]
---
apiVersion: v1
kind: Secret
metadata: {{name: creds}}
stringData: {{user: admin}}
"#
        ),
    );
    let p = a.wait_phase("p", "Running", Duration::from_secs(45));
    let uid = p.metadata.uid.clone().unwrap();
    let handle = ferrolet::volumemanager::csi::volume::inline_volume_handle(&uid, "data");
    let written = plugin.base.join(&handle).join("written");
    wait_for("the container's write in the volume", Duration::from_secs(20), || {
        std::fs::read_to_string(&written).is_ok_and(|s| s == "from-the-pod\n")
    });
    let pod_dir = a.root.join("pods").join(&uid);
    let target = csi::target_path(&pod_dir, "data");
    assert!(is_mount_point(&target));
    let data = VolData::load(target.parent().unwrap()).unwrap();
    assert_eq!(
        (
            data.volume_lifecycle_mode.as_str(),
            data.pod_volume_name.as_str(),
            data.volume_handle.as_str()
        ),
        ("Ephemeral", "data", handle.as_str())
    );
    let published = |calls: &[String]| calls.iter().filter(|c| c.starts_with("NodePublishVolume")).count();
    assert_eq!(published(&plugin.calls()), 1);
    // The nodePublishSecretRef's data (a Secret of the static pod path) reaches the driver.
    assert!(
        plugin
            .calls()
            .iter()
            .any(|c| c.starts_with("NodePublishVolume") && c.contains(" secrets=user=admin")),
        "{:?}",
        plugin.calls()
    );
    assert!(
        !plugin.calls().iter().any(|c| c.starts_with("NodeStageVolume")),
        "an inline volume is not staged"
    );

    // A restart: the volume is found on disk and left as it is.
    a.restart();
    plugin.calls.lock().unwrap().clear();
    wait_for("the driver registered again", Duration::from_secs(20), || {
        plugin.notifications().len() >= 2
    });
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(published(&plugin.calls()), 0, "{:?}", plugin.calls());
    assert!(is_mount_point(&target));

    // The pod goes: the volume is unpublished.
    a.remove("p.yaml");
    a.wait_gone("p", Duration::from_secs(45));
    wait_for("NodeUnpublishVolume", Duration::from_secs(10), || {
        plugin.calls().iter().any(|c| c.starts_with("NodeUnpublishVolume"))
    });
    assert!(!is_mount_point(&target));
    assert!(!target.parent().unwrap().exists());
    assert_eq!(std::fs::read_to_string(&written).unwrap(), "from-the-pod\n");
}

/// A device plugin that registers through the plugin watcher (type `DevicePlugin`, its name
/// the resource, its endpoint its DevicePlugin socket) reaches the device manager as one
/// registered through `kubelet.sock` does; bad ones are refused naming the field; its
/// registration socket gone, its devices count as unhealthy.
#[test]
fn plugin_watcher_hands_device_plugins_to_the_device_manager() {
    use ferrolet::apis::pluginregistration::v1::DEVICE_PLUGIN;
    use ferrolet::cm::devicemanager::{watcher::DevicePluginHandler, DeviceManager};
    let t = tempfile::tempdir().unwrap();
    let rt = runtime();
    let registry = ferrolet::pluginmanager::registry_dir(t.path());
    let devices = DeviceManager::new(t.path().join("device-plugins"), Arc::new(|| {}));
    let mut h = Handlers::new();
    h.insert(
        DEVICE_PLUGIN.into(),
        Arc::new(DevicePluginHandler::new(devices.clone())),
    );
    let m = {
        let _g = rt.enter();
        PluginManager::start(&registry, h).unwrap()
    };
    let dp = deviceplugin::TestDevicePlugin::serve(
        &t.path().join("dp"),
        "example.com/widget",
        "widget.sock",
        &[("w1", true), ("w2", false)],
    );
    let as_device_plugin = |versions: &[&str]| Options {
        kind: DEVICE_PLUGIN.into(),
        versions: versions.iter().map(|v| v.to_string()).collect(),
        endpoint: Some(t.path().join("dp").join(&dp.endpoint)),
        ..Options::default()
    };
    let mut reg = TestCsiPlugin::start(
        &registry,
        &t.path().join("reg"),
        "example.com/widget",
        as_device_plugin(&["v1beta1"]),
    );
    assert_eq!(reg.first_notification(Duration::from_secs(5)), (true, String::new()));
    let counts = || {
        let e = devices.extended();
        (
            e.capacity.get("example.com/widget").copied(),
            e.allocatable.get("example.com/widget").copied(),
        )
    };
    wait_for("the widgets listed", Duration::from_secs(5), || {
        counts() == (Some(2), Some(1))
    });
    let bad_name = TestCsiPlugin::start(
        &registry,
        &t.path().join("bad-name"),
        "widget",
        as_device_plugin(&["v1beta1"]),
    );
    let (ok, why) = bad_name.first_notification(Duration::from_secs(5));
    assert!(!ok && why.contains("name: \"widget\""), "{why}");
    let bad_version = TestCsiPlugin::start(
        &registry,
        &t.path().join("bad-version"),
        "example.com/gadget",
        as_device_plugin(&["v1alpha"]),
    );
    let (ok, why) = bad_version.first_notification(Duration::from_secs(5));
    assert!(!ok && why.contains("supported_versions: "), "{why}");
    reg.unregister();
    wait_for("the widgets unhealthy", Duration::from_secs(5), || {
        counts() == (Some(2), Some(0))
    });
    assert!(m.plugins().is_empty());
    drop(rt);
}

/// A claim's CSI volume whose publish fails is left staged (it never reaches the actual state);
/// when the pod goes, the volume manager still has the driver undo it, from vol_data.json.
#[test]
fn a_csi_volume_whose_publish_failed_is_unstaged_when_its_pod_goes() {
    use ferrolet::objects::{claims::BoundClaim, VolumeObjects};
    use ferrolet::volumemanager::VolumeManager;
    let t = tempfile::tempdir().unwrap();
    let _mounts = MountGuard(t.path().to_path_buf());
    let rt = runtime();
    let root = t.path().join("root");
    let plugin = TestCsiPlugin::start(
        &ferrolet::pluginmanager::registry_dir(&root),
        &t.path().join("plugin"),
        "failing.csi.test",
        Options {
            fail_publish: true,
            ..Options::default()
        },
    );
    let (_m, c) = client_for(&rt, &root, &plugin);
    plugin.volume("vol-3");
    let pods = root.join("pods");
    let vm = VolumeManager::new(&pods);
    vm.set_csi(c);
    let p: Arc<k8s_openapi::api::core::v1::Pod> = Arc::new(
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u4"},
            "spec": {"containers": [{"name": "c"}], "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "c"}}]}
        }))
        .unwrap(),
    );
    let mut objects = VolumeObjects::default();
    objects.claims.insert(
        "data".into(),
        Ok(Arc::new(BoundClaim {
            claim: serde_json::from_value(serde_json::json!({"metadata": {"name": "c", "namespace": "ns"}})).unwrap(),
            volume: serde_json::from_value(serde_json::json!({"metadata": {"name": "pv-3"}, "spec": {
                "accessModes": ["ReadWriteOnce"],
                "csi": {"driver": "failing.csi.test", "volumeHandle": "vol-3"}}}))
            .unwrap(),
        })),
    );
    let pod_dir = pods.join("u4");
    let facts = ferrolet::pod::fieldpath::PodFacts::default();
    let e = vm
        .mount_pod(&p, &pod_dir, &facts, &objects, None, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(
            "MountVolume.SetUp failed for volume \"data\" : NodePublishVolume of CSI driver \"failing.csi.test\" failed: rpc error: code = Internal"
        ),
        "{e}"
    );
    let staging = csi::staging_path(&root, "failing.csi.test", "vol-3");
    assert!(is_mount_point(&staging));
    vm.unmount_pod("u4", &pod_dir).unwrap();
    assert!(!is_mount_point(&staging));
    assert!(!staging.parent().unwrap().exists());
    assert!(!pod_dir.join("volumes").exists());
    assert!(plugin.calls().iter().any(|c| c.starts_with("NodeUnstageVolume vol-3 ")));
    drop(rt);
}

/// kubelet's fsGroup on CSI volumes: with no CSIDriver (policy ReadWriteOnceWithFSType), a
/// writable ReadWriteOnce volume with an fsType gets the pod's fsGroup once published; a
/// read-only one is left as the driver made it.
#[test]
fn a_writable_csi_volume_gets_the_pods_fs_group() {
    use ferrolet::objects::{claims::BoundClaim, VolumeObjects};
    use ferrolet::volumemanager::VolumeManager;
    use std::os::unix::fs::MetadataExt;
    let t = tempfile::tempdir().unwrap();
    let _mounts = MountGuard(t.path().to_path_buf());
    let rt = runtime();
    let root = t.path().join("root");
    let plugin = TestCsiPlugin::start(
        &ferrolet::pluginmanager::registry_dir(&root),
        &t.path().join("plugin"),
        "group.csi.test",
        Options::default(),
    );
    let (_m, c) = client_for(&rt, &root, &plugin);
    let (rw, ro) = (plugin.volume("vol-rw"), plugin.volume("vol-ro"));
    std::fs::write(rw.join("f"), "x").unwrap();
    let pods = root.join("pods");
    let vm = VolumeManager::new(&pods);
    vm.set_csi(c);
    let p: Arc<k8s_openapi::api::core::v1::Pod> = Arc::new(
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u7"},
            "spec": {"securityContext": {"fsGroup": 4321}, "containers": [{"name": "c"}], "volumes": [
                {"name": "rw", "persistentVolumeClaim": {"claimName": "rw"}},
                {"name": "ro", "persistentVolumeClaim": {"claimName": "ro", "readOnly": true}}]}
        }))
        .unwrap(),
    );
    let claim = |name: &str, handle: &str| -> ferrolet::objects::claims::ClaimLookup {
        Ok(Arc::new(BoundClaim {
            claim: serde_json::from_value(serde_json::json!({"metadata": {"name": name, "namespace": "ns"}})).unwrap(),
            volume: serde_json::from_value(serde_json::json!({"metadata": {"name": format!("pv-{name}")}, "spec": {
                "accessModes": ["ReadWriteOnce"],
                "csi": {"driver": "group.csi.test", "volumeHandle": handle, "fsType": "ext4"}}}))
            .unwrap(),
        }))
    };
    let mut objects = VolumeObjects::default();
    objects.claims.insert("rw".into(), claim("rw", "vol-rw"));
    objects.claims.insert("ro".into(), claim("ro", "vol-ro"));
    let pod_dir = pods.join("u7");
    let facts = ferrolet::pod::fieldpath::PodFacts::default();
    let before = std::fs::metadata(&ro).unwrap().gid();
    let hosts = vm.mount_pod(&p, &pod_dir, &facts, &objects, None, None).unwrap();
    assert!(is_mount_point(&hosts["rw"].path));
    assert_eq!(std::fs::metadata(&rw).unwrap().gid(), 4321);
    assert_eq!(std::fs::metadata(rw.join("f")).unwrap().gid(), 4321);
    assert!(hosts["ro"].readonly);
    assert_eq!(
        std::fs::metadata(&ro).unwrap().gid(),
        before,
        "a read-only volume is not re-owned"
    );
    vm.unmount_pod("u7", &pod_dir).unwrap();
    assert!(!is_mount_point(&hosts["rw"].path));
    drop(rt);
}

/// A CSI PersistentVolume's nodePublishSecretRef (in a namespace of its own) reaches the
/// driver's NodePublishVolume as kubelet hands it (each key, its value); a Secret that does
/// not exist fails the volume naming the reference.
#[test]
fn a_csi_persistent_volumes_secret_reaches_the_driver() {
    use ferrolet::objects::{claims::BoundClaim, VolumeObjects};
    use ferrolet::volumemanager::VolumeManager;
    let t = tempfile::tempdir().unwrap();
    let _mounts = MountGuard(t.path().to_path_buf());
    let rt = runtime();
    let root = t.path().join("root");
    let plugin = TestCsiPlugin::start(
        &ferrolet::pluginmanager::registry_dir(&root),
        &t.path().join("plugin"),
        "secret.csi.test",
        Options::default(),
    );
    let (_m, c) = client_for(&rt, &root, &plugin);
    plugin.volume("vol-s");
    let pods = root.join("pods");
    let vm = VolumeManager::new(&pods);
    vm.set_csi(c);
    let p: Arc<k8s_openapi::api::core::v1::Pod> = Arc::new(
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u8"},
            "spec": {"containers": [{"name": "c"}], "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}
        }))
        .unwrap(),
    );
    let mut objects = VolumeObjects::default();
    objects.claims.insert(
        "data".into(),
        Ok(Arc::new(BoundClaim {
            claim: serde_json::from_value(serde_json::json!({"metadata": {"name": "data", "namespace": "ns"}}))
                .unwrap(),
            volume: serde_json::from_value(serde_json::json!({"metadata": {"name": "pv-s"}, "spec": {
                "accessModes": ["ReadWriteOnce"],
                "csi": {"driver": "secret.csi.test", "volumeHandle": "vol-s",
                    "nodePublishSecretRef": {"namespace": "storage", "name": "creds"}}}}))
            .unwrap(),
        })),
    );
    let pod_dir = pods.join("u8");
    let facts = ferrolet::pod::fieldpath::PodFacts::default();
    let key = ("storage".to_string(), "creds".to_string());
    objects.pv_secrets.insert(key.clone(), Ok(None));
    let e = vm
        .mount_pod(&p, &pod_dir, &facts, &objects, None, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.ends_with("fetching NodePublishSecretRef storage/creds failed: secret not found"),
        "{e}"
    );
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "creds", "namespace": "storage"}, "data": {"user": "YWRtaW4="}
    }))
    .unwrap();
    objects.pv_secrets.insert(key, Ok(Some(Arc::new(secret))));
    vm.mount_pod(&p, &pod_dir, &facts, &objects, None, None).unwrap();
    let calls = plugin.calls();
    assert!(
        calls
            .iter()
            .any(|c| c.starts_with("NodePublishVolume vol-s ") && c.contains(" secrets=user=admin")),
        "{calls:?}"
    );
    // Published, the volume does not wait on its Secret again: the next syncs while the API
    // server cannot be reached keep it as it is.
    objects.pv_secrets.insert(
        ("storage".to_string(), "creds".to_string()),
        Err("connection refused".into()),
    );
    vm.mount_pod(&p, &pod_dir, &facts, &objects, None, None)
        .expect("a published volume does not need its Secret again");
    vm.unmount_pod("u8", &pod_dir).unwrap();
    drop(rt);
}
