//! The lock that guards the sampler state.
//!
//! One word: 0 when free, else the holder's `pthread_self()`. Taking it is a
//! single compare-and-swap (the allocation hooks take it on every sampled
//! allocation and every free of a tracked object, so a pthread mutex's
//! lock/unlock pair was measurable), and it is never waited on in practice:
//! every holder runs with Ruby's GVL, so another thread can only find it
//! taken in code that runs without the GVL, and then it spins politely.
//!
//! Owner-tagged so that re-entry is refused rather than deadlocked: if a
//! thread that holds it asks again (which would mean the collector
//! triggered a GC, and so a FREEOBJ hook, while holding it) the second
//! attempt gets `LockError::Reentered` instead of a second `&mut` to the
//! same state. The collector's own rule is that nothing run under the lock
//! can allocate a Ruby object, so that refusal should never happen; it is
//! counted if it does. No guard object is needed to take it around fork.

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
    /// pthread_self() of the holder, 0 when free.
    owner: AtomicUsize,
    data: UnsafeCell<T>,
}

// SAFETY: access to `data` is serialised by `owner`; T itself must be Send
// because the thread that flushes may differ from the one that allocated.
unsafe impl<T: Send> Send for SamplerLock<T> {}
// SAFETY: as above: shared references only hand out `data` to the holder.
unsafe impl<T: Send> Sync for SamplerLock<T> {}

pub struct SamplerGuard<'a, T> {
    lock: &'a SamplerLock<T>,
}

impl<T> SamplerLock<T> {
    pub fn new(data: T) -> Self {
        SamplerLock {
            owner: AtomicUsize::new(0),
            data: UnsafeCell::new(data),
        }
    }

    #[inline]
    fn try_acquire(&self, me: usize) -> Result<(), LockError> {
        match self
            .owner
            .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => Ok(()),
            Err(holder) if holder == me => Err(LockError::Reentered),
            Err(_) => Err(LockError::Busy),
        }
    }

    /// Takes the lock without waiting: what the allocation hook uses, since
    /// waiting there would stall the application thread.
    #[inline]
    pub fn try_lock(&self) -> Result<SamplerGuard<'_, T>, LockError> {
        self.try_acquire(current_thread())?;
        Ok(SamplerGuard { lock: self })
    }

    /// Takes the lock, waiting for another thread if needed.
    #[inline]
    pub fn lock(&self) -> Result<SamplerGuard<'_, T>, LockError> {
        self.acquire()?;
        Ok(SamplerGuard { lock: self })
    }

    fn acquire(&self) -> Result<(), LockError> {
        let me = current_thread();
        let mut spins = 0u32;
        loop {
            match self.try_acquire(me) {
                Err(LockError::Busy) => {
                    // Only a thread running without the GVL can hold it now,
                    // briefly: spin a little, then let it run.
                    spins += 1;
                    if spins < 64 {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
                other => return other,
            }
        }
    }

    /// Takes the lock with no guard, for `pthread_atfork`'s prepare handler:
    /// the child must not inherit a lock held by a thread it does not have.
    pub fn lock_for_fork(&self) {
        // Re-entry cannot happen here (fork is not called under the lock);
        // if it did, the lock is simply already held by this thread.
        let _ = self.acquire();
    }

    /// In the child after fork: only the forking thread exists, and it took
    /// the lock in `lock_for_fork`; the child's thread may have another
    /// identity, so the lock is simply marked free.
    pub fn reinit_in_child(&self) {
        self.owner.store(0, Ordering::Release);
    }

    /// Releases the lock taken by `lock_for_fork` (in the parent).
    pub fn unlock_after_fork(&self) {
        self.owner.store(0, Ordering::Release);
    }

    /// The data's address, for code that holds the lock without a guard
    /// (between `lock_for_fork` and `unlock_after_fork`).
    pub fn data_ptr(&self) -> *mut T {
        self.data.get()
    }
}

#[inline]
fn current_thread() -> usize {
    // SAFETY: pthread_self has no preconditions (and never returns 0).
    unsafe { libc::pthread_self() as usize }
}

impl<T> Deref for SamplerGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard proves this thread holds the lock.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> DerefMut for SamplerGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard proves this thread holds the lock, and the lock
        // never hands a second guard to the same thread.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T> Drop for SamplerGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.owner.store(0, Ordering::Release);
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
                    for _ in 0..test_support::miri_scaled(10_000) {
                        *lock.lock().expect("lock") += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        assert_eq!(
            *lock.lock().expect("lock"),
            4 * test_support::miri_scaled(10_000) as u64
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri cannot fork")]
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
