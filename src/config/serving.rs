//! The kubelet API's settings (kubelet's port, TLS, authentication and authorization fields):
//! their defaults and the defaults that depend on the mode (the `authentication` and
//! `authorization` objects are read as every setting is, from [`super::settings`]). A KubeletConfiguration file turns on
//! token review and Webhook authorization, which need an API server; a standalone agent (no
//! kubeconfig) has none to ask, so there they default to off and AlwaysAllow, and an explicit
//! Webhook setting without a kubeconfig is an error naming the field.

use std::net::IpAddr;
#[cfg(test)]
use std::path::Path;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use serde_json::Value;

use super::codec::*;
use super::settings::declare;

/// The lowest TLS version served (kubelet's tlsMinVersion).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsVersion {
    Tls12,
    Tls13,
}

impl TlsVersion {
    pub fn parse(field: &str, s: &str) -> Result<TlsVersion> {
        match s {
            "" | "VersionTLS12" => Ok(TlsVersion::Tls12),
            "VersionTLS13" => Ok(TlsVersion::Tls13),
            "VersionTLS10" | "VersionTLS11" => bail!("{field}: {s} is not served (TLS 1.2 is the lowest version)"),
            other => bail!("{field}: {other:?} is not VersionTLS12 or VersionTLS13"),
        }
    }

    /// kubelet's name for it.
    pub fn name(self) -> &'static str {
        match self {
            TlsVersion::Tls12 => "VersionTLS12",
            TlsVersion::Tls13 => "VersionTLS13",
        }
    }
}

/// How requests to the kubelet API are authorized (kubelet's authorization.mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthzMode {
    AlwaysAllow,
    /// A SubjectAccessReview to the API server.
    Webhook,
}

impl AuthzMode {
    pub fn parse(field: &str, s: &str) -> Result<AuthzMode> {
        match s {
            "AlwaysAllow" => Ok(AuthzMode::AlwaysAllow),
            "Webhook" => Ok(AuthzMode::Webhook),
            other => bail!("{field}: {other:?} is not AlwaysAllow or Webhook"),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            AuthzMode::AlwaysAllow => "AlwaysAllow",
            AuthzMode::Webhook => "Webhook",
        }
    }
}

declare! {
    /// The kubelet API server's settings.
    #[derive(Debug, Clone)]
    pub struct ServingConfig {
        /// The authenticated HTTPS port (kubelet's port).
        #[help = "The authenticated HTTPS port of the kubelet API."]
        #[setting("port" | "port" => Port)]
        pub port: u16 = 10250,
        /// The serving certificate and key (PEM); unset, a self-signed pair under `<root>/pki`, or
        /// with --rotate-server-certificates a certificate the API server signs.
        #[setting("tlsCertFile" | "tls-cert-file" => OptPathNonEmpty)]
        pub tls_cert_file: Option<PathBuf> = None,
        /// The serving certificate's private key (PEM), with --tls-cert-file.
        #[setting("tlsPrivateKeyFile" | "tls-private-key-file" => OptPathNonEmpty)]
        pub tls_private_key_file: Option<PathBuf> = None,
        #[help = "VersionTLS12 or VersionTLS13."]
        #[setting("tlsMinVersion" | "tls-min-version" => TlsMin)]
        pub tls_min_version: TlsVersion = TlsVersion::Tls12,
        /// Request the serving certificate from the cluster and rotate it (kubelet's
        /// serverTLSBootstrap, --rotate-server-certificates).
        #[help = "Request the serving certificate from the cluster and rotate it (serverTLSBootstrap)."]
        #[setting("serverTLSBootstrap" | "rotate-server-certificates" => Bool)]
        pub server_tls_bootstrap: bool = false,
        /// The plain `/healthz` port; 0 turns it off.
        #[help = "The plain /healthz port (0: off)."]
        #[setting("healthzPort" | "healthz-port" => Port)]
        pub healthz_port: u16 = 10248,
        /// Where the plain /healthz port listens.
        #[setting("healthzBindAddress" | "healthz-bind-address" => Ip)]
        pub healthz_bind_address: IpAddr = IpAddr::from([127, 0, 0, 1]),
        /// CA bundle client certificates are verified against (authentication.x509.clientCAFile);
        /// unset, client certificates are not asked for.
        #[help = "CA bundle client certificates are verified against."]
        #[setting("authentication.x509.clientCAFile" | "client-ca-file" => OptPathNonEmpty)]
        pub client_ca_file: Option<PathBuf> = None,
        /// Bearer tokens checked with a TokenReview (authentication.webhook.enabled); `None`: the
        /// mode's default ([`ServingConfig::token_webhook`]).
        #[help = "Check bearer tokens with a TokenReview."]
        #[setting("authentication.webhook.enabled" | "authentication-token-webhook" => OptBool)]
        pub authn_webhook: Option<bool> = None,
        /// How long a TokenReview's answer is kept.
        #[setting("authentication.webhook.cacheTTL" | "authentication-token-webhook-cache-ttl" => Dur)]
        pub authn_webhook_cache_ttl: Duration = Duration::from_secs(120),
        /// Requests with no credential are served as system:anonymous (authentication.anonymous).
        #[help = "Serve requests without credentials as system:anonymous."]
        #[setting("authentication.anonymous.enabled" | "anonymous-auth" => Bool)]
        pub anonymous_auth: bool = false,
        /// `None`: the mode's default ([`ServingConfig::authz_mode`]).
        #[help = "AlwaysAllow or Webhook."]
        #[setting("authorization.mode" | "authorization-mode" => Authz)]
        pub authz_mode: Option<AuthzMode> = None,
        /// How long a SubjectAccessReview's "allowed" is kept.
        #[setting("authorization.webhook.cacheAuthorizedTTL" | "authorization-webhook-cache-authorized-ttl" => Dur)]
        pub authz_cache_authorized_ttl: Duration = Duration::from_secs(300),
        /// How long a SubjectAccessReview's "denied" is kept.
        #[setting("authorization.webhook.cacheUnauthorizedTTL" | "authorization-webhook-cache-unauthorized-ttl" => Dur)]
        pub authz_cache_unauthorized_ttl: Duration = Duration::from_secs(30),
        /// Serve the debugging routes (exec, attach, port-forward, run, container and node logs,
        /// /runningpods/, /configz) on the kubelet port; off, they answer 405 "Debug endpoints are
        /// disabled." as kubelet's (enableDebuggingHandlers, --enable-debugging-handlers).
        #[help = "Serve exec, attach, port-forward, run and the logs (kubelet's default true)."]
        #[setting("enableDebuggingHandlers" | "enable-debugging-handlers" => Bool)]
        pub enable_debugging_handlers: bool = true,
    }
}

