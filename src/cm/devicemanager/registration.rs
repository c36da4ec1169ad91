//! kubelet's device plugin registration server: the Registration service on
//! `<device plugin dir>/kubelet.sock`. A plugin names its version (v1beta1), its socket in the
//! directory and the extended resource it serves; a good request is answered at once and the
//! plugin is then dialled and watched in the background, as kubelet does. A bad one is refused
//! with a message naming the field.

use anyhow::{Context, Result};
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::endpoint::{connect, list_and_watch, options};
use super::{is_extended_resource_name, DeviceManager};
use crate::apis::deviceplugin::v1beta1::registration_server::{Registration, RegistrationServer};
use crate::apis::deviceplugin::v1beta1::{Empty, RegisterRequest, KUBELET_SOCKET, VERSION};

struct Registrar {
    m: DeviceManager,
}

/// Why `r` is refused, if it is.
pub fn check(r: &RegisterRequest) -> Result<(), String> {
    if r.version != VERSION {
        return Err(format!(
            "version: the device plugin version {:?} is not supported; supported versions are [{VERSION}]",
            r.version
        ));
    }
    if !is_extended_resource_name(&r.resource_name) {
        return Err(format!(
            "resource_name: {:?} is not an extended resource name (vendor-domain/resource)",
            r.resource_name
        ));
    }
    let plain = !r.endpoint.is_empty()
        && !r.endpoint.contains('/')
        && r.endpoint != "."
        && r.endpoint != ".."
        && r.endpoint != KUBELET_SOCKET;
    if !plain {
        return Err(format!(
            "endpoint: {:?} is not the name of a socket in the device plugin directory",
            r.endpoint
        ));
    }
    Ok(())
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let r = request.into_inner();
        if let Err(why) = check(&r) {
            warn!(resource = %r.resource_name, endpoint = %r.endpoint, "device plugin refused: {why}");
            return Err(Status::invalid_argument(why));
        }
        info!(resource = %r.resource_name, endpoint = %r.endpoint, "device plugin registered");
        let m = self.m.clone();
        tokio::spawn(async move {
            let socket = m.dir().join(&r.endpoint);
            match connect(&socket).await {
                // kubelet asks the plugin for its options when it connects; a plugin that
                // cannot say them is not used.
                Ok(mut client) => match options(&mut client).await {
                    Ok(opts) => {
                        info!(
                            resource = %r.resource_name,
                            pre_start_required = opts.pre_start_required,
                            get_preferred_allocation_available = opts.get_preferred_allocation_available,
                            "device plugin connected"
                        );
                        let generation = m.registered(&r.resource_name, &r.endpoint, Some(client.clone()), opts);
                        list_and_watch(m, r.resource_name, generation, client).await;
                    }
                    Err(why) => warn!(
                        resource = %r.resource_name,
                        socket = %socket.display(),
                        "device plugin not used: GetDevicePluginOptions {why}"
                    ),
                },
                Err(e) => warn!(
                    resource = %r.resource_name,
                    socket = %socket.display(),
                    error = %ferrolet_fsutil::chain(&e),
                    "device plugin: cannot reach its socket"
                ),
            }
        });
        Ok(Response::new(Empty {}))
    }
}

/// Serve the Registration service on the manager's `kubelet.sock` (made anew; the directory is
/// made if missing), in the background.
pub async fn serve(m: DeviceManager) -> Result<()> {
    let socket = m.dir().join(KUBELET_SOCKET);
    let incoming = crate::apis::listen(&socket).with_context(|| format!("listening on {}", socket.display()))?;
    info!(socket = %socket.display(), "device plugin registration listening");
    tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Registrar { m }))
            .serve_with_incoming(incoming)
            .await;
        if let Err(e) = served {
            warn!(error = %ferrolet_fsutil::chain(&e), "device plugin registration stopped");
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(version: &str, endpoint: &str, resource: &str) -> RegisterRequest {
        RegisterRequest {
            version: version.into(),
            endpoint: endpoint.into(),
            resource_name: resource.into(),
            options: None,
        }
    }

    #[test]
    fn bad_registrations_name_the_field() {
        assert!(check(&req("v1beta1", "dev.sock", "example.com/dev")).is_ok());
        for (r, field) in [
            (req("v1alpha", "dev.sock", "example.com/dev"), "version:"),
            (req("v1beta1", "dev.sock", "gpu"), "resource_name:"),
            (req("v1beta1", "../dev.sock", "example.com/dev"), "endpoint:"),
            (req("v1beta1", "", "example.com/dev"), "endpoint:"),
            (req("v1beta1", "kubelet.sock", "example.com/dev"), "endpoint:"),
        ] {
            let why = check(&r).unwrap_err();
            assert!(why.starts_with(field), "{why}");
        }
    }
}
