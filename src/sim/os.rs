//! Process randomness drawn from the simulation's seed.
//!
//! std's `HashMap` keys (through the weakly linked libc `getrandom`), and
//! the `getrandom` crate 0.3/0.4 under `rand`'s thread RNG (which finds
//! `getrandom` with `dlsym`) both call the C symbol `getrandom`. A
//! simulation binary defines that symbol with [`crate::sim_os_overrides!`],
//! so on a thread seeded with [`seed_thread`] every such draw comes from a
//! per-thread generator; on any other thread (and before `main`: glibc's
//! malloc draws too) it is the raw `SYS_getrandom` system call.
//!
//! Never in a production binary: the generator is not cryptographic.
//! `ring` (through `getrandom` 0.2) makes the system call itself and is not
//! captured: it only chooses bytes inside encrypted packets (key shares,
//! nonces), never their sizes or timing, so traces record sizes and times,
//! never ciphertext; the simulation's certificates use Ed25519, whose
//! signatures are deterministic and of one size.

// Unsafe by nature: a C symbol (`getrandom`) defined for libc and Rust
// callers, writing through the raw pointer it is handed (the one place the
// crate allows unsafe code, lib.rs).
#![allow(unsafe_code)]

use std::cell::Cell;

thread_local! {
    /// splitmix64 state of this thread's generator.
    static STATE: Cell<u64> = const { Cell::new(0) };
    /// True on a thread seeded for a simulation.
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
    /// Bytes drawn on this thread since it was seeded.
    static DRAWN: Cell<u64> = const { Cell::new(0) };
}

/// Seeds this thread: from now on `getrandom` on this thread is the
/// generator seeded with `seed`. Call it first thing on a fresh thread,
/// before anything creates a `HashMap` or touches `rand`.
pub fn seed_thread(seed: u64) {
    STATE.set(seed ^ 0x5eed_5eed_5eed_5eed);
    DRAWN.set(0);
    ACTIVE.set(true);
}

/// Whether this thread draws from a simulation seed.
pub fn is_seeded() -> bool {
    ACTIVE.get()
}

/// Bytes drawn through the override on this thread since [`seed_thread`]:
/// zero means the override is not linked (see [`crate::sim_os_overrides!`]).
pub fn drawn() -> u64 {
    DRAWN.get()
}

fn next() -> u64 {
    // splitmix64 (Steele, Lea, Flood 2014).
    let s = STATE.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
    STATE.set(s);
    let mut z = s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The body of the `getrandom` override: fills `len` bytes at `buf` from
/// this thread's generator and returns true, or returns false when this
/// thread is not seeded. Never allocates, panics or initialises lazily.
///
/// # Safety
/// `buf` must be valid for writes of `len` bytes (the `getrandom(2)` contract).
#[doc(hidden)]
pub unsafe fn fill(buf: *mut u8, len: usize) -> bool {
    if !ACTIVE.get() {
        return false;
    }
    let mut i = 0;
    while i < len {
        let bytes = next().to_le_bytes();
        let n = (len - i).min(8);
        // SAFETY: i + n <= len and the caller guarantees `len` writable bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.add(i), n) };
        i += n;
    }
    DRAWN.set(DRAWN.get().wrapping_add(len as u64));
    true
}

/// The raw `getrandom(2)` system call, for threads that are not seeded.
///
/// # Safety
/// As `getrandom(2)`.
#[doc(hidden)]
pub unsafe fn raw_getrandom(buf: *mut u8, len: usize, flags: u32) -> isize {
    // SAFETY: forwarded as is; the caller upholds getrandom(2)'s contract.
    unsafe { libc::syscall(libc::SYS_getrandom, buf, len, flags) as isize }
}

/// Defines the exported C symbol `getrandom` in the binary that invokes
/// it (a simulation binary or test, never the production binary), routing
/// it to [`fill`] on seeded threads and to the raw system call elsewhere.
/// Check it is in the dynamic symbol table with `nm -D <binary> | grep getrandom`.
#[macro_export]
macro_rules! sim_os_overrides {
    () => {
        /// Simulation override of libc's `getrandom` (see `peerlb::sim::os`).
        ///
        /// # Safety
        /// As `getrandom(2)`.
        // Unsafe by nature: it replaces libc's `getrandom` for the whole
        // binary (`peerlb::sim::os`).
        #[allow(unsafe_code)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn getrandom(
            buf: *mut ::std::ffi::c_void,
            buflen: usize,
            flags: ::std::ffi::c_uint,
        ) -> isize {
            // SAFETY: getrandom(2)'s contract is the caller's.
            unsafe {
                if $crate::sim::os::fill(buf.cast(), buflen) {
                    return buflen as isize;
                }
                $crate::sim::os::raw_getrandom(buf.cast(), buflen, flags)
            }
        }
    };
}
