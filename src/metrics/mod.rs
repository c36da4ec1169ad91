//! kubelet's own metrics (pkg/kubelet/metrics): the families served on `/metrics` and the prober's
//! on `/metrics/probes`, with kubelet's names, labels and buckets so dashboards and alerts written
//! for kubelet work unchanged. Instrumented code calls [`global()`]; kubelet keeps these in a
//! process-wide registry too (component-base's legacyregistry), and the agent has one node.
//!
//! Gauges that describe state (running pods and containers, desired pods, the process) are set
//! from the pod table and /proc when scraped ([`KubeletMetrics::encode`]), so they are never
//! stale and nothing has to keep them in step. Exposition is the `prometheus` crate's text
//! format (0.0.4), the format kubelet serves; the stats endpoints use the same crate.

mod process;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use prometheus::core::Collector;
use prometheus::{
    exponential_buckets, Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The content type of what [`KubeletMetrics::encode`] writes.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// kubelet's podStartupDurationBuckets.
const POD_START_BUCKETS: [f64; 25] = [
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0,
    600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];

/// client-go's request latency buckets.
const REST_BUCKETS: [f64; 12] = [0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0];

/// kubelet_http_requests_* labels (pkg/kubelet/server/metrics).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct HttpRequest {
    pub method: String,
    pub path: String,
    pub server_type: String,
    pub long_running: String,
}

impl HttpRequest {
    fn values(&self) -> [&str; 4] {
        [&self.method, &self.path, &self.server_type, &self.long_running]
    }
}

/// prober_probe_total's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct ProbeResult {
    pub probe_type: String,
    pub result: String,
    pub container: String,
    pub pod: String,
    pub namespace: String,
    pub pod_uid: String,
}

/// What the pod table says when scraped (see [`KubeletMetrics::encode`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct PodCounts {
    /// Pods with a running container.
    pub running_pods: i64,
    pub containers_running: i64,
    pub containers_exited: i64,
    pub containers_created: i64,
    pub containers_unknown: i64,
    pub desired_static: i64,
    pub desired_api: i64,
    pub mirror_pods: i64,
}

pub struct KubeletMetrics {
    registry: Registry,
    probes_registry: Registry,
    node_name: IntGaugeVec,
    running_pods: IntGauge,
    running_containers: IntGaugeVec,
    desired_pods: IntGaugeVec,
    mirror_pods: IntGauge,
    pod_start_duration: Histogram,
    pod_worker_duration: HistogramVec,
    pod_worker_start_duration: Histogram,
    runtime_operations: IntCounterVec,
    runtime_operations_duration: HistogramVec,
    runtime_operations_errors: IntCounterVec,
    cgroup_manager_duration: HistogramVec,
    started_pods: IntCounter,
    started_pods_errors: IntCounter,
    started_containers: IntCounterVec,
    started_containers_errors: IntCounterVec,
    http_requests: IntCounterVec,
    http_requests_duration: HistogramVec,
    http_inflight: IntGaugeVec,
    rest_requests: IntCounterVec,
    rest_duration: HistogramVec,
    rest_rate_limiter: HistogramVec,
    probe_total: IntCounterVec,
    probe_duration: HistogramVec,
    graceful_shutdown_start: Gauge,
    graceful_shutdown_end: Gauge,
    events_dropped: IntCounter,
    process: process::ProcessMetrics,
}

/// The agent's metrics.
pub fn global() -> &'static KubeletMetrics {
    static M: OnceLock<KubeletMetrics> = OnceLock::new();
    M.get_or_init(KubeletMetrics::new)
}

/// Metric definitions are constants: a bad one is a programming error caught by any test.
fn valid<T>(r: prometheus::Result<T>) -> T {
    r.expect("a valid metric definition")
}

fn histogram(name: &str, help: &str, buckets: &[f64]) -> Histogram {
    valid(Histogram::with_opts(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
    ))
}

fn histogram_vec(name: &str, help: &str, buckets: Vec<f64>, labels: &[&str]) -> HistogramVec {
    valid(HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets),
        labels,
    ))
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    valid(IntCounterVec::new(Opts::new(name, help), labels))
}

fn gauge_vec(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    valid(IntGaugeVec::new(Opts::new(name, help), labels))
}

