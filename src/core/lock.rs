//! The lock that guards the sampler state.
//!
//! A pthread mutex (rather than `std::sync::Mutex`) so that fork handlers can
//! take and release it without a guard object, and of the *error-checking*
//! kind: if a thread that already holds it asks again (which would mean the
//! collector triggered a GC, and so a FREEOBJ hook, while holding the lock),
//! the second attempt is refused with `LockError::Reentered` instead of
//! deadlocking or handing out a second `&mut` to the same state. The
//! collector's own rule is that nothing run under the lock can allocate a
//! Ruby object, so that refusal should never happen; it is counted if it does.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockError {
    /// Another thread holds the lock (only from `try_lock`).
    Busy,
    /// This thread already holds the lock.
    Reentered,
}

pub struct SamplerLock<T> {
    // Boxed: a pthread mutex must not move once initialised.
    mutex: Box<UnsafeCell<libc::pthread_mutex_t>>,
    // pthread_self() of the holder, 0 when free: lets `try_lock` tell
    // re-entry from contention (both are EBUSY) without blocking.
    owner: AtomicUsize,
    data: UnsafeCell<T>,
}

// SAFETY: access to `data` is serialised by the mutex; T itself must be Send
// because the thread that flushes may differ from the one that allocated.
unsafe impl<T: Send> Send for SamplerLock<T> {}
// SAFETY: as above: shared references only hand out `data` under the mutex.
unsafe impl<T: Send> Sync for SamplerLock<T> {}

pub struct SamplerGuard<'a, T> {
    lock: &'a SamplerLock<T>,
}

impl<T> SamplerLock<T> {
    pub fn new(data: T) -> Self {
        // SAFETY: an all-zero pthread_mutex_t is a valid value to pass to
        // pthread_mutex_init, which fully initialises it.
        let mutex = Box::new(UnsafeCell::new(unsafe { std::mem::zeroed() }));
        // SAFETY: the mutex pointer is valid and not yet shared.
        unsafe { init_errorcheck_mutex(mutex.get()) };
        SamplerLock {
            mutex,
            owner: AtomicUsize::new(0),
            data: UnsafeCell::new(data),
        }
    }

    /// Takes the lock without waiting: what the allocation hook uses, since
    /// waiting there would stall the application thread.
    pub fn try_lock(&self) -> Result<SamplerGuard<'_, T>, LockError> {
        // SAFETY: the mutex was initialised in `new` and lives as long as self.
        match unsafe { libc::pthread_mutex_trylock(self.mutex.get()) } {
            0 => Ok(self.acquired()),
            libc::EBUSY => {
                // EBUSY is also what an error-checking mutex returns to its
                // owner; tell the two apart so re-entry is never mistaken for
                // contention.
                if self.held_by_current_thread() {
                    Err(LockError::Reentered)
                } else {
                    Err(LockError::Busy)
                }
            }
            _ => Err(LockError::Busy),
        }
    }

    /// Takes the lock, waiting for another thread if needed.
    pub fn lock(&self) -> Result<SamplerGuard<'_, T>, LockError> {
        // SAFETY: the mutex was initialised in `new` and lives as long as self.
        match unsafe { libc::pthread_mutex_lock(self.mutex.get()) } {
            0 => Ok(self.acquired()),
            libc::EDEADLK => Err(LockError::Reentered),
            rc => panic!("pthread_mutex_lock failed with {rc}"),
        }
    }

    fn acquired(&self) -> SamplerGuard<'_, T> {
        self.owner.store(current_thread(), Ordering::Relaxed);
        SamplerGuard { lock: self }
    }

    fn held_by_current_thread(&self) -> bool {
        self.owner.load(Ordering::Relaxed) == current_thread()
    }

    /// Takes the lock with no guard, for `pthread_atfork`'s prepare handler:
    /// the child must not inherit a lock held by a thread it does not have.
    pub fn lock_for_fork(&self) {
        // SAFETY: the mutex is initialised; released by `unlock_after_fork`.
        unsafe {
            libc::pthread_mutex_lock(self.mutex.get());
        }
        self.owner.store(current_thread(), Ordering::Relaxed);
    }

    /// In the child after fork: the lock taken by `lock_for_fork` cannot be
    /// unlocked there (an error-checking mutex records the owner's kernel
    /// thread id, and the child's thread has a new one), so it is initialised
    /// afresh. Nothing else runs in the child at that point.
    pub fn reinit_in_child(&self) {
        self.owner.store(0, Ordering::Relaxed);
        // SAFETY: only the forking thread exists in the child and it holds no
        // guard (the lock was taken guard-less by `lock_for_fork`), so no one
        // can be using the mutex while it is re-initialised.
        unsafe {
            std::ptr::write(self.mutex.get(), std::mem::zeroed());
            init_errorcheck_mutex(self.mutex.get());
        }
    }

    /// Releases the lock taken by `lock_for_fork` (in the parent).
    pub fn unlock_after_fork(&self) {
        self.owner.store(0, Ordering::Relaxed);
        // SAFETY: called only after `lock_for_fork` on this thread.
        unsafe {
            libc::pthread_mutex_unlock(self.mutex.get());
        }
    }

    /// The data's address, for code that holds the lock without a guard
    /// (between `lock_for_fork` and `unlock_after_fork`).
    pub fn data_ptr(&self) -> *mut T {
        self.data.get()
    }
}

