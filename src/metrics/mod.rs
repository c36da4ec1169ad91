//! kubelet's own metrics (pkg/kubelet/metrics): the families served on `/metrics` and the prober's
//! on `/metrics/probes`, with kubelet's names, labels and buckets so dashboards and alerts written
//! for kubelet work unchanged. Instrumented code calls [`global()`]; kubelet keeps these in a
//! process-wide registry too (component-base's legacyregistry), and the agent has one node.
//!
//! Gauges that describe state (running pods and containers, desired pods, the process) are set
//! from the pod table and /proc when scraped ([`KubeletMetrics::encode`]), so they are never
//! stale and nothing has to keep them in step. Exposition is the `prometheus-client` crate's
//! OpenMetrics text, which Prometheus scrapes as it scrapes kubelet's text format.

mod process;

use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// The content type of what [`KubeletMetrics::encode`] writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Prometheus' default buckets (component-base's DefBuckets).
const DEF_BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// kubelet's podStartupDurationBuckets.
const POD_START_BUCKETS: [f64; 25] = [
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0,
    600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Operation {
    pub operation_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabel {
    node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ContainerState {
    container_state: String,
}

/// `static="true|false"` (a keyword in Rust, so no derived label struct).
type Static = Vec<(String, String)>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ContainerType {
    container_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ContainerError {
    container_type: String,
    code: String,
}

/// kubelet_http_requests_* labels (pkg/kubelet/server/metrics).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpRequest {
    pub method: String,
    pub path: String,
    pub server_type: String,
    pub long_running: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpInflight {
    method: String,
    path: String,
    server_type: String,
    long_running: String,
}

/// prober_probe_total's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeResult {
    pub probe_type: String,
    pub result: String,
    pub container: String,
    pub pod: String,
    pub namespace: String,
    pub pod_uid: String,
}

/// prober_probe_duration_seconds' labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeDuration {
    pub probe_type: String,
    pub container: String,
    pub pod: String,
    pub namespace: String,
}

/// rest_client_requests_total's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RestRequest {
    code: String,
    host: String,
    method: String,
}

/// rest_client_request_duration_seconds' labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RestDuration {
    verb: String,
    host: String,
}

/// client-go's request latency buckets.
const REST_BUCKETS: [f64; 12] = [0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0];

#[derive(Clone)]
struct Buckets(&'static [f64]);

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

#[derive(Clone)]
struct RuntimeBuckets;

impl MetricConstructor<Histogram> for RuntimeBuckets {
    fn new_metric(&self) -> Histogram {
        // kubelet: ExponentialBuckets(.005, 2.5, 14).
        Histogram::new(exponential_buckets(0.005, 2.5, 14))
    }
}

/// What the pod table says when scraped (see [`KubeletMetrics::encode`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct PodCounts {
    /// Pods with a live sandbox or a running container.
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
    node_name: Family<NodeLabel, Gauge>,
    running_pods: Gauge,
    running_containers: Family<ContainerState, Gauge>,
    desired_pods: Family<Static, Gauge>,
    mirror_pods: Gauge,
    pod_start_duration: Histogram,
    pod_worker_duration: Family<Operation, Histogram, Buckets>,
    pod_worker_start_duration: Histogram,
    runtime_operations: Family<Operation, Counter>,
    runtime_operations_duration: Family<Operation, Histogram, RuntimeBuckets>,
    runtime_operations_errors: Family<Operation, Counter>,
    cgroup_manager_duration: Family<Operation, Histogram, Buckets>,
    started_pods: Counter,
    started_pods_errors: Counter,
    started_containers: Family<ContainerType, Counter>,
    started_containers_errors: Family<ContainerError, Counter>,
    http_requests: Family<HttpRequest, Counter>,
    http_requests_duration: Family<HttpRequest, Histogram, Buckets>,
    http_inflight: Family<HttpInflight, Gauge>,
    probe_total: Family<ProbeResult, Counter>,
    probe_duration: Family<ProbeDuration, Histogram, Buckets>,
    rest_requests: Family<RestRequest, Counter>,
    rest_duration: Family<RestDuration, Histogram, Buckets>,
    process: process::ProcessMetrics,
}

/// The agent's metrics.
pub fn global() -> &'static KubeletMetrics {
    static M: OnceLock<KubeletMetrics> = OnceLock::new();
    M.get_or_init(KubeletMetrics::new)
}