impl KubeletMetrics {
    fn new() -> KubeletMetrics {
        let def = prometheus::DEFAULT_BUCKETS.to_vec();
        let op = &["operation_type"];
        let http = &["method", "path", "server_type", "long_running"];
        let m = KubeletMetrics {
            registry: Registry::new(),
            probes_registry: Registry::new(),
            node_name: gauge_vec("kubelet_node_name", "The node's name. The count is always 1.", &["node"]),
            running_pods: valid(IntGauge::new(
                "kubelet_running_pods",
                "Number of pods that have a running pod sandbox",
            )),
            running_containers: gauge_vec(
                "kubelet_running_containers",
                "Number of containers currently running",
                &["container_state"],
            ),
            desired_pods: gauge_vec(
                "kubelet_desired_pods",
                "The number of pods the kubelet is being instructed to run. static is true if the pod is not from the apiserver.",
                &["static"],
            ),
            mirror_pods: valid(IntGauge::new(
                "kubelet_mirror_pods",
                "The number of mirror pods the kubelet will try to create (one per admitted static pod)",
            )),
            pod_start_duration: histogram(
                "kubelet_pod_start_duration_seconds",
                "Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
                &POD_START_BUCKETS,
            ),
            pod_worker_duration: histogram_vec(
                "kubelet_pod_worker_duration_seconds",
                "Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync",
                def.clone(),
                op,
            ),
            pod_worker_start_duration: histogram(
                "kubelet_pod_worker_start_duration_seconds",
                "Duration in seconds from kubelet seeing a pod to starting a worker.",
                &def,
            ),
            runtime_operations: counter_vec(
                "kubelet_runtime_operations_total",
                "Cumulative number of runtime operations by operation type.",
                op,
            ),
            runtime_operations_duration: histogram_vec(
                "kubelet_runtime_operations_duration_seconds",
                "Duration in seconds of runtime operations. Broken down by operation type.",
                valid(exponential_buckets(0.005, 2.5, 14)),
                op,
            ),
            runtime_operations_errors: counter_vec(
                "kubelet_runtime_operations_errors_total",
                "Cumulative number of runtime operation errors by operation type.",
                op,
            ),
            cgroup_manager_duration: histogram_vec(
                "kubelet_cgroup_manager_duration_seconds",
                "Duration in seconds for cgroup manager operations. Broken down by method.",
                def.clone(),
                op,
            ),
            started_pods: valid(IntCounter::new(
                "kubelet_started_pods_total",
                "Cumulative number of pods started",
            )),
events_dropped: valid(IntCounter::new(
                "ferrolet_events_dropped_total",
                "Events dropped before reaching the API server because the queue to it was full (the oldest waiting goes first). kubelet has no such metric; client-go only logs.",
            )),
                        started_pods_errors: valid(IntCounter::new(
                "kubelet_started_pods_errors_total",
                "Cumulative number of errors when starting pods",
            )),
            started_containers: counter_vec(
                "kubelet_started_containers_total",
                "Cumulative number of containers started",
                &["container_type"],
            ),
            started_containers_errors: counter_vec(
                "kubelet_started_containers_errors_total",
                "Cumulative number of errors when starting containers",
                &["container_type", "code"],
            ),
            http_requests: counter_vec(
                "kubelet_http_requests_total",
                "Number of the http requests received since the server started",
                http,
            ),
            http_requests_duration: histogram_vec(
                "kubelet_http_requests_duration_seconds",
                "Duration in seconds to serve http requests",
                def.clone(),
                http,
            ),
            http_inflight: gauge_vec(
                "kubelet_http_inflight_requests",
                "Number of the inflight http requests",
                http,
            ),
            rest_requests: counter_vec(
                "rest_client_requests_total",
                "Number of HTTP requests, partitioned by status code, method, and host.",
                &["code", "host", "method"],
            ),
            rest_duration: histogram_vec(
                "rest_client_request_duration_seconds",
                "Request latency in seconds. Broken down by verb, and host.",
                REST_BUCKETS.to_vec(),
                &["verb", "host"],
            ),
            rest_rate_limiter: histogram_vec(
                "rest_client_rate_limiter_duration_seconds",
                "Client side rate limiter latency in seconds. Broken down by verb, and host.",
                REST_BUCKETS.to_vec(),
                &["verb", "host"],
            ),
            probe_total: counter_vec(
                "prober_probe_total",
                "Cumulative number of a liveness, readiness or startup probe for a container by result.",
                &["probe_type", "result", "container", "pod", "namespace", "pod_uid"],
            ),
            probe_duration: histogram_vec(
                "prober_probe_duration_seconds",
                "Duration in seconds for a probe response.",
                def,
                &["probe_type", "container", "pod", "namespace"],
            ),
            graceful_shutdown_start: valid(Gauge::new(
                "kubelet_graceful_shutdown_start_time_seconds",
                "Last graceful shutdown start time since unix epoch in seconds",
            )),
            graceful_shutdown_end: valid(Gauge::new(
                "kubelet_graceful_shutdown_end_time_seconds",
                "Last graceful shutdown end time since unix epoch in seconds",
            )),
            process: process::ProcessMetrics::new(),
        };
        let main: [Box<dyn Collector>; 25] = [
            Box::new(m.node_name.clone()),
            Box::new(m.running_pods.clone()),
            Box::new(m.running_containers.clone()),
            Box::new(m.desired_pods.clone()),
            Box::new(m.mirror_pods.clone()),
            Box::new(m.pod_start_duration.clone()),
            Box::new(m.pod_worker_duration.clone()),
            Box::new(m.pod_worker_start_duration.clone()),
            Box::new(m.runtime_operations.clone()),
            Box::new(m.runtime_operations_duration.clone()),
            Box::new(m.runtime_operations_errors.clone()),
            Box::new(m.cgroup_manager_duration.clone()),
            Box::new(m.started_pods.clone()),
            Box::new(m.started_pods_errors.clone()),
            Box::new(m.started_containers.clone()),
            Box::new(m.started_containers_errors.clone()),
            Box::new(m.http_requests.clone()),
            Box::new(m.http_requests_duration.clone()),
            Box::new(m.http_inflight.clone()),
            Box::new(m.rest_requests.clone()),
            Box::new(m.rest_duration.clone()),
            Box::new(m.rest_rate_limiter.clone()),
            Box::new(m.graceful_shutdown_start.clone()),
            Box::new(m.graceful_shutdown_end.clone()),
            Box::new(m.events_dropped.clone()),
        ];
        for c in main {
            valid(m.registry.register(c));
        }
        m.process.register(&m.registry);
        valid(m.probes_registry.register(Box::new(m.probe_total.clone())));
        valid(m.probes_registry.register(Box::new(m.probe_duration.clone())));
        m
    }