impl ServingConfig {
    /// Whether bearer tokens are reviewed: as set, else on in a cluster and off standalone.
    pub fn token_webhook(&self, in_cluster: bool) -> bool {
        self.authn_webhook.unwrap_or(in_cluster)
    }

    /// The authorization mode: as set, else Webhook in a cluster and AlwaysAllow standalone.
    pub fn authz_mode(&self, in_cluster: bool) -> AuthzMode {
        self.authz_mode.unwrap_or(if in_cluster {
            AuthzMode::Webhook
        } else {
            AuthzMode::AlwaysAllow
        })
    }

    /// Checks across fields; `in_cluster`: a kubeconfig is configured.
    pub fn validate(&self, in_cluster: bool) -> Result<()> {
        if self.port == 0 {
            bail!("port: must be between 1 and 65535");
        }
        match (&self.tls_cert_file, &self.tls_private_key_file) {
            (Some(_), None) => bail!("tlsPrivateKeyFile: must be set with tlsCertFile"),
            (None, Some(_)) => bail!("tlsCertFile: must be set with tlsPrivateKeyFile"),
            _ => {}
        }
        if !in_cluster {
            if self.authn_webhook == Some(true) {
                bail!("authentication.webhook.enabled: token review needs an API server (--kubeconfig)");
            }
            if self.authz_mode == Some(AuthzMode::Webhook) {
                bail!("authorization.mode: Webhook needs an API server (--kubeconfig); use AlwaysAllow");
            }
            if self.server_tls_bootstrap {
                bail!("serverTLSBootstrap: requesting a serving certificate needs an API server (--kubeconfig)");
            }
        }
        if self.server_tls_bootstrap && self.tls_cert_file.is_some() {
            bail!("serverTLSBootstrap: conflicts with tlsCertFile (the certificate comes from the cluster)");
        }
        for (f, d) in [
            ("authentication.webhook.cacheTTL", self.authn_webhook_cache_ttl),
            (
                "authorization.webhook.cacheAuthorizedTTL",
                self.authz_cache_authorized_ttl,
            ),
            (
                "authorization.webhook.cacheUnauthorizedTTL",
                self.authz_cache_unauthorized_ttl,
            ),
        ] {
            if d > Duration::from_secs(24 * 3600) {
                bail!("{f}: {}s is longer than a day", d.as_secs());
            }
        }
        Ok(())
    }
}

