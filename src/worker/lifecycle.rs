//! A pod worker's loop (kubelet's podWorkerLoop): which of the three sync functions runs next,
//! how messages that arrive meanwhile fold into one round, when the next round comes (a
//! message, the syncer's own wake time, or the resync period), what a panicked round costs, and
//! how a removal that did not finish is retried. The sync functions are a [`PodSyncer`]
//! (kubelet's podSyncer: SyncPod, SyncTerminatingPod, SyncTerminatedPod); the node's is
//! [`super::pod_worker::PodWorker`], the tests below drive a recording one, without a kernel.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::FutureExt;
use k8s_openapi::api::core::v1::Pod;
use std::sync::Arc;
use tokio::sync::mpsc;
use tracing::{error, warn};

use crate::prober::ProbeEvent;
use crate::tasks::panic_message;

/// Where a pod is in its life on the node (kubelet's pod worker states, each with its sync
/// function: SyncPod, SyncTerminatingPod, SyncTerminatedPod).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// Wanted: converge what runs to the spec, again and again.
    Syncing,
    /// No longer wanted: stop the containers (preStop, grace period, sidecars last).
    Terminating,
    /// Nothing runs: remove containers, sandbox, network, volumes, cgroup and directories.
    Terminated,
}

#[derive(Debug)]
pub enum Msg {
    /// A new version of the pod (same UID).
    Update(Arc<Pod>),
    /// The pod is no longer wanted: terminate it and clean up.
    Terminate,
    /// Something changed (a container exited): sync now.
    Wake,
    /// A probe's result changed.
    Probe(ProbeEvent),
    /// Stop the pod for good and leave it Failed.
    Kill(super::KillPod),
}

/// What a round is, for kubelet_pod_worker_duration_seconds: `create` (the first SyncPod),
/// `update` (the pod changed), `sync` (a resync, a probe, a container's exit), `kill`
/// (SyncTerminatingPod); `remove` (SyncTerminatedPod) is not measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    Create,
    Update,
    Sync,
    Kill,
    Remove,
}

impl Round {
    pub fn as_str(self) -> &'static str {
        match self {
            Round::Create => "create",
            Round::Update => "update",
            Round::Sync => "sync",
            Round::Kill => "kill",
            Round::Remove => "remove",
        }
    }
}

/// The worker's messages and the lifecycle they move: a sync function that waits on something
/// long (an image pull, a grace period) takes messages from here too, so a termination asked
/// for meanwhile is seen at once.
pub struct Inbox {
    pub rx: mpsc::UnboundedReceiver<Msg>,
    /// For the worker's own wake-ups (container exits, probe results).
    pub tx: mpsc::UnboundedSender<Msg>,
    pub lifecycle: Lifecycle,
    /// What the next (or current) SyncPod round is.
    pub round: Round,
}

impl Inbox {
    pub fn new(lifecycle: Lifecycle) -> (Inbox, mpsc::UnboundedSender<Msg>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let inbox = Inbox {
            rx,
            tx: tx.clone(),
            lifecycle,
            round: Round::Create,
        };
        (inbox, tx)
    }

    /// What `m` changes of the lifecycle: a termination ends syncing for good (a later update
    /// does not bring it back), an update makes the next round an `update`.
    pub fn note(&mut self, m: &Msg) {
        match m {
            Msg::Update(_) if self.round == Round::Sync => self.round = Round::Update,
            Msg::Terminate if self.lifecycle == Lifecycle::Syncing => self.lifecycle = Lifecycle::Terminating,
            _ => {}
        }
    }
}