    /// `/metrics`: set the state gauges from `counts` and the process, then encode.
    pub fn encode(&self, node: &str, counts: &PodCounts) -> String {
        // The node's name never changes while the agent runs: set, never reset (a reset
        // would let a concurrent scrape miss the series).
        self.node_name.with_label_values(&[node]).set(1);
        self.running_pods.set(counts.running_pods);
        for (state, n) in [
            ("running", counts.containers_running),
            ("exited", counts.containers_exited),
            ("created", counts.containers_created),
            ("unknown", counts.containers_unknown),
        ] {
            self.running_containers.with_label_values(&[state]).set(n);
        }
        for (s, n) in [("true", counts.desired_static), ("false", counts.desired_api)] {
            self.desired_pods.with_label_values(&[s]).set(n);
        }
        self.mirror_pods.set(counts.mirror_pods);
        self.process.refresh();
        encode(&self.registry)
    }

    /// `/metrics/probes`.
    pub fn encode_probes(&self) -> String {
        encode(&self.probes_registry)
    }

    /// A pod worker's round: `operation_type` is create, update, sync or kill.
    pub fn pod_worker_round(&self, operation_type: &str, took: Duration) {
        self.pod_worker_duration
            .with_label_values(&[operation_type])
            .observe(took.as_secs_f64());
    }

    pub fn pod_worker_started(&self, since_seen: Duration) {
        self.pod_worker_start_duration.observe(since_seen.as_secs_f64());
    }

    /// A pod reached Running for the first time, `since_seen` after the agent first saw it.
    pub fn pod_started(&self, since_seen: Duration) {
        self.pod_start_duration.observe(since_seen.as_secs_f64());
    }

    /// A runtime operation (CRI's names: create_container, start_container, stop_container,
    /// remove_container, run_podsandbox, exec_sync, exec, attach, port_forward) ended after
    /// `took`, failed or not.
    pub fn runtime_operation(&self, operation_type: &str, took: Duration, failed: bool) {
        let l = &[operation_type];
        self.runtime_operations.with_label_values(l).inc();
        self.runtime_operations_duration
            .with_label_values(l)
            .observe(took.as_secs_f64());
        if failed {
            self.runtime_operations_errors.with_label_values(l).inc();
        }
    }

    /// Time a runtime operation.
    pub async fn time_runtime<T, E>(
        &self,
        operation_type: &str,
        f: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let t = Instant::now();
        let r = f.await;
        self.runtime_operation(operation_type, t.elapsed(), r.is_err());
        r
    }

    /// A cgroup manager operation (create, update, destroy).
    pub fn cgroup_operation(&self, operation_type: &str, took: Duration) {
        self.cgroup_manager_duration
            .with_label_values(&[operation_type])
            .observe(took.as_secs_f64());
    }

    /// An event was dropped because the queue to the API server was full.
    pub fn event_dropped(&self) {
        self.events_dropped.inc();
    }

    /// A pod sandbox was started (or failed to be).
    pub fn pod_sandbox_started(&self, ok: bool) {
        self.started_pods.inc();
        if !ok {
            self.started_pods_errors.inc();
        }
    }

