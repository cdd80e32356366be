//! Memory a burst of requests freed, given back to the system once the broker goes quiet.
//!
//! Neither allocator returns freed memory while nothing allocates: mimalloc (the `corral`
//! binary's) purges freed pages only from inside its own calls, and glibc's malloc (the
//! desktop app's, SQLite's page cache, sqlx's worker) trims only the top of each arena. So a
//! broker idle after a burst sat at its peak. The broker looks once a second whether a request
//! began since its last look; the first time none did, it asks the allocators to give back
//! what they hold free, once per quiet spell. Under load nothing happens: requests keep
//! beginning. (Issue 16: release build, chat c=16, 2,000 requests: RssAnon 7.1 MiB right
//! after, 4.6 MiB once quiet; VmRSS 23.2 -> 20.8 MiB. Purging at every free instead would
//! cost system calls on the request path.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How long without a new request before the broker counts as quiet.
pub const QUIET: Duration = Duration::from_secs(1);

/// Requests begun on every listener of the process since start.
static REQUESTS_BEGUN: AtomicU64 = AtomicU64::new(0);

/// The process allocator's own way to give free memory back, when it has one (set once by
/// the binary that chose the allocator).
static COLLECT: OnceLock<fn()> = OnceLock::new();

/// A request began (any listener, any answer).
#[inline]
pub fn request_began() {
    REQUESTS_BEGUN.fetch_add(1, Ordering::Relaxed);
}

/// Requests begun on every listener of this process so far.
pub fn requests_begun() -> u64 {
    REQUESTS_BEGUN.load(Ordering::Relaxed)
}

/// Register the global allocator's "give back what is free" (the `corral` binary: mimalloc's
/// `mi_collect`). The first registration stands.
pub fn set_collector(collect: fn()) {
    let _ = COLLECT.set(collect);
}

/// Tells, from readings of [`requests_begun`] a fixed time apart, when the process has gone
/// quiet: no request began between two readings. Says so once per quiet spell.
#[derive(Debug, Default)]
pub struct Quiet {
    seen: Option<u64>,
    told: Option<u64>,
}

impl Quiet {
    /// Take the next reading; `true` when nothing began since the last one and this spell
    /// of quiet was not told yet.
    pub fn observe(&mut self, begun: u64) -> bool {
        let quiet = self.seen == Some(begun) && self.told != Some(begun);
        if quiet {
            self.told = Some(begun);
        }
        self.seen = Some(begun);
        quiet
    }
}

/// Look every [`QUIET`] and give memory back once per quiet spell, until cancelled.
pub async fn give_back_when_quiet(cancel: CancellationToken) {
    when_quiet(cancel, give_back).await
}

/// [`give_back_when_quiet`] for another thread that allocates (the store writer's): only that
/// thread's own free pages, as mimalloc keeps them per thread; the process-wide part (glibc's
/// trim) and the line saying so are the broker's own watch's.
pub async fn collect_this_thread_when_quiet(cancel: CancellationToken) {
    when_quiet(cancel, || {
        if let Some(collect) = COLLECT.get() {
            collect();
        }
    })
    .await
}

async fn when_quiet(cancel: CancellationToken, act: fn()) {
    let mut tick = tokio::time::interval(QUIET);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut quiet = Quiet::default();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        if quiet.observe(requests_begun()) {
            act();
        }
    }
}

/// Ask the allocators to return what they hold free. mimalloc collects the calling thread's
/// heap and the frees other threads sent it (the `corral` binary runs its broker on one
/// thread); glibc's trim covers every arena.
fn give_back() {
    let before = anon_resident_kib();
    if let Some(collect) = COLLECT.get() {
        collect();
    }
    trim_malloc();
    tracing::debug!(anon_kib_before = before, anon_kib_after = anon_resident_kib(), "quiet: freed memory given back");
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim_malloc() {
    extern "C" {
        /// glibc's: give the free memory of every arena back (`pad` bytes kept at each top).
        fn malloc_trim(pad: usize) -> std::ffi::c_int;
    }
    // SAFETY: it only walks glibc's own free lists under their locks; nothing of ours is
    // borrowed or freed.
    unsafe {
        malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim_malloc() {}

/// Resident memory not backed by a file (the heap's share), in KiB: `/proc/self/statm`'s
/// resident less shared pages. 0 where there is no such file.
fn anon_resident_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: Vec<u64> = statm.split_whitespace().take(3).filter_map(|f| f.parse().ok()).collect();
    match pages[..] {
        [_, resident, shared] => resident.saturating_sub(shared) * 4,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiet_is_told_once_per_spell_with_no_request_between_two_readings() {
        let mut q = Quiet::default();
        let told: Vec<bool> = [0, 0, 0, 0, 5, 9, 9, 9, 10, 10].into_iter().map(|n| q.observe(n)).collect();
        assert_eq!(told, [false, true, false, false, false, false, true, false, false, true]);
    }
}