/// The sync functions of one pod and what the loop tells about its rounds.
pub trait PodSyncer: Send + 'static {
    fn inbox(&mut self) -> &mut Inbox;
    /// The pod's name, for the log.
    fn name(&self) -> String;
    /// The longest wait between two SyncPod rounds.
    fn sync_frequency(&self) -> Duration;
    /// Apply one message (after [`Inbox::note`]).
    fn handle(&mut self, m: Msg);
    /// The worker begins in its first lifecycle.
    fn begin(&mut self);
    /// SyncPod: converge what runs to the spec. Returns when to run again at the latest.
    fn sync_pod(&mut self) -> impl Future<Output = Option<DateTime<Utc>>> + Send;
    /// SyncTerminatingPod: stop every container.
    fn sync_terminating_pod(&mut self) -> impl Future<Output = ()> + Send;
    /// The pod's status once its containers stopped (also after a panicked termination).
    fn publish_stopped(&mut self) -> impl Future<Output = ()> + Send;
    /// SyncTerminatedPod: remove what the pod had on the node. False when some of it is left.
    fn sync_terminated_pod(&mut self) -> impl Future<Output = bool> + Send;
    /// A round of the current lifecycle begins.
    fn round_begins(&mut self);
    fn round_ended(&mut self, round: Round, took: Duration);
    /// Everything of the pod is gone; the worker ends.
    fn removed(&mut self);
}

/// The first resync after a round that failed or panicked.
pub const RETRY: Duration = Duration::from_secs(5);

/// Doubling delays from 1 s up to a minute.
#[derive(Default)]
pub struct RetryDelay(u32);

impl RetryDelay {
    pub fn next_delay(&mut self) -> Duration {
        let d = Duration::from_secs(1 << self.0.min(6)).min(Duration::from_secs(60));
        self.0 += 1;
        d
    }
}

/// The worker's loop. It lives as long as the pod, mostly waiting: the rounds are boxed, so
/// their (large) state exists only while one runs, not in every idle pod's task. A panic in one
/// round is logged and the round retried: the worker, and what it knows, survive it.
pub async fn run<S: PodSyncer>(mut s: S) {
    s.begin();
    let mut removal = RetryDelay::default();
    loop {
        s.round_begins();
        let started = std::time::Instant::now();
        match s.inbox().lifecycle {
            Lifecycle::Syncing => {
                let name = s.name();
                let wake = caught(s.sync_pod(), &name, "pod sync panicked; retrying")
                    .await
                    .unwrap_or_else(|| Some(Utc::now() + chrono::Duration::from_std(RETRY).unwrap_or_default()));
                let round = std::mem::replace(&mut s.inbox().round, Round::Sync);
                s.round_ended(round, started.elapsed());
                if !wait_for_work(&mut s, wake).await {
                    return;
                }
            }
            Lifecycle::Terminating => {
                let name = s.name();
                caught(
                    s.sync_terminating_pod(),
                    &name,
                    "stopping the pod panicked; removing it",
                )
                .await;
                Box::pin(s.publish_stopped()).await;
                s.round_ended(Round::Kill, started.elapsed());
                s.inbox().lifecycle = Lifecycle::Terminated;
            }
            Lifecycle::Terminated => {
                let name = s.name();
                let removed = caught(s.sync_terminated_pod(), &name, "removing the pod panicked")
                    .await
                    .unwrap_or(false);
                s.round_ended(Round::Remove, started.elapsed());
                if removed {
                    s.removed();
                    return;
                }
                // Not gone yet: the pod stays (terminating) and the removal is retried.
                let delay = removal.next_delay();
                warn!(pod = %s.name(), retry_in = ?delay, "the pod is not fully removed; retrying");
                if !sleep_ignoring_updates(s.inbox(), delay).await {
                    return;
                }
            }
        }
    }
}

/// Run one sync function, boxed (its state exists only while it runs); a panic in it is
/// logged as `what` with the panic's message, and is `None`.
async fn caught<T>(f: impl Future<Output = T>, pod: &str, what: &str) -> Option<T> {
    match std::panic::AssertUnwindSafe(Box::pin(f)).catch_unwind().await {
        Ok(t) => Some(t),
        Err(p) => {
            error!(pod = %pod, panic = %panic_message(p), "{what}");
            None
        }
    }
}

/// Sleep until a message comes, `wake` passes, or the resync period is over. Applies every
/// message queued meanwhile (they fold into one round). False when the channel is gone.
async fn wait_for_work<S: PodSyncer>(s: &mut S, wake: Option<DateTime<Utc>>) -> bool {
    let mut delay = s.sync_frequency();
    if let Some(w) = wake {
        let d = (w - Utc::now()).to_std().unwrap_or(Duration::ZERO) + Duration::from_millis(50);
        delay = delay.min(d);
    }
    let first = tokio::select! {
        m = s.inbox().rx.recv() => match m {
            None => return false,
            Some(m) => Some(m),
        },
        _ = tokio::time::sleep(delay) => None,
    };
    if let Some(m) = first {
        s.inbox().note(&m);
        s.handle(m);
    }
    while let Ok(m) = s.inbox().rx.try_recv() {
        s.inbox().note(&m);
        s.handle(m);
    }
    true
}

