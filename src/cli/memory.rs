//! Gives memory back to the OS after a spike (glibc only).
//!
//! glibc's malloc keeps freed memory in its arenas: after 1,000 connections
//! each holding a 60 KB unfinished head (60 MB of read buffers) are gone, a
//! node stays at its peak RSS for good (measured: 21 MB idle, 96 MB at the
//! peak, still 96 MB 12 s later). `malloc_trim(0)` returns every whole free
//! page of every arena (`madvise(MADV_DONTNEED)`, glibc 2.8 and later):
//! 26 MB 10 s later. Tuning instead (`M_TRIM_THRESHOLD` alone, or
//! `M_ARENA_MAX=1`) changed nothing measurable; `M_MMAP_THRESHOLD` = 64 KiB
//! came back to 36 MB but makes every buffer of 64 KiB or more an mmap and
//! munmap pair. docs/performance.md, "Memory after a spike", has the figures.
//!
//! So once a second this task reads how much memory malloc holds free
//! (`mallinfo2().fordblks`) and trims when that has grown by
//! [`TRIM_STEP_BYTES`] since the last trim ([`should_trim`]): a spike that
//! ends is trimmed within about a second, and a steady node never trims
//! (trimming takes each arena's lock while it walks it). Only the `peerlb
//! node` command runs it; the simulation and tests embedding a node do not.

use std::time::Duration;

/// Free memory malloc must hold beyond what it held after the last trim
/// before the next trim, in bytes (8 MiB): well above what a steady node's
/// churn moves, well below a spike's.
pub(crate) const TRIM_STEP_BYTES: usize = 8 << 20;

/// How often the free memory is read.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// True when malloc holds `free` bytes free and held `floor` bytes free
/// after the last trim (the lowest seen since, see [`run`]): a trim is due
/// when `free` exceeds `floor` by [`TRIM_STEP_BYTES`] or more.
pub(crate) fn should_trim(free: usize, floor: usize) -> bool {
    free.saturating_sub(floor) >= TRIM_STEP_BYTES
}

/// Runs until the runtime stops: checks malloc's free memory every second
/// and trims when [`should_trim`] says so. Does nothing where the C library
/// is not glibc.
// malloc_trim(3) through libc: std has no call for it.
#[allow(unsafe_code)]
pub(crate) async fn run() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let mut floor = held_free();
        let mut tick = tokio::time::interval(CHECK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let free = held_free();
            if should_trim(free, floor) {
                // SAFETY: malloc_trim only walks and releases malloc's own
                // free memory; 0 keeps no padding at the top of the heap.
                let released = unsafe { libc::malloc_trim(0) } == 1;
                tracing::debug!(free, floor, released, "returned free memory to the OS");
                floor = held_free();
            } else {
                floor = floor.min(free);
            }
        }
    }
}

/// Bytes malloc holds free in all its arenas (`mallinfo2().fordblks`;
/// pages a trim released still count, so the figure is compared with the
/// one read after the last trim).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
// mallinfo2(3) through libc: std has no call for it.
#[allow(unsafe_code)]
fn held_free() -> usize {
    // SAFETY: mallinfo2 (glibc 2.33 and later) only reads malloc's state.
    unsafe { libc::mallinfo2() }.fordblks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trim_is_due_when_free_memory_grew_by_a_step_since_the_last() {
        assert!(!should_trim(0, 0));
        assert!(!should_trim(TRIM_STEP_BYTES - 1, 0));
        assert!(should_trim(TRIM_STEP_BYTES, 0));
        assert!(should_trim(60 << 20, 2 << 20));
        // Free memory that shrank (reused) is no reason.
        assert!(!should_trim(1 << 20, 50 << 20));
    }
}