/// The file's `authentication` object.
/// tlsMinVersion: `VersionTLS12` or `VersionTLS13`.
pub struct TlsMin;
impl Codec for TlsMin {
    const VALUE_NAME: &'static str = "VERSION";
    type T = TlsVersion;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<TlsVersion> {
        TlsVersion::parse(f, &string(f, v)?)
    }
    fn flag(name: &str, vals: &[String]) -> Result<TlsVersion> {
        TlsVersion::parse(&format!("--{name}"), last(vals))
    }
    fn show(t: &TlsVersion) -> Value {
        t.name().into()
    }
}

/// authorization.mode: `AlwaysAllow` or `Webhook`; unset follows the mode.
pub struct Authz;
impl Codec for Authz {
    const VALUE_NAME: &'static str = "MODE";
    type T = Option<AuthzMode>;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<Option<AuthzMode>> {
        AuthzMode::parse(f, &string(f, v)?).map(Some)
    }
    fn flag(name: &str, vals: &[String]) -> Result<Option<AuthzMode>> {
        AuthzMode::parse(&format!("--{name}"), last(vals)).map(Some)
    }
    fn show(t: &Option<AuthzMode>) -> Value {
        t.map_or(Value::Null, |m| m.name().into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_mode() {
        let s = ServingConfig::default();
        assert!(s.token_webhook(true) && !s.token_webhook(false));
        assert_eq!(s.authz_mode(true), AuthzMode::Webhook);
        assert_eq!(s.authz_mode(false), AuthzMode::AlwaysAllow);
        s.validate(false).unwrap();
        s.validate(true).unwrap();
    }

    #[test]
    fn webhook_without_an_api_server_names_the_field() {
        let s = ServingConfig {
            authz_mode: Some(AuthzMode::Webhook),
            ..Default::default()
        };
        let e = s.validate(false).unwrap_err().to_string();
        assert!(e.contains("authorization.mode"), "{e}");
        s.validate(true).unwrap();
        let s = ServingConfig {
            authn_webhook: Some(true),
            ..Default::default()
        };
        let e = s.validate(false).unwrap_err().to_string();
        assert!(e.contains("authentication.webhook.enabled"), "{e}");
        let s = ServingConfig {
            tls_cert_file: Some("/x".into()),
            ..Default::default()
        };
        let e = s.validate(true).unwrap_err().to_string();
        assert!(e.contains("tlsPrivateKeyFile"), "{e}");
    }

    /// The `authentication` and `authorization` objects as the file reader reads them.
    fn read(body: &str) -> Result<ServingConfig> {
        let mut c = super::super::Config::default();
        let text = format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{body}");
        super::super::file::apply_text(&mut c, &text, Path::new("/etc/k"))?;
        Ok(c.serving)
    }

    #[test]
    fn nested_objects_read_with_field_names_in_errors() {
        let s = read("authentication: {x509: {clientCAFile: ca.crt}, webhook: {enabled: true, cacheTTL: 1m}, anonymous: {enabled: true}}\n").unwrap();
        assert_eq!(s.client_ca_file.as_deref(), Some(Path::new("/etc/k/ca.crt")));
        assert_eq!(s.authn_webhook, Some(true));
        assert_eq!(s.authn_webhook_cache_ttl, Duration::from_secs(60));
        assert!(s.anonymous_auth);
        let s = read("authorization: {mode: Webhook, webhook: {cacheAuthorizedTTL: 1s, cacheUnauthorizedTTL: 2s}}\n")
            .unwrap();
        assert_eq!(s.authz_mode, Some(AuthzMode::Webhook));
        assert_eq!(s.authz_cache_authorized_ttl, Duration::from_secs(1));
        assert_eq!(s.authz_cache_unauthorized_ttl, Duration::from_secs(2));
        let e = read("authorization: {mode: RBAC}\n").unwrap_err().to_string();
        assert!(e.contains("authorization.mode"), "{e}");
        let e = read("authentication: {webhook: {cacheTTL: soon}}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("authentication.webhook.cacheTTL"), "{e}");
        let e = read("authentication: {oidc: {}}\n").unwrap_err().to_string();
        assert!(e.contains("authentication.oidc"), "{e}");
        assert!(TlsVersion::parse("tlsMinVersion", "VersionTLS11").is_err());
        assert_eq!(
            TlsVersion::parse("tlsMinVersion", "VersionTLS13").unwrap(),
            TlsVersion::Tls13
        );
    }
}
