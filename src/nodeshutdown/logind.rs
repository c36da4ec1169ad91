//! systemd-logind on the system bus (org.freedesktop.login1), as kubelet's
//! pkg/kubelet/nodeshutdown/systemd speaks to it: a delay inhibitor lock on shutdown (a file
//! descriptor: the shutdown waits until it is closed, or InhibitDelayMaxSec has passed), the
//! PrepareForShutdown signal, and InhibitDelayMaxSec raised through a logind.conf drop-in that
//! logind reads again on SIGHUP. The bus is the system bus, or `DBUS_SYSTEM_BUS_ADDRESS`.

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use futures::{Stream, StreamExt};
use zbus::proxy::{Builder, CacheProperties};
use zbus::zvariant::OwnedFd;
use zbus::{Connection, Proxy};

const DESTINATION: &str = "org.freedesktop.login1";
const PATH: &str = "/org/freedesktop/login1";
const INTERFACE: &str = "org.freedesktop.login1.Manager";

/// Who takes the lock and why, as `systemd-inhibit --list` shows them.
const WHO: &str = "ferrolet";
const WHY: &str = "Kubelet needs time to handle node shutdown";

/// The drop-in's name (kubelet's is 99-kubelet.conf).
pub const DROP_IN: &str = "99-ferrolet.conf";

/// A connection to logind.
pub struct Logind {
    conn: Connection,
    manager: Proxy<'static>,
}

/// A delay inhibitor lock: the shutdown waits while it is held; dropping it releases it.
pub struct InhibitLock(#[allow(dead_code)] OwnedFd);

impl Logind {
    pub async fn connect() -> Result<Logind> {
        let conn = Connection::system().await.context("connecting to the system bus")?;
        // Never cached: logind announces no change of InhibitDelayMaxUSec when it reloads.
        let manager = Builder::<Proxy>::new(&conn)
            .destination(DESTINATION)?
            .path(PATH)?
            .interface(INTERFACE)?
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .context("logind's manager object")?;
        Ok(Logind { conn, manager })
    }

    /// logind's InhibitDelayMaxSec now.
    pub async fn inhibit_delay_max(&self) -> Result<Duration> {
        let usec: u64 = self
            .manager
            .get_property("InhibitDelayMaxUSec")
            .await
            .context("reading logind's InhibitDelayMaxUSec")?;
        Ok(Duration::from_micros(usec))
    }

    /// Take a delay inhibitor lock on shutdown.
    pub async fn inhibit_shutdown(&self) -> Result<InhibitLock> {
        let fd: OwnedFd = self
            .manager
            .call("Inhibit", &("shutdown", WHO, WHY, "delay"))
            .await
            .context("taking logind's shutdown inhibitor lock")?;
        Ok(InhibitLock(fd))
    }

    /// PrepareForShutdown's argument each time logind sends it: true when a shutdown begins,
    /// false when it was cancelled. The stream ends with the connection.
    pub async fn shutdown_events(&self) -> Result<impl Stream<Item = Result<bool>>> {
        let signals = self
            .manager
            .receive_signal("PrepareForShutdown")
            .await
            .context("subscribing to logind's PrepareForShutdown")?;
        Ok(signals.map(|m| {
            m.body()
                .deserialize::<bool>()
                .map_err(|e| anyhow!("logind's PrepareForShutdown carries no boolean: {e}"))
        }))
    }

    /// Write the drop-in setting InhibitDelayMaxSec to `delay` into `dir` and have logind read
    /// its configuration again: SIGHUP to its unit through systemd (kubelet's
    /// ReloadLogindConf), or, with no systemd on the bus, to the process that owns logind's
    /// bus name.
    pub async fn raise_inhibit_delay(&self, dir: &Path, delay: Duration) -> Result<()> {
        let text = format!(
            "# ferrolet's logind override: pods get shutdownGracePeriod to stop\n[Login]\nInhibitDelayMaxSec={}\n",
            delay.as_secs()
        );
        let (dir, file) = (dir.to_path_buf(), dir.join(DROP_IN));
        crate::tasks::blocking(move || {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            ferrolet_fsutil::write_atomic_mode(&file, text.as_bytes(), 0o644)
                .with_context(|| format!("writing {}", file.display()))
        })
        .await?;
        let systemd = Builder::<Proxy>::new(&self.conn)
            .destination("org.freedesktop.systemd1")?
            .path("/org/freedesktop/systemd1")?
            .interface("org.freedesktop.systemd1.Manager")?
            .cache_properties(CacheProperties::No)
            .build()
            .await?;
        let hup = nix::sys::signal::SIGHUP as i32;
        let by_systemd: zbus::Result<()> = systemd.call("KillUnit", &("systemd-logind.service", "all", hup)).await;
        let Err(e) = by_systemd else { return Ok(()) };
        tracing::debug!(error = %e, "node shutdown manager: systemd did not signal logind; signalling it directly");
        let dbus = zbus::fdo::DBusProxy::new(&self.conn).await?;
        let pid = dbus
            .get_connection_unix_process_id(DESTINATION.try_into()?)
            .await
            .context("finding logind's process")?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::SIGHUP)
            .with_context(|| format!("asking logind (pid {pid}) to reload its configuration"))?;
        Ok(())
    }
}
