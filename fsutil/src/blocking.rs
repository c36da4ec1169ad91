//! Blocking work handed to tokio's blocking pool, and the pool's threads kept small while idle.
//!
//! A burst of pods leaves the pool with as many threads as the burst had blocking calls at once
//! (57 after 100 pods at once). They never end while the agent is idle: the pool wakes its
//! longest-waiting thread first, and the agent's steady trickle of blocking work (about three
//! calls a second with 100 pods) reaches every thread well within its keep-alive. Each thread
//! kept the stack pages of the deepest call it ever ran (a container build, a JSON decode):
//! 3.9 MiB over 57 threads, measured. So every task run through [`spawn_blocking`] gives back,
//! when it is done, its thread's stack pages below the frame it ran in; a deeper call faults
//! them back in, zeroed.

use std::cell::Cell;
use std::ptr::NonNull;

use nix::sys::mman::{madvise, MmapAdvise};

use crate::Error;

/// Stack kept below the frame that releases the rest: room for the calls it makes itself.
const KEEP: usize = 8 * 1024;

/// Run blocking work (fsync'd writes, unmounts, removals, cgroupfs writes) on tokio's blocking
/// pool instead of an async worker thread. A panic in `f` resumes in the caller, as it would have
/// without the move.
pub async fn blocking<T, E, F>(f: F) -> std::result::Result<T, E>
where
    T: Send + 'static,
    E: From<Error> + Send + 'static,
    F: FnOnce() -> std::result::Result<T, E> + Send + 'static,
{
    match spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => Err(Error::io("running a blocking task", std::io::Error::other(e)).into()),
        },
    }
}

/// [`tokio::task::spawn_blocking`], and then the thread's stack below the task's frame given
/// back (the module's doc says why). For every blocking call of ferrolet's crates.
pub fn spawn_blocking<T, F>(f: F) -> tokio::task::JoinHandle<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    tokio::task::spawn_blocking(move || {
        let out = f();
        release_stack_below_here();
        out
    })
}

/// Drop this thread's stack pages more than [`KEEP`] below the caller's frame. A thread whose
/// stack cannot be found (its bounds unknown, or the frame outside them) keeps its pages.
#[inline(never)]
fn release_stack_below_here() {
    let here = std::hint::black_box(0u8);
    let sp = std::ptr::addr_of!(here) as usize;
    let Some((bottom, top)) = stack_bounds() else {
        return;
    };
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |p| p as usize);
    let end = sp.saturating_sub(KEEP) & !(page - 1);
    if !(bottom < end && sp < top) {
        return;
    }
    let Some(start) = NonNull::new(bottom as *mut libc::c_void) else {
        return;
    };
    // SAFETY: [bottom, end) is the part of this thread's own stack (its bounds as pthread
    // reports them, guard page excluded) more than KEEP below the frames in use: the stack
    // grows down from above `sp`, and nothing lives there until a deeper call writes it again.
    // MADV_DONTNEED on private anonymous memory only replaces its pages with zero-filled ones
    // on the next touch.
    let _ = unsafe { madvise(start, end - bottom, MmapAdvise::MADV_DONTNEED) };
}

/// This thread's stack, `[bottom, top)`, as pthread reports it; learnt once per thread.
fn stack_bounds() -> Option<(usize, usize)> {
    thread_local! {
        static BOUNDS: Cell<Option<Option<(usize, usize)>>> = const { Cell::new(None) };
    }
    BOUNDS
        .try_with(|b| {
            if let Some(known) = b.get() {
                return known;
            }
            let found = read_stack_bounds();
            b.set(Some(found));
            found
        })
        .ok()
        .flatten()
}

fn read_stack_bounds() -> Option<(usize, usize)> {
    // nix has no pthread attribute calls.
    let mut attr = std::mem::MaybeUninit::<libc::pthread_attr_t>::uninit();
    // SAFETY: pthread_getattr_np fills `attr` for the calling thread; it is read only after
    // it succeeded and destroyed once.
    unsafe {
        if libc::pthread_getattr_np(libc::pthread_self(), attr.as_mut_ptr()) != 0 {
            return None;
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let ok = libc::pthread_attr_getstack(attr.as_ptr(), &mut addr, &mut size) == 0;
        libc::pthread_attr_destroy(attr.as_mut_ptr());
        (ok && !addr.is_null() && size > 0).then(|| (addr as usize, addr as usize + size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of `[from, to)` resident in memory.
    fn resident(from: usize, to: usize) -> usize {
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .unwrap()
            .unwrap() as usize;
        let (from, to) = (from & !(page - 1), to & !(page - 1));
        let mut v = vec![0u8; (to - from) / page];
        // SAFETY: mincore fills one byte per page of a mapped range into `v`, which is long enough.
        let r = unsafe { libc::mincore(from as *mut libc::c_void, to - from, v.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
        v.iter().filter(|b| **b & 1 == 1).count()
    }

    /// Writes `depth` KiB of stack and returns the lowest address it wrote.
    #[inline(never)]
    fn deep(depth: usize) -> usize {
        let mut buf = [0u8; 1024];
        std::hint::black_box(&mut buf)[0] = 1;
        let here = buf.as_ptr() as usize;
        if depth > 1 {
            deep(depth - 1).min(here)
        } else {
            here
        }
    }

    fn sp() -> usize {
        let here = std::hint::black_box(0u8);
        std::ptr::addr_of!(here) as usize
    }

    #[test]
    fn a_deep_task_gives_its_stack_pages_back_and_its_thread_lives_on() {
        // One blocking thread, so that the second task runs where the first ran.
        let rt = tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(1)
            .build()
            .unwrap();
        rt.block_on(async {
            let (deepest, bottom, before) = spawn_blocking(|| {
                let deepest = deep(512);
                let (bottom, _) = stack_bounds().expect("a pool thread's stack bounds");
                (deepest, bottom, resident(deepest, sp() - 64 * 1024))
            })
            .await
            .unwrap();
            assert!(deepest > bottom, "the test's frames are inside the stack");
            assert!(before >= 100, "the deep call left {before} pages resident");
            let after = spawn_blocking(move || resident(deepest, sp() - 64 * 1024))
                .await
                .unwrap();
            assert!(after <= 2, "{after} of the deep call's pages are still resident");
            // A deep call again finds its stack (zeroed pages) and the thread carries on.
            assert!(spawn_blocking(|| deep(512)).await.unwrap() > 0);
        });
    }

    #[test]
    fn a_panic_in_blocking_work_resumes_in_the_caller() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.block_on(blocking(|| -> Result<(), Error> { panic!("boom") }))
        }));
        assert!(r.is_err());
        let ok: Result<u8, Error> = rt.block_on(blocking(|| Ok(7)));
        assert_eq!(ok.unwrap(), 7);
    }
}
