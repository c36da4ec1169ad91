//! The http source (kubelet's staticPodURL / --manifest-url): the URL is fetched every
//! httpCheckFrequency with the configured headers; the body is a pod, a pod list, or several
//! YAML documents. A failed fetch keeps the last pods and is reported; the source sends
//! nothing until its first successful fetch, so pods it owns are never mistaken for orphans.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use http_body_util::{BodyExt, Empty, Limited};
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tracing::warn;

use super::source::{pods_from_manifest, Snapshot, SnapshotSender};
use crate::pod::manifest::Source;

const MAX_BODY: usize = 10 << 20;

pub struct HttpSource {
    url: String,
    headers: Vec<(String, String)>,
    node: String,
    last_good: Option<Vec<Arc<Pod>>>,
}

type Client = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Empty<bytes::Bytes>,
>;

fn client() -> Result<Client> {
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()
        .context("loading the system's TLS root certificates")?
        .https_or_http()
        .enable_http1()
        .build();
    Ok(hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(https))
}

impl HttpSource {
    pub fn new(url: String, headers: Vec<(String, String)>, node: String) -> HttpSource {
        HttpSource {
            url,
            headers,
            node,
            last_good: None,
        }
    }

    async fn fetch(&self, client: &Client) -> Result<String> {
        let mut req = hyper::Request::get(&self.url);
        for (k, v) in &self.headers {
            req = req.header(k, v);
        }
        let req = req.body(Empty::new()).context("building request")?;
        let resp = tokio::time::timeout(Duration::from_secs(30), client.request(req))
            .await
            .map_err(|_| anyhow!("timed out"))?
            .context("request failed")?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| anyhow!(e))
            .context("reading body")?
            .to_bytes();
        if !status.is_success() {
            bail!(
                "server answered {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            );
        }
        String::from_utf8(body.to_vec()).map_err(|_| anyhow!("body is not UTF-8"))
    }

    /// One fetch: `Some(snapshot)` unless the source has never fetched successfully.
    pub async fn poll(&mut self, client: &Client) -> Option<Snapshot> {
        let mut errors = BTreeMap::new();
        match self.fetch(client).await {
            Ok(body) => {
                let (pods, err) = pods_from_manifest(&body, &Source::Url(self.url.clone()), &self.node);
                match err {
                    None => self.last_good = Some(pods),
                    Some(e) => {
                        errors.insert(self.url.clone(), e);
                        if self.last_good.is_none() {
                            self.last_good = Some(pods);
                        }
                    }
                }
            }
            Err(e) => {
                errors.insert(self.url.clone(), format!("fetching {}: {e:#}", self.url));
            }
        }
        let pods = self.last_good.clone()?;
        Some(Snapshot {
            source: "http",
            pods,
            errors,
        })
    }

    pub async fn run(mut self, tx: mpsc::UnboundedSender<Snapshot>, every: Duration) {
        let client = match client() {
            Ok(c) => c,
            Err(e) => {
                warn!(url = %self.url, "manifest URL source disabled: {e:#}");
                return;
            }
        };
        let mut out = SnapshotSender::new(tx);
        loop {
            if let Some(snap) = self.poll(&client).await {
                if !out.send(snap) {
                    return;
                }
            } else {
                warn!(url = %self.url, "manifest URL not reachable yet; retrying");
            }
            tokio::time::sleep(every).await;
        }
    }
}
