//! Cluster-mode tests: one real control plane (../shared/k8s/control-plane) for the whole
//! binary, started in a network namespace of its own; each test runs its own node (an agent
//! with a distinct name and address) against it. Without ../shared the tests are skipped with a
//! loud notice.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/csiplugin.rs"]
mod csiplugin;

mod bootstrap;
mod csi;
mod images;
mod node;
mod objects;
mod outage;
mod pods;
mod server;
mod streaming;
mod volumes;

use std::sync::OnceLock;

use common::cluster::Cluster;
use libtest_mimic::{Arguments, Trial};

static CLUSTER: OnceLock<Cluster> = OnceLock::new();

/// The cluster every test shares.
pub fn cluster() -> &'static Cluster {
    CLUSTER.get().expect("the cluster is started before the tests")
}

/// A test: a name and a function that panics on failure.
pub fn test(name: &'static str, f: fn()) -> Trial {
    common::trial(name, f)
}

fn main() {
    let args = Arguments::from_args();
    // Tests that stop the API server run after the others, one at a time.
    let shared: Vec<Trial> = [
        pods::tests(),
        bootstrap::tests(),
        csi::tests(),
        objects::tests(),
        images::tests(),
        server::tests(),
        streaming::tests(),
        volumes::tests(),
    ]
    .into_iter()
    .flatten()
    .collect();
    let disruptive: Vec<Trial> = [outage::tests(), node::tests()].into_iter().flatten().collect();
    if args.list {
        libtest_mimic::run(&args, shared.into_iter().chain(disruptive).collect()).exit();
    }
    assert!(
        nix::unistd::geteuid().is_root(),
        "the cluster tests run real pods and need root"
    );
    let Some(c) = Cluster::start() else {
        let all = shared.into_iter().chain(disruptive);
        libtest_mimic::run(&args, all.map(|t| t.with_ignored_flag(true)).collect()).exit();
    };
    let _ = CLUSTER.set(c);
    let first = libtest_mimic::run(&args, shared);
    let one_at_a_time = Arguments {
        test_threads: Some(1),
        ..args.clone()
    };
    let second = libtest_mimic::run(&one_at_a_time, disruptive);
    // The statics are never dropped: stop the control plane and the namespace here.
    if let Some(c) = CLUSTER.get() {
        c.shutdown();
    }
    if first.has_failed() || second.has_failed() {
        std::process::exit(101);
    }
}
