//! kubelet's node plugin APIs (k8s.io/kubelet/pkg/apis), compiled from the .proto files in
//! `proto/` by build.rs: the types and the tonic clients and servers, and the unix sockets
//! they travel over ([`listen`], [`dial`]). The device manager (`cm::devicemanager`) and the
//! pod resources server (`server::podresources`) serve and call them.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Accept connections on a new unix socket at `socket` (its directory made, a stale socket
/// file removed first), as a stream for tonic's `serve_with_incoming`.
pub fn listen(
    socket: &Path,
) -> std::io::Result<impl futures::Stream<Item = std::io::Result<tokio::net::UnixStream>> + Send + 'static> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(socket) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = tokio::net::UnixListener::bind(socket)?;
    Ok(futures::stream::unfold(listener, |l| async move {
        let next = l.accept().await.map(|(s, _)| s);
        Some((next, l))
    }))
}

/// A gRPC channel to the unix socket at `socket`, connected within `timeout`.
pub async fn dial(socket: &Path, timeout: Duration) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path: PathBuf = socket.to_path_buf();
    // The URI is not dialled: every connection is the socket.
    tonic::transport::Endpoint::from_static("http://unix.invalid")
        .connect_timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
}

/// Device plugins (deviceplugin/v1beta1): the Registration service the agent serves on
/// `<device plugin dir>/kubelet.sock` and the DevicePlugin service each plugin serves.
pub mod deviceplugin {
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod v1beta1 {
        tonic::include_proto!("v1beta1");

        /// The version a plugin registers with.
        pub const VERSION: &str = "v1beta1";
        /// A device's health in ListAndWatch.
        pub const HEALTHY: &str = "Healthy";
        pub const UNHEALTHY: &str = "Unhealthy";
        /// The agent's socket in the device plugin directory.
        pub const KUBELET_SOCKET: &str = "kubelet.sock";
    }
}

/// Plugin registration (pluginregistration/v1): what a plugin serves on its socket in the
/// plugin registry directory.
pub mod pluginregistration {
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod v1 {
        tonic::include_proto!("pluginregistration");

        pub const CSI_PLUGIN: &str = "CSIPlugin";
        pub const DEVICE_PLUGIN: &str = "DevicePlugin";
    }
}

/// The Container Storage Interface (csi.v1): the Identity and Node services a CSI driver's
/// node plugin serves on the endpoint it registered through the plugin watcher.
pub mod csi {
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod v1 {
        tonic::include_proto!("csi.v1");

        /// The CSI versions the agent speaks (kubelet's: any 1.x).
        pub const SUPPORTED_MAJOR: u64 = 1;
    }
}

/// Pod resources (podresources/v1): what the agent serves on
/// `<root>/pod-resources/kubelet.sock` to monitoring agents.
pub mod podresources {
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod v1 {
        tonic::include_proto!("v1");
    }
}
