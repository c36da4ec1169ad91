//! The crate's error type. Every variant names what was wrong and where: the config file and
//! field, the CNI plugin and its decoded JSON error, the interface, the IP, the nft command. A
//! message read in a pod's status or the agent's log should be enough to act on. `Display`
//! shows one level; where there is a cause it is `source()`: render errors for people with
//! [`ferrolet_fsutil::chain`], which prints each cause once.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

pub(crate) use ferrolet_fsutil::Context;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file, JSON or system-call operation failed: `Display` says what was being done, the
    /// cause is `source()` (print both with [`ferrolet_fsutil::chain`]).
    #[error(transparent)]
    Fs(#[from] ferrolet_fsutil::Error),
    /// A netlink request failed; `errno` is the kernel's answer when there was one.
    #[error("{context}: {reason}")]
    Netlink {
        context: String,
        reason: String,
        errno: Option<i32>,
    },
    /// A setting of [`crate::BridgeConfig`] / [`crate::CniConfig`] or of a request is invalid.
    #[error("invalid network config: {field}: {reason}")]
    InvalidConfig { field: String, reason: String },
    /// A CNI network configuration file is unusable.
    #[error("CNI config {file}: {reason}")]
    CniConfig { file: String, reason: String },
    #[error("CNI plugin {plugin:?} not found in {dirs}")]
    PluginNotFound { plugin: String, dirs: String },
    /// A plugin ran and failed (boxed: it is the largest variant).
    #[error("{0}")]
    Plugin(Box<PluginFailure>),
    #[error("CNI plugin {plugin} {command} timed out after {timeout:?} and was killed")]
    PluginTimeout {
        plugin: String,
        command: String,
        timeout: Duration,
    },
    /// A plugin exited 0 but printed something that is not a result we can use.
    #[error("CNI plugin {plugin} {command}: {reason}")]
    PluginOutput {
        plugin: String,
        command: String,
        reason: String,
    },
    #[error("pod subnet {subnet} overlaps node route {route} via {interface}")]
    SubnetOverlap {
        subnet: String,
        route: String,
        interface: String,
    },
    #[error("IP {ip} is already allocated to sandbox {owner}")]
    IpTaken { ip: IpAddr, owner: String },
    #[error("IP {ip} cannot be allocated from {subnet}: {reason}")]
    IpUnavailable { ip: IpAddr, subnet: String, reason: String },
    #[error("no free IP left in {subnet}")]
    SubnetExhausted { subnet: String },
    #[error("hostPort {host_ip}:{port}/{protocol} is already mapped by sandbox {owner}")]
    HostPortConflict {
        port: u16,
        protocol: String,
        host_ip: String,
        owner: String,
    },
    #[error("nft is not installed (looked for {0}); the bridge mode needs nftables' nft command")]
    NftMissing(String),
    #[error("nft {action} in table {table}: {stderr}")]
    Nft {
        action: String,
        table: String,
        stderr: String,
    },
    #[error("network namespace {path}: {reason}")]
    Netns { path: String, reason: String },
    #[error("sandbox {id}: {reason}")]
    Sandbox { id: String, reason: String },
    #[error("check of sandbox {id} failed: {reason}")]
    Check { id: String, reason: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A CNI plugin that ran and failed: `code`, `msg` and `details` are decoded from the JSON
/// error object it printed (CNI spec "Error"), `exit` is its exit status, `stderr` the tail of
/// what it wrote there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginFailure {
    pub plugin: String,
    pub command: String,
    pub code: u32,
    pub msg: String,
    pub details: String,
    pub exit: String,
    pub stderr: String,
}

impl std::fmt::Display for PluginFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CNI plugin {} {} failed: {}", self.plugin, self.command, self.msg)?;
        if !self.details.is_empty() {
            write!(f, ": {}", self.details)?;
        }
        write!(f, " (code {}, {})", self.code, self.exit)?;
        if !self.stderr.is_empty() {
            write!(f, "; stderr: {}", self.stderr)?;
        }
        Ok(())
    }
}

impl Error {
    pub fn invalid_config(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidConfig {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub fn cni_config(file: &Path, reason: impl Into<String>) -> Self {
        Error::CniConfig {
            file: p(file),
            reason: reason.into(),
        }
    }

    pub fn sandbox(id: &str, reason: impl Into<String>) -> Self {
        Error::Sandbox {
            id: id.to_string(),
            reason: reason.into(),
        }
    }

    pub fn check(id: &str, reason: impl Into<String>) -> Self {
        Error::Check {
            id: id.to_string(),
            reason: reason.into(),
        }
    }

    pub fn netns(path: &Path, reason: impl Into<String>) -> Self {
        Error::Netns {
            path: p(path),
            reason: reason.into(),
        }
    }

    /// The kernel errno behind a netlink or system error, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Netlink { errno, .. } => *errno,
            Error::Fs(e) => e.errno(),
            _ => None,
        }
    }

    /// True when the error is "that object is not there" (file, link, address, route).
    pub fn is_not_found(&self) -> bool {
        match self {
            Error::Fs(e @ ferrolet_fsutil::Error::Io { .. }) => e.is_not_found(),
            _ => matches!(
                self.errno(),
                Some(libc::ENOENT) | Some(libc::ENODEV) | Some(libc::ESRCH) | Some(libc::EADDRNOTAVAIL)
            ),
        }
    }

    /// True when the error is "that object already exists".
    pub(crate) fn is_exists(&self) -> bool {
        self.errno() == Some(libc::EEXIST)
    }
}

/// Attach "what were we doing" to netlink errors (io, json and nix errors take
/// [`ferrolet_fsutil::Context`], re-exported here as `Context`).
pub(crate) trait NlContext<T> {
    fn context<C: Into<String>>(self, context: C) -> Result<T>;
}

impl<T> NlContext<T> for std::result::Result<T, rtnetlink::Error> {
    fn context<C: Into<String>>(self, context: C) -> Result<T> {
        self.map_err(|e| netlink_error(context.into(), e))
    }
}

fn netlink_error(context: String, e: rtnetlink::Error) -> Error {
    match e {
        rtnetlink::Error::NetlinkError(msg) => {
            let errno = msg.code.map(|c| -c.get());
            let reason = match errno {
                Some(n) => std::io::Error::from_raw_os_error(n).to_string(),
                None => "netlink error without code".to_string(),
            };
            Error::Netlink { context, reason, errno }
        }
        other => Error::Netlink {
            context,
            reason: other.to_string(),
            errno: None,
        },
    }
}

/// `path.display()` for messages.
pub(crate) fn p(path: &Path) -> String {
    path.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_error_message_names_plugin_and_decoded_fields() {
        let e = Error::Plugin(Box::new(PluginFailure {
            plugin: "bridge".into(),
            command: "ADD".into(),
            code: 11,
            msg: "failed to allocate".into(),
            details: "range exhausted".into(),
            exit: "exit status 1".into(),
            stderr: String::new(),
        }));
        assert_eq!(
            e.to_string(),
            "CNI plugin bridge ADD failed: failed to allocate: range exhausted (code 11, exit status 1)"
        );
    }

    #[test]
    fn netlink_errno_is_decoded() {
        let mut msg = netlink_packet_core::ErrorMessage::default();
        msg.code = std::num::NonZeroI32::new(-libc::EEXIST);
        let e: Result<()> = Err(rtnetlink::Error::NetlinkError(msg)).context("creating bridge ferrolet0");
        let e = e.unwrap_err();
        assert!(e.is_exists());
        assert!(
            e.to_string().starts_with("creating bridge ferrolet0: File exists"),
            "{e}"
        );
    }
}
