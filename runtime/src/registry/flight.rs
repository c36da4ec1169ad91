//! Work shared by everyone who asks for the same thing at once (a pull of one reference, a
//! download of one blob), run on a task of its own and counted by who waits for it: when the
//! last waiter goes away (its pull was dropped: the pod was deleted, the CLI interrupted) the
//! task is aborted, so nothing downloads for nobody.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::{BoxFuture, FutureExt, Shared};
use tokio::task::AbortHandle;

pub(super) type Outcome<T> = Shared<BoxFuture<'static, Result<T, String>>>;

struct Flight<T, X> {
    fut: Outcome<T>,
    extra: X,
    waiters: usize,
    abort: AbortHandle,
    id: u64,
}

/// Flights under way by key; `X` is what joiners share besides the outcome (listeners).
pub(super) struct Flights<K, T, X> {
    map: Arc<Mutex<HashMap<K, Flight<T, X>>>>,
}

impl<K, T, X> Default for Flights<K, T, X> {
    fn default() -> Self {
        Flights {
            map: Arc::new(Mutex::new(HashMap::new())),
        }
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// One waiter of a flight: dropping the last one aborts the flight.
pub(super) struct Waiter<K: Eq + Hash, T, X> {
    map: Arc<Mutex<HashMap<K, Flight<T, X>>>>,
    key: K,
    id: u64,
}

impl<K, T, X> Flights<K, T, X>
where
    K: Eq + Hash + Clone + Send + 'static,
    T: Clone + Send + Sync + 'static,
    X: Clone + Send + 'static,
{
    /// Join the flight under `key`, or start one with `extra` and the work `start` makes
    /// (given the extra). `with_extra` sees the extra of the flight joined or started. Returns
    /// the outcome to await, the waiter to hold meanwhile, and whether the flight is new.
    pub(crate) fn join(
        &self,
        key: &K,
        extra: impl FnOnce() -> X,
        with_extra: impl FnOnce(&X),
        start: impl FnOnce(X) -> BoxFuture<'static, Result<T, String>>,
    ) -> (Outcome<T>, Waiter<K, T, X>, bool) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = map.get_mut(key) {
            f.waiters += 1;
            with_extra(&f.extra);
            let w = Waiter {
                map: self.map.clone(),
                key: key.clone(),
                id: f.id,
            };
            return (f.fut.clone(), w, false);
        }
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let x = extra();
        with_extra(&x);
        let work = start(x.clone());
        let map2 = self.map.clone();
        let k2 = key.clone();
        let handle = tokio::spawn(async move {
            let res = work.await;
            let mut map = map2.lock().unwrap_or_else(|e| e.into_inner());
            if map.get(&k2).is_some_and(|f| f.id == id) {
                map.remove(&k2);
            }
            res
        });
        let abort = handle.abort_handle();
        let fut = async move {
            match handle.await {
                Ok(r) => r,
                Err(e) if e.is_cancelled() => Err("cancelled: nothing waits for it any more".to_string()),
                Err(e) => Err(format!("it panicked: {e}")),
            }
        }
        .boxed()
        .shared();
        map.insert(
            key.clone(),
            Flight {
                fut: fut.clone(),
                extra: x,
                waiters: 1,
                abort,
                id,
            },
        );
        let w = Waiter {
            map: self.map.clone(),
            key: key.clone(),
            id,
        };
        (fut, w, true)
    }

    /// Flights under way (for tests and logs).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl<K: Eq + Hash, T, X> Drop for Waiter<K, T, X> {
    fn drop(&mut self) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let Some(f) = map.get_mut(&self.key) else { return };
        if f.id != self.id {
            return;
        }
        f.waiters -= 1;
        if f.waiters == 0 {
            // Removed under the lock: a later join starts afresh rather than joining a
            // flight being aborted.
            let f = map.remove(&self.key).expect("present");
            f.abort.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    #[tokio::test]
    async fn the_last_waiter_leaving_aborts_the_work() {
        let flights: Flights<u32, u32, ()> = Flights::default();
        let dropped = Arc::new(AtomicBool::new(false));
        struct OnDrop(Arc<AtomicBool>);
        impl Drop for OnDrop {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let d2 = dropped.clone();
        let start = move |_| {
            async move {
                let _g = OnDrop(d2);
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(1)
            }
            .boxed()
        };
        let (_f1, w1, new1) = flights.join(&7, || (), |_| {}, start);
        let (_f2, w2, new2) = flights.join(&7, || (), |_| {}, |_| unreachable!());
        assert!(new1 && !new2, "the second joins the first");
        drop(w1);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!dropped.load(Ordering::SeqCst), "one waiter is left");
        drop(w2);
        for _ in 0..100 {
            if dropped.load(Ordering::SeqCst) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(dropped.load(Ordering::SeqCst), "aborted once nobody waits");
        assert_eq!(flights.len(), 0);
        // A finished flight leaves the map by itself and gives its outcome.
        let (f, _w, _) = flights.join(&8, || (), |_| {}, |_| async { Ok(5) }.boxed());
        assert_eq!(f.await, Ok(5));
        assert_eq!(flights.len(), 0);
    }
}