impl KubeletMetrics {
    fn new() -> KubeletMetrics {
        let mut r = Registry::default();
        let m = KubeletMetrics {
            node_name: Family::default(),
            running_pods: Gauge::default(),
            running_containers: Family::default(),
            desired_pods: Family::default(),
            mirror_pods: Gauge::default(),
            pod_start_duration: Histogram::new(POD_START_BUCKETS.iter().copied()),
            pod_worker_duration: Family::new_with_constructor(Buckets(&DEF_BUCKETS)),
            pod_worker_start_duration: Histogram::new(DEF_BUCKETS.iter().copied()),
            runtime_operations: Family::default(),
            runtime_operations_duration: Family::new_with_constructor(RuntimeBuckets),
            runtime_operations_errors: Family::default(),
            cgroup_manager_duration: Family::new_with_constructor(Buckets(&DEF_BUCKETS)),
            started_pods: Counter::default(),
            started_pods_errors: Counter::default(),
            started_containers: Family::default(),
            started_containers_errors: Family::default(),
            http_requests: Family::default(),
            http_requests_duration: Family::new_with_constructor(Buckets(&DEF_BUCKETS)),
            http_inflight: Family::default(),
            probe_total: Family::default(),
            probe_duration: Family::new_with_constructor(Buckets(&DEF_BUCKETS)),
            rest_requests: Family::default(),
            rest_duration: Family::new_with_constructor(Buckets(&REST_BUCKETS)),
            process: process::ProcessMetrics::default(),
            registry: Registry::default(),
            probes_registry: Registry::default(),
        };
        r.register(
            "kubelet_node_name",
            "The node's name. The count is always 1.",
            m.node_name.clone(),
        );
        r.register(
            "kubelet_running_pods",
            "Number of pods that have a running pod sandbox",
            m.running_pods.clone(),
        );
        r.register(
            "kubelet_running_containers",
            "Number of containers currently running",
            m.running_containers.clone(),
        );
        r.register(
            "kubelet_desired_pods",
            "The number of pods the kubelet is being instructed to run. static is true if the pod is not from the apiserver.",
            m.desired_pods.clone(),
        );
        r.register(
            "kubelet_mirror_pods",
            "The number of mirror pods the kubelet will try to create (one per admitted static pod)",
            m.mirror_pods.clone(),
        );
        r.register(
            "kubelet_pod_start_duration_seconds",
            "Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
            m.pod_start_duration.clone(),
        );
        r.register(
            "kubelet_pod_worker_duration_seconds",
            "Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync",
            m.pod_worker_duration.clone(),
        );
        r.register(
            "kubelet_pod_worker_start_duration_seconds",
            "Duration in seconds from kubelet seeing a pod to starting a worker.",
            m.pod_worker_start_duration.clone(),
        );
        r.register(
            "kubelet_runtime_operations",
            "Cumulative number of runtime operations by operation type.",
            m.runtime_operations.clone(),
        );
        r.register(
            "kubelet_runtime_operations_duration_seconds",
            "Duration in seconds of runtime operations. Broken down by operation type.",
            m.runtime_operations_duration.clone(),
        );
        r.register(
            "kubelet_runtime_operations_errors",
            "Cumulative number of runtime operation errors by operation type.",
            m.runtime_operations_errors.clone(),
        );
        r.register(
            "kubelet_cgroup_manager_duration_seconds",
            "Duration in seconds for cgroup manager operations. Broken down by method.",
            m.cgroup_manager_duration.clone(),
        );
        r.register(
            "kubelet_started_pods",
            "Cumulative number of pods started",
            m.started_pods.clone(),
        );
        r.register(
            "kubelet_started_pods_errors",
            "Cumulative number of errors when starting pods",
            m.started_pods_errors.clone(),
        );
        r.register(
            "kubelet_started_containers",
            "Cumulative number of containers started",
            m.started_containers.clone(),
        );
        r.register(
            "kubelet_started_containers_errors",
            "Cumulative number of errors when starting containers",
            m.started_containers_errors.clone(),
        );
        r.register(
            "kubelet_http_requests",
            "Number of the http requests received since the server started",
            m.http_requests.clone(),
        );
        r.register(
            "kubelet_http_requests_duration_seconds",
            "Duration in seconds to serve http requests",
            m.http_requests_duration.clone(),
        );
        r.register(
            "kubelet_http_inflight_requests",
            "Number of the inflight http requests",
            m.http_inflight.clone(),
        );
        r.register(
            "rest_client_requests",
            "Number of HTTP requests, partitioned by status code, method, and host.",
            m.rest_requests.clone(),
        );
        r.register(
            "rest_client_request_duration_seconds",
            "Request latency in seconds. Broken down by verb, and host.",
            m.rest_duration.clone(),
        );
        m.process.register(&mut r);
        let mut p = Registry::default();
        p.register(
            "prober_probe",
            "Cumulative number of a liveness, readiness or startup probe for a container by result.",
            m.probe_total.clone(),
        );
        p.register(
            "prober_probe_duration_seconds",
            "Duration in seconds for a probe response.",
            m.probe_duration.clone(),
        );
        KubeletMetrics {
            registry: r,
            probes_registry: p,
            ..m
        }
    }

