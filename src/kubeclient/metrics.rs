//! client-go's request metrics for every call the node makes to the API server
//! (rest_client_requests_total, rest_client_request_duration_seconds): a tower layer in the
//! node's client stack, inside the rate limit, so the duration is the request's own.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use tower::{Layer, Service};

#[derive(Clone, Debug, Default)]
pub struct RequestMetricsLayer;

impl<S> Layer<S> for RequestMetricsLayer {
    type Service = RequestMetrics<S>;

    fn layer(&self, inner: S) -> RequestMetrics<S> {
        RequestMetrics { inner }
    }
}

#[derive(Clone, Debug)]
pub struct RequestMetrics<S> {
    inner: S,
}

impl<S, B, R> Service<axum::http::Request<B>> for RequestMetrics<S>
where
    S: Service<axum::http::Request<B>, Response = axum::http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: axum::http::Request<B>) -> Self::Future {
        let method = req.method().as_str().to_string();
        let host = req.uri().authority().map(|a| a.to_string()).unwrap_or_default();
        let start = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let r = fut.await;
            let code = match &r {
                Ok(resp) => resp.status().as_u16().to_string(),
                Err(_) => "<error>".to_string(),
            };
            crate::metrics::global().rest_client_request(&method, &host, &code, start.elapsed());
            r
        })
    }
}