/// Sleep `d` while the pod is being removed: updates no longer matter, probe results are
/// dropped. False when the channel is gone.
async fn sleep_ignoring_updates(inbox: &mut Inbox, d: Duration) -> bool {
    let until = crate::tasks::after(tokio::time::Instant::now(), d);
    loop {
        tokio::select! {
            m = inbox.rx.recv() => if m.is_none() { return false },
            _ = tokio::time::sleep_until(until) => return true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use tokio::sync::Semaphore;
    use tokio::time::Instant;

    /// A syncer that tells each call, with the pod version it saw and the (paused) clock.
    struct Recorder {
        inbox: Inbox,
        rv: String,
        /// Each SyncPod round takes a permit first: the test holds a round open with it.
        gate: Arc<Semaphore>,
        /// What each SyncPod round returns, in seconds from now (none after the list).
        wakes: VecDeque<Option<i64>>,
        /// Whether each SyncTerminatedPod round removes everything (true after the list).
        removals: VecDeque<bool>,
        panics: usize,
        t0: Instant,
        tell: mpsc::UnboundedSender<String>,
    }

    impl Recorder {
        fn say(&self, what: &str) {
            let _ = self.tell.send(format!("{what} @{}s", self.t0.elapsed().as_secs()));
        }
    }

    impl PodSyncer for Recorder {
        fn inbox(&mut self) -> &mut Inbox {
            &mut self.inbox
        }
        fn name(&self) -> String {
            "ns/p".into()
        }
        fn sync_frequency(&self) -> Duration {
            Duration::from_secs(60)
        }
        fn handle(&mut self, m: Msg) {
            if let Msg::Update(p) = m {
                self.rv = p.metadata.resource_version.clone().unwrap_or_default();
            }
        }
        fn begin(&mut self) {
            self.say(&format!("begin {:?}", self.inbox.lifecycle));
        }
        async fn sync_pod(&mut self) -> Option<DateTime<Utc>> {
            self.say(&format!("sync rv={}", self.rv));
            self.gate.acquire().await.unwrap().forget();
            if self.panics > 0 {
                self.panics -= 1;
                panic!("a bug in a round");
            }
            let wake = self.wakes.pop_front().flatten();
            wake.map(|s| Utc::now() + chrono::Duration::seconds(s))
        }
        async fn sync_terminating_pod(&mut self) {
            self.say("terminating");
        }
        async fn publish_stopped(&mut self) {
            self.say("stopped");
        }
        async fn sync_terminated_pod(&mut self) -> bool {
            self.say("terminated");
            self.removals.pop_front().unwrap_or(true)
        }
        fn round_begins(&mut self) {}
        fn round_ended(&mut self, round: Round, _took: Duration) {
            self.say(&format!("ended {}", round.as_str()));
        }
        fn removed(&mut self) {
            self.say("removed");
        }
    }

    struct T {
        tx: mpsc::UnboundedSender<Msg>,
        heard: mpsc::UnboundedReceiver<String>,
        gate: Arc<Semaphore>,
        worker: tokio::task::JoinHandle<()>,
    }

    fn pod(rv: &str) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.resource_version = Some(rv.into());
        Arc::new(p)
    }

    fn start(lifecycle: Lifecycle, f: impl FnOnce(&mut Recorder)) -> T {
        let (inbox, tx) = Inbox::new(lifecycle);
        let (tell, heard) = mpsc::unbounded_channel();
        let gate = Arc::new(Semaphore::new(Semaphore::MAX_PERMITS));
        let mut r = Recorder {
            inbox,
            rv: "1".into(),
            gate: gate.clone(),
            wakes: VecDeque::new(),
            removals: VecDeque::new(),
            panics: 0,
            t0: Instant::now(),
            tell,
        };
        f(&mut r);
        T {
            tx,
            heard,
            gate,
            worker: tokio::spawn(run(r)),
        }
    }

    impl T {
        /// The next `n` things the worker did.
        async fn next(&mut self, n: usize) -> Vec<String> {
            let mut out = Vec::new();
            for _ in 0..n {
                out.push(self.heard.recv().await.expect("the worker ended"));
            }
            out
        }
        /// Hold the next SyncPod rounds until [`T::open`].
        async fn close(&self) {
            let all = self.gate.available_permits() as u32;
            self.gate.acquire_many(all).await.unwrap().forget();
        }
        fn open(&self, rounds: usize) {
            self.gate.add_permits(rounds);
        }
        fn send(&self, m: Msg) {
            self.tx.send(m).unwrap();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn messages_that_come_during_a_round_fold_into_one_update_round() {
        let mut t = start(Lifecycle::Syncing, |_| {});
        t.close().await;
        assert_eq!(t.next(2).await, ["begin Syncing @0s", "sync rv=1 @0s"]);
        t.send(Msg::Update(pod("2")));
        t.send(Msg::Wake);
        t.send(Msg::Update(pod("3")));
        t.open(2);
        assert_eq!(
            t.next(4).await,
            [
                "ended create @0s",
                "sync rv=3 @0s",
                "ended update @0s",
                "sync rv=3 @60s"
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_next_round_comes_at_the_wake_time_or_after_the_sync_frequency() {
        let mut t = start(Lifecycle::Syncing, |r| r.wakes = [Some(3), None, Some(600)].into());
        assert_eq!(
            t.next(7).await,
            [
                "begin Syncing @0s",
                "sync rv=1 @0s",
                "ended create @0s",
                "sync rv=1 @3s",
                "ended sync @3s",
                "sync rv=1 @63s",
                "ended sync @63s",
            ]
        );
        // a wake time past the sync frequency: the sync frequency comes first
        assert_eq!(t.next(2).await, ["sync rv=1 @123s", "ended sync @123s"]);
        // a container's exit: at once
        t.send(Msg::Wake);
        assert_eq!(t.next(1).await, ["sync rv=1 @123s"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_round_is_retried_and_the_worker_survives() {
        let mut t = start(Lifecycle::Syncing, |r| r.panics = 1);
        assert_eq!(
            t.next(5).await,
            [
                "begin Syncing @0s",
                "sync rv=1 @0s",
                "ended create @0s",
                "sync rv=1 @5s",
                "ended sync @5s",
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_termination_stops_then_removes_the_pod_and_ends_the_worker() {
        let mut t = start(Lifecycle::Syncing, |_| {});
        t.next(3).await;
        t.send(Msg::Terminate);
        // an update after it never brings syncing back
        t.send(Msg::Update(pod("2")));
        assert_eq!(
            t.next(6).await,
            [
                "terminating @0s",
                "stopped @0s",
                "ended kill @0s",
                "terminated @0s",
                "ended remove @0s",
                "removed @0s",
            ]
        );
        t.worker.await.unwrap();
        assert_eq!(t.heard.recv().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_termination_asked_for_during_a_round_ends_syncing_after_it() {
        let mut t = start(Lifecycle::Syncing, |_| {});
        t.close().await;
        t.next(2).await;
        t.send(Msg::Terminate);
        t.open(1);
        assert_eq!(t.next(3).await, ["ended create @0s", "terminating @0s", "stopped @0s"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_removal_that_leaves_something_is_retried_with_doubling_delays() {
        let mut t = start(Lifecycle::Terminating, |r| r.removals = [false, false, true].into());
        t.send(Msg::Update(pod("2")));
        t.send(Msg::Wake);
        assert_eq!(
            t.next(11).await,
            [
                "begin Terminating @0s",
                "terminating @0s",
                "stopped @0s",
                "ended kill @0s",
                "terminated @0s",
                "ended remove @0s",
                "terminated @1s",
                "ended remove @1s",
                "terminated @3s",
                "ended remove @3s",
                "removed @3s",
            ]
        );
        t.worker.await.unwrap();
    }

    #[test]
    fn removal_retries_double_from_a_second_to_a_minute() {
        let mut d = RetryDelay::default();
        let secs: Vec<u64> = (0..9).map(|_| d.next_delay().as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }
}
