//! Running a kernel's independent parts on several threads: on the OpenMP team torch already
//! runs its ops on, where that runtime (GNU libgomp) is loaded in this process, else on scoped
//! threads of our own.
//!
//! Why torch's team: torch's OpenMP threads spin-wait for a while after each op, so on a machine
//! with as many cores as torch threads, threads of our own started right after a torch op share
//! the cores with spinning ones (the int8 head's previous version measured 11.6 ms for 32 rows
//! right after a torch op on two threads of its own, 4.7 ms with the cores to itself, on a
//! 2-core AVX2 EPYC). A parallel region started through libgomp's own entry point runs on those
//! very threads, as torch's `at::parallel_for` and numba's OpenMP layer do.
//!
//! The entry point is `GOMP_parallel` (what GCC emits for `#pragma omp parallel` since GCC 4.9),
//! looked up in an already loaded `libgomp.so.1` (RTLD_NOLOAD: this never loads it).

use std::ffi::{c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

type GompParallel = unsafe extern "C" fn(extern "C" fn(*mut c_void), *mut c_void, c_uint, c_uint);
type OmpQuery = unsafe extern "C" fn() -> c_int;

#[derive(Clone, Copy)]
struct Gomp {
    parallel: GompParallel,
    thread_num: OmpQuery,
    num_threads: OmpQuery,
}

fn gomp() -> Option<Gomp> {
    static GOMP: OnceLock<Option<Gomp>> = OnceLock::new();
    *GOMP.get_or_init(find_gomp)
}

#[cfg(target_os = "linux")]
fn find_gomp() -> Option<Gomp> {
    // SAFETY: dlopen with RTLD_NOLOAD only returns a handle to a library already loaded (its
    // reference count is raised, so it stays loaded); dlsym returns the symbols' addresses,
    // which are transmuted to their documented C signatures only when present.
    unsafe {
        let handle = libc::dlopen(c"libgomp.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if handle.is_null() {
            return None;
        }
        let sym = |name: &std::ffi::CStr| libc::dlsym(handle, name.as_ptr());
        let (p, t, n) = (
            sym(c"GOMP_parallel"),
            sym(c"omp_get_thread_num"),
            sym(c"omp_get_num_threads"),
        );
        if p.is_null() || t.is_null() || n.is_null() {
            return None;
        }
        Some(Gomp {
            parallel: std::mem::transmute::<*mut c_void, GompParallel>(p),
            thread_num: std::mem::transmute::<*mut c_void, OmpQuery>(t),
            num_threads: std::mem::transmute::<*mut c_void, OmpQuery>(n),
        })
    }
}

#[cfg(not(target_os = "linux"))]
fn find_gomp() -> Option<Gomp> {
    None
}

/// Whether `run` would use an OpenMP team (tests and diagnostics).
pub fn on_openmp() -> bool {
    gomp().is_some()
}

struct Job<'a> {
    part: &'a (dyn Fn(usize) + Sync),
    parts: usize,
    gomp: Gomp,
    panicked: AtomicBool,
}

extern "C" fn team_member(data: *mut c_void) {
    // SAFETY: `data` is the `Job` that `run` passed to GOMP_parallel, alive until it returns.
    let job = unsafe { &*(data as *const Job<'_>) };
    // SAFETY: called inside the parallel region GOMP_parallel started.
    let (me, team) = unsafe { ((job.gomp.thread_num)(), (job.gomp.num_threads)()) };
    let (me, team) = (me.max(0) as usize, team.max(1) as usize);
    // A team smaller than asked for (nested regions, thread limits) shares out the parts.
    for p in (me..job.parts).step_by(team) {
        // No unwinding through libgomp's C frames: a panic is recorded and reported by `run`.
        if catch_unwind(AssertUnwindSafe(|| (job.part)(p))).is_err() {
            job.panicked.store(true, Ordering::Relaxed);
        }
    }
}

/// Calls `part(p)` for every p in 0..parts, on up to `parts` threads at once; false if a part
/// panicked (the others still ran).
pub fn run(parts: usize, part: &(dyn Fn(usize) + Sync)) -> bool {
    if parts <= 1 {
        return (0..parts).all(|p| catch_unwind(AssertUnwindSafe(|| part(p))).is_ok());
    }
    if let Some(gomp) = gomp() {
        let job = Job {
            part,
            parts,
            gomp,
            panicked: AtomicBool::new(false),
        };
        let threads = c_uint::try_from(parts).unwrap_or(c_uint::MAX);
        // SAFETY: GOMP_parallel runs `team_member(data)` on each thread of the team and returns
        // once all have finished, so `job` outlives every use of the pointer.
        unsafe {
            (gomp.parallel)(
                team_member,
                &job as *const Job<'_> as *mut c_void,
                threads,
                0,
            )
        };
        return !job.panicked.load(Ordering::Relaxed);
    }
    std::thread::scope(|scope| {
        let others: Vec<_> = (1..parts)
            .map(|p| scope.spawn(move || catch_unwind(AssertUnwindSafe(|| part(p))).is_ok()))
            .collect();
        let first = catch_unwind(AssertUnwindSafe(|| part(0))).is_ok();
        others
            .into_iter()
            .fold(first, |ok, h| h.join().unwrap_or(false) && ok)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_part_runs_once() {
        for parts in [0, 1, 2, 3, 7] {
            let hits: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
            assert!(run(parts, &|p| {
                hits[p].fetch_add(1, Ordering::Relaxed);
            }));
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn a_panicking_part_is_reported_and_the_others_run() {
        let hits = AtomicUsize::new(0);
        let ok = run(3, &|p| {
            hits.fetch_add(1, Ordering::Relaxed);
            if p == 1 {
                panic!("part 1 fails");
            }
        });
        assert!(!ok);
        assert_eq!(hits.load(Ordering::Relaxed), 3);
    }
}