    /// `/metrics`: set the state gauges from `counts` and the process, then encode.
    pub fn encode(&self, node: &str, counts: &PodCounts) -> String {
        self.node_name.clear();
        self.node_name
            .get_or_create(&NodeLabel { node: node.to_string() })
            .set(1);
        self.running_pods.set(counts.running_pods);
        for (state, n) in [
            ("running", counts.containers_running),
            ("exited", counts.containers_exited),
            ("created", counts.containers_created),
            ("unknown", counts.containers_unknown),
        ] {
            self.running_containers
                .get_or_create(&ContainerState {
                    container_state: state.into(),
                })
                .set(n);
        }
        for (s, n) in [("true", counts.desired_static), ("false", counts.desired_api)] {
            self.desired_pods
                .get_or_create(&vec![("static".to_string(), s.to_string())])
                .set(n);
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
            .get_or_create(&op(operation_type))
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
    /// remove_container, run_podsandbox, stop_podsandbox, exec_sync, exec, attach,
    /// port_forward) ended after `took`, failed or not.
    pub fn runtime_operation(&self, operation_type: &str, took: Duration, failed: bool) {
        let l = op(operation_type);
        self.runtime_operations.get_or_create(&l).inc();
        self.runtime_operations_duration
            .get_or_create(&l)
            .observe(took.as_secs_f64());
        if failed {
            self.runtime_operations_errors.get_or_create(&l).inc();
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
            .get_or_create(&op(operation_type))
            .observe(took.as_secs_f64());
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
        self.started_containers
            .get_or_create(&ContainerType {
                container_type: container_type.into(),
            })
            .inc();
        if let Some(code) = error_code {
            self.started_containers_errors
                .get_or_create(&ContainerError {
                    container_type: container_type.into(),
                    code: code.into(),
                })
                .inc();
        }
    }

    /// An HTTP request of the kubelet API began; the returned guard records it when dropped.
    pub fn http_request(&self, labels: HttpRequest) -> HttpTimer<'_> {
        self.http_inflight.get_or_create(&inflight(&labels)).inc();
        HttpTimer {
            m: self,
            labels,
            start: Instant::now(),
        }
    }

    /// A request to the API server ended with `code` ("<error>" when no answer came).
    pub fn rest_client_request(&self, method: &str, host: &str, code: &str, took: Duration) {
        self.rest_requests
            .get_or_create(&RestRequest {
                code: code.into(),
                host: host.into(),
                method: method.into(),
            })
            .inc();
        self.rest_duration
            .get_or_create(&RestDuration {
                verb: method.into(),
                host: host.into(),
            })
            .observe(took.as_secs_f64());
    }

    /// One probe attempt's result (successful, failed, unknown) and duration.
    pub fn probe(&self, result: ProbeResult, took: Duration) {
        self.probe_duration
            .get_or_create(&ProbeDuration {
                probe_type: result.probe_type.clone(),
                container: result.container.clone(),
                pod: result.pod.clone(),
                namespace: result.namespace.clone(),
            })
            .observe(took.as_secs_f64());
        self.probe_total.get_or_create(&result).inc();
    }

    /// A probe worker ended: its series go, as kubelet's prober deletes them.
    pub fn forget_probe(&self, probe_type: &str, container: &str, pod: &str, namespace: &str, pod_uid: &str) {
        for result in ["successful", "failed", "unknown"] {
            self.probe_total.remove(&ProbeResult {
                probe_type: probe_type.into(),
                result: result.into(),
                container: container.into(),
                pod: pod.into(),
                namespace: namespace.into(),
                pod_uid: pod_uid.into(),
            });
        }
        self.probe_duration.remove(&ProbeDuration {
            probe_type: probe_type.into(),
            container: container.into(),
            pod: pod.into(),
            namespace: namespace.into(),
        });
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
        self.m.http_inflight.get_or_create(&inflight(&self.labels)).dec();
        self.m.http_requests.get_or_create(&self.labels).inc();
        self.m
            .http_requests_duration
            .get_or_create(&self.labels)
            .observe(self.start.elapsed().as_secs_f64());
    }
}

fn inflight(l: &HttpRequest) -> HttpInflight {
    HttpInflight {
        method: l.method.clone(),
        path: l.path.clone(),
        server_type: l.server_type.clone(),
        long_running: l.long_running.clone(),
    }
}

fn op(operation_type: &str) -> Operation {
    Operation {
        operation_type: operation_type.to_string(),
    }
}

fn encode(r: &Registry) -> String {
    let mut out = String::with_capacity(16 * 1024);
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, r);
    out
}

/// A gauge holding a float (seconds, bytes beyond i64 are not a concern here).
pub(crate) type FloatGauge = Gauge<f64, AtomicU64>;
