//! kubelet's node plugin APIs (k8s.io/kubelet/pkg/apis), compiled from the .proto files in
//! `proto/` by build.rs: the types and the tonic clients and servers. Vocabulary only: the
//! device manager (`cm::devicemanager`) serves and calls them.

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

/// Pod resources (podresources/v1): what the agent serves on
/// `<root>/pod-resources/kubelet.sock` to monitoring agents.
pub mod podresources {
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod v1 {
        tonic::include_proto!("v1");
    }
}