/// # Safety
/// `mutex` must be valid for writes and not in use by any thread.
unsafe fn init_errorcheck_mutex(mutex: *mut libc::pthread_mutex_t) {
    // SAFETY: attr is initialised before use and destroyed after; the caller
    // guarantees `mutex` is valid and unused.
    unsafe {
        let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
        let rc = libc::pthread_mutexattr_init(&mut attr);
        assert_eq!(rc, 0, "pthread_mutexattr_init failed");
        libc::pthread_mutexattr_settype(&mut attr, libc::PTHREAD_MUTEX_ERRORCHECK);
        let rc = libc::pthread_mutex_init(mutex, &attr);
        libc::pthread_mutexattr_destroy(&mut attr);
        assert_eq!(rc, 0, "pthread_mutex_init failed");
    }
}

fn current_thread() -> usize {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as usize }
}

impl<T> Drop for SamplerLock<T> {
    fn drop(&mut self) {
        // SAFETY: no guard can outlive self, so the mutex is unlocked here.
        unsafe {
            libc::pthread_mutex_destroy(self.mutex.get());
        }
    }
}

impl<T> Deref for SamplerGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard proves this thread holds the mutex.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> DerefMut for SamplerGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard proves this thread holds the mutex, and the
        // error-checking mutex never hands a second guard to the same thread.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T> Drop for SamplerGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.owner.store(0, Ordering::Relaxed);
        // SAFETY: the guard exists only while this thread holds the mutex.
        unsafe {
            libc::pthread_mutex_unlock(self.lock.mutex.get());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn relocking_on_the_same_thread_is_refused_not_deadlocked() {
        let lock = SamplerLock::new(1u32);
        let guard = lock.lock().expect("first lock");
        assert_eq!(lock.lock().err(), Some(LockError::Reentered));
        assert_eq!(lock.try_lock().err(), Some(LockError::Reentered));
        drop(guard);
        assert!(lock.try_lock().is_ok());
    }

    #[test]
    fn another_thread_sees_busy() {
        let lock = Arc::new(SamplerLock::new(0u32));
        let guard = lock.lock().expect("lock");
        let other = Arc::clone(&lock);
        let seen = std::thread::spawn(move || other.try_lock().err())
            .join()
            .expect("thread");
        assert_eq!(seen, Some(LockError::Busy));
        drop(guard);
    }

    #[test]
    fn threads_serialise_updates() {
        let lock = Arc::new(SamplerLock::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = Arc::clone(&lock);
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        *lock.lock().expect("lock") += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        assert_eq!(*lock.lock().expect("lock"), 40_000);
    }

    #[test]
    fn a_forked_child_gets_a_usable_lock() {
        let lock = SamplerLock::new(7u32);
        lock.lock_for_fork();
        // SAFETY: the child only touches the lock and exits at once.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            lock.reinit_in_child();
            let ok = matches!(lock.try_lock(), Ok(ref g) if **g == 7);
            // SAFETY: _exit is async-signal-safe and skips Rust teardown.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        lock.unlock_after_fork();
        let mut status = 0;
        // SAFETY: waiting for the child we just forked.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        assert!(lock.try_lock().is_ok());
    }

    #[test]
    fn fork_style_lock_and_unlock() {
        let lock = SamplerLock::new(5u8);
        lock.lock_for_fork();
        assert_eq!(lock.try_lock().err(), Some(LockError::Reentered));
        lock.unlock_after_fork();
        assert_eq!(*lock.try_lock().expect("unlocked"), 5);
    }
}
