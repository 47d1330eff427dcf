//! The process's allocator policy for long tensor runs on the CPU.
//!
//! A step of a large model allocates and frees the same large buffers every time (activations,
//! scores, the `[n, d]` direction). glibc's allocator hands freed memory above its thresholds
//! back to the kernel (`munmap`, or trimming the heap's top), so every step faults the same
//! pages in again and the kernel zeroes each one, a large part of a large model's step
//! (docs/benchmarks.md, "Freed memory kept", measures it). [`keep_freed_memory`] keeps that
//! memory in the process instead, as PyTorch's and JAX's caching allocators do: the price is a
//! resident size that stays near its peak. With the `mimalloc` feature (on by default) the
//! allocator is mimalloc, and the same policy is its `purge_delay` of -1.

/// What [`keep_freed_memory`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocatorPolicy {
    /// Freed memory stays in the process (glibc's thresholds raised, or mimalloc's purging off).
    KeepFreed,
    /// Left as it was: the user set the allocator's own variables (`GLIBC_TUNABLES`, a
    /// `MALLOC_*_` threshold, `MIMALLOC_PURGE_DELAY`), which win.
    UserSettings,
    /// Not glibc on Linux: the platform's allocator is left alone.
    Unsupported,
}

/// Largest heap top kept free before it is returned to the kernel.
#[cfg(all(target_os = "linux", target_env = "gnu", not(feature = "mimalloc")))]
const TRIM_THRESHOLD: usize = 1 << 30;
/// Requests below this size come from the heap (reused) rather than a fresh `mmap`.
#[cfg(all(target_os = "linux", target_env = "gnu", not(feature = "mimalloc")))]
const MMAP_THRESHOLD: usize = 1 << 30;
/// The heap grows by at least this much at a time.
#[cfg(all(target_os = "linux", target_env = "gnu", not(feature = "mimalloc")))]
const TOP_PAD: usize = 64 << 20;

/// Raises glibc's `mmap`, trim and top-pad thresholds so that freed buffers are reused by the
/// next step rather than returned to the kernel and faulted in again. The `parvi` binary calls
/// it first thing; a library user with long runs calls it at the start of `main`. It leaves a
/// user's own `GLIBC_TUNABLES` / `MALLOC_*_` / `MIMALLOC_PURGE_DELAY` settings alone.
pub fn keep_freed_memory() -> AllocatorPolicy {
    const USER_VARIABLES: [&str; 5] = [
        "GLIBC_TUNABLES",
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_",
        "MALLOC_TOP_PAD_",
        "MIMALLOC_PURGE_DELAY",
    ];
    if USER_VARIABLES.iter().any(|v| std::env::var_os(v).is_some()) {
        return AllocatorPolicy::UserSettings;
    }
    set_thresholds()
}

/// mimalloc's `purge_delay` option (`mi_option_purge_delay` in its `mimalloc.h`): -1 never
/// returns freed memory to the kernel.
#[cfg(feature = "mimalloc")]
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// With mimalloc as the allocator (the `mimalloc` feature), the same policy is its `purge_delay`
/// of -1: freed pages stay committed for the next step.
#[cfg(feature = "mimalloc")]
fn set_thresholds() -> AllocatorPolicy {
    // SAFETY: `mi_option_set` only stores an option's value; it may be called at any time.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    AllocatorPolicy::KeepFreed
}

#[cfg(all(target_os = "linux", target_env = "gnu", not(feature = "mimalloc")))]
fn set_thresholds() -> AllocatorPolicy {
    let as_int = |v: usize| libc::c_int::try_from(v).unwrap_or(libc::c_int::MAX);
    // SAFETY: `mallopt` only changes the allocator's parameters; it may be called at any time,
    // from any thread, and takes plain integers.
    unsafe {
        // Older glibc refuses an mmap threshold above 32 MiB (`HEAP_MAX_SIZE / 2`): take that.
        if libc::mallopt(libc::M_MMAP_THRESHOLD, as_int(MMAP_THRESHOLD)) == 0 {
            libc::mallopt(libc::M_MMAP_THRESHOLD, as_int(32 << 20));
        }
        libc::mallopt(libc::M_TRIM_THRESHOLD, as_int(TRIM_THRESHOLD));
        libc::mallopt(libc::M_TOP_PAD, as_int(TOP_PAD));
    }
    AllocatorPolicy::KeepFreed
}

#[cfg(not(any(feature = "mimalloc", all(target_os = "linux", target_env = "gnu"))))]
fn set_thresholds() -> AllocatorPolicy {
    AllocatorPolicy::Unsupported
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// Minor page faults of the calling thread so far.
    fn thread_page_faults() -> i64 {
        // SAFETY: `getrusage` fills the zeroed struct it is given.
        unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_THREAD, &mut usage);
            usage.ru_minflt
        }
    }

    /// A freed 48 MiB buffer comes back resident: writing it again faults no page. With glibc's
    /// defaults a buffer this size (above the 32 MiB ceiling of its adaptive threshold) is
    /// mapped and unmapped on every round, and the second write faults all 12,288 pages again.
    #[test]
    fn freed_buffers_stay_resident() {
        if keep_freed_memory() != AllocatorPolicy::KeepFreed {
            return; // the user's own glibc settings: nothing of ours to check
        }
        let size = 48 << 20;
        drop(std::hint::black_box(vec![1u8; size]));
        let before = thread_page_faults();
        let again = std::hint::black_box(vec![2u8; size]);
        let faults = thread_page_faults() - before;
        assert_eq!(again[size - 1], 2);
        assert!(faults < 1_000, "{faults} page faults writing a freed 48 MiB buffer again");
    }
}
