//! ferrolet: a Kubernetes node agent with its own container runtime (the agent's library; the
//! `ferrolet` binary in main.rs is its command line).
//!
//! The data path reads like kubelet's, one module a stage: sources and the pod config
//! ([`podconfig`]) -> the agent's main loop ([`agent`]) -> one worker per pod ([`worker`]) ->
//! pod setup ([`podsetup`]: cgroup, sandbox, network, volumes) and containers through the
//! Kubernetes/runtime boundary ([`kuberuntime`]), watched by probes ([`prober`]) and hooks
//! ([`lifecycle`]) -> status ([`status`]); node, pod and container stats ([`stats`]) -> the HTTP API ([`server`])
//! and the CLI ([`cli`]).
//! docs/agent.md maps each module to its kubelet counterpart. The runtime crate creates the
//! containers; it needs its zygote forked before any thread exists, so `main` does that before
//! starting tokio (docs/runtime.md#the-zygote).

pub mod agent;
pub mod apis;
pub mod backoff;
pub mod checkpoint;
pub mod cli;
pub mod cm;
pub mod config;
pub mod events;
pub mod eviction;
pub mod images;
pub mod kubeclient;
pub mod kuberuntime;
pub mod lifecycle;
pub mod metrics;
pub mod mirror;
pub mod node;
pub mod nodeshutdown;
pub mod objects;
pub mod pluginmanager;
pub mod pod;
pub mod podconfig;
pub mod podsetup;
pub mod probe;
pub mod prober;
pub mod server;
pub mod stats;
pub mod status;
pub mod tasks;
pub mod volumemanager;
pub mod worker;