    /// A container was started; `container_type` is container, init_container or
    /// ephemeral_container; `error_code` the failure's reason when it failed.
    pub fn container_started(&self, container_type: &str, error_code: Option<&str>) {
        self.started_containers.with_label_values(&[container_type]).inc();
        if let Some(code) = error_code {
            self.started_containers_errors
                .with_label_values(&[container_type, code])
                .inc();
        }
    }

    /// An HTTP request of the kubelet API began; the returned guard records it when dropped.
    pub fn http_request(&self, labels: HttpRequest) -> HttpTimer<'_> {
        self.http_inflight.with_label_values(&labels.values()).inc();
        HttpTimer {
            m: self,
            labels,
            start: Instant::now(),
        }
    }

    /// A request to the API server ended with `code` ("<error>" when no answer came).
    pub fn rest_client_request(&self, method: &str, host: &str, code: &str, took: Duration) {
        self.rest_requests.with_label_values(&[code, host, method]).inc();
        self.rest_duration
            .with_label_values(&[method, host])
            .observe(took.as_secs_f64());
    }

    /// How long a request waited for the client's kubeAPIQPS rate limit (0 when it had a token).
    pub fn rest_client_rate_limited(&self, method: &str, host: &str, waited: Duration) {
        self.rest_rate_limiter
            .with_label_values(&[method, host])
            .observe(waited.as_secs_f64());
    }

    /// One probe attempt's result (successful, failed, unknown) and duration.
    pub fn probe(&self, r: ProbeResult, took: Duration) {
        self.probe_duration
            .with_label_values(&[&r.probe_type, &r.container, &r.pod, &r.namespace])
            .observe(took.as_secs_f64());
        self.probe_total
            .with_label_values(&[&r.probe_type, &r.result, &r.container, &r.pod, &r.namespace, &r.pod_uid])
            .inc();
    }

    /// The last graceful node shutdown (src/nodeshutdown/): when it began and when its pods had
    /// stopped, in seconds since the epoch, 0 for none (kubelet's GracefulShutdownStartTime and
    /// GracefulShutdownEndTime). A shutdown that begins sets its start and an end of 0.
    pub fn graceful_shutdown(&self, start_seconds: f64, end_seconds: f64) {
        self.graceful_shutdown_start.set(start_seconds);
        self.graceful_shutdown_end.set(end_seconds);
    }

    /// A probe worker ended: its series go, as kubelet's prober deletes them.
    pub fn forget_probe(&self, probe_type: &str, container: &str, pod: &str, namespace: &str, pod_uid: &str) {
        for result in ["successful", "failed", "unknown"] {
            // Absent series (a result never seen) are fine.
            let _ = self
                .probe_total
                .remove_label_values(&[probe_type, result, container, pod, namespace, pod_uid]);
        }
        let _ = self
            .probe_duration
            .remove_label_values(&[probe_type, container, pod, namespace]);
    }
}

/// Records an HTTP request when dropped (also when the client went away mid-response).
pub struct HttpTimer<'a> {
    m: &'a KubeletMetrics,
    labels: HttpRequest,
    start: Instant,
}

impl Drop for HttpTimer<'_> {
    fn drop(&mut self) {
        let l = self.labels.values();
        self.m.http_inflight.with_label_values(&l).dec();
        self.m.http_requests.with_label_values(&l).inc();
        self.m
            .http_requests_duration
            .with_label_values(&l)
            .observe(self.start.elapsed().as_secs_f64());
    }
}

fn encode(r: &Registry) -> String {
    let mut out = Vec::with_capacity(16 * 1024);
    // Encoding families the registry gathered into memory cannot fail.
    let _ = TextEncoder::new().encode(&r.gather(), &mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// The tracing target of the timestamps along a pod's start (docs/start-path.md): enabled with
/// `RUST_LOG=...,ferrolet::start_phase=debug`, each is one DEBUG event
/// `pod=<name> phase=<phase> at_us=<µs since the epoch>` at the end of that phase; off, each
/// costs one check of the filter. The bench reads them from the agent's log into its per-phase
/// table.
pub const START_PHASE: &str = "ferrolet::start_phase";

/// Note that pod `name` finished start phase `phase` now.
pub fn start_phase(name: &str, phase: &'static str) {
    if tracing::enabled!(target: START_PHASE, tracing::Level::DEBUG) {
        start_phase_at(name, phase, std::time::SystemTime::now());
    }
}

/// Note that pod `name` finished start phase `phase` at `at`.
pub fn start_phase_at(name: &str, phase: &'static str, at: std::time::SystemTime) {
    let at_us = at
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or_default();
    tracing::debug!(target: START_PHASE, pod = %name, phase, at_us, "start phase");
}

/// Whether [`start_phase`] records anything (to skip work done only for it).
pub fn start_phases_enabled() -> bool {
    tracing::enabled!(target: START_PHASE, tracing::Level::DEBUG)
}
