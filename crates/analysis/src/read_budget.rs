//! One limit on the memory that profiles read back hold together in this
//! process. Every decode, merge and re-encode reserves its estimate here
//! before allocating, and returns it when done (a decoded profile keeps its
//! share until it is freed). A command over many files (`merge`, `diff`) or
//! an app that parses profiles is refused with a sentence instead: when the
//! allocator fails, Rust aborts the process, and nothing can catch that.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// The default limit: one profile of ~100 MB decompressed (the biggest
/// real heap profiles) with room to spare, well inside 4 GB of address space.
pub const DEFAULT_READ_MEMORY_LIMIT: u64 = 2 << 30;

/// The process's budget for profiles read back.
pub static READ_BUDGET: ReadBudget = ReadBudget::new(DEFAULT_READ_MEMORY_LIMIT);

pub struct ReadBudget {
    limit: AtomicU64,
    held: AtomicU64,
}

/// A reservation refused: `needed` more bytes while `held` were reserved.
/// `at_least`: the work was refused part way (a gunzip), so it needs more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverBudget {
    pub needed: u64,
    pub held: u64,
    pub limit: u64,
    pub at_least: bool,
}

impl fmt::Display for OverBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.held >= self.limit {
            return write!(
                f,
                "cannot start: the profiles already read hold {}, the whole limit ({})",
                megabytes(self.held),
                megabytes(self.limit)
            );
        }
        let about = if self.at_least { "more than" } else { "about" };
        if self.held == 0 {
            write!(
                f,
                "would take {about} {} of memory (limit {})",
                megabytes(self.needed),
                megabytes(self.limit)
            )
        } else {
            write!(
                f,
                "would take {about} {} of memory more, and the profiles already read hold {} (limit {} for all of them)",
                megabytes(self.needed),
                megabytes(self.held),
                megabytes(self.limit)
            )
        }
    }
}

/// "1234 MB", or "12.3 MB" below 100 MB, so that an amount just over a
/// small limit does not read as equal to it.
pub fn megabytes(bytes: u64) -> String {
    let mb = bytes as f64 / (1u64 << 20) as f64;
    if mb < 100.0 {
        format!("{mb:.1} MB")
    } else {
        format!("{mb:.0} MB")
    }
}

impl ReadBudget {
    pub const fn new(limit: u64) -> Self {
        ReadBudget {
            limit: AtomicU64::new(limit),
            held: AtomicU64::new(0),
        }
    }

    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// A lower limit refuses new reservations only: what is held stays.
    pub fn set_limit(&self, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Reserves `bytes`, or says why not.
    pub fn reserve(&'static self, bytes: u64) -> Result<Reservation, OverBudget> {
        let mut reservation = Reservation {
            budget: self,
            bytes: 0,
        };
        reservation.grow(bytes)?;
        Ok(reservation)
    }

    fn take(&self, bytes: u64) -> Result<(), OverBudget> {
        if bytes == 0 {
            return Ok(());
        }
        let limit = self.limit();
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|total| *total <= limit)
            })
            .map(|_| ())
            .map_err(|held| OverBudget {
                needed: bytes,
                held,
                limit,
                at_least: false,
            })
    }

    fn give_back(&self, bytes: u64) {
        self.held.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// Bytes reserved from a budget, returned when dropped.
pub struct Reservation {
    budget: &'static ReadBudget,
    bytes: u64,
}

impl Reservation {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn budget(&self) -> &'static ReadBudget {
        self.budget
    }

    /// Reserves `more` bytes on top; on refusal, `needed` counts what this
    /// reservation already holds too (the whole cost of the work), and
    /// `held` only what others hold.
    pub fn grow(&mut self, more: u64) -> Result<(), OverBudget> {
        self.budget.take(more).map_err(|refused| OverBudget {
            needed: refused.needed.saturating_add(self.bytes),
            held: refused.held.saturating_sub(self.bytes),
            ..refused
        })?;
        self.bytes += more;
        Ok(())
    }

    /// Returns what is held past `bytes` (transient memory now freed).
    pub fn shrink_to(&mut self, bytes: u64) {
        if bytes < self.bytes {
            self.budget.give_back(self.bytes - bytes);
            self.bytes = bytes;
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Reservation({} bytes)", self.bytes)
    }
}

/// A budget of its own, for tests that must not share the process's.
#[cfg(test)]
pub fn test_budget(limit: u64) -> &'static ReadBudget {
    Box::leak(Box::new(ReadBudget::new(limit)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_add_up_to_the_limit_and_return_when_dropped() {
        let budget = test_budget(100);
        let a = budget.reserve(60).unwrap();
        assert!(budget.reserve(0).is_ok(), "nothing is always there to take");
        let refused = budget.reserve(50).unwrap_err();
        assert_eq!(
            refused,
            OverBudget {
                needed: 50,
                held: 60,
                limit: 100,
                at_least: false
            }
        );
        let b = budget.reserve(40).unwrap();
        assert_eq!(budget.held(), 100);
        drop(a);
        assert_eq!(budget.held(), 40);
        drop(b);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn a_growing_reservation_reports_its_whole_cost_when_refused() {
        let budget = test_budget(100);
        let _other = budget.reserve(30).unwrap();
        let mut work = budget.reserve(50).unwrap();
        let refused = work.grow(40).unwrap_err();
        assert_eq!((refused.needed, refused.held), (90, 30));
        assert_eq!(work.bytes(), 50, "a refused growth takes nothing");
        work.shrink_to(10);
        assert_eq!(budget.held(), 40);
        work.shrink_to(20);
        assert_eq!(work.bytes(), 10, "shrinking never grows");
    }

    #[test]
    fn a_lower_limit_refuses_new_reservations_and_keeps_what_is_held() {
        let budget = test_budget(100);
        let held = budget.reserve(80).unwrap();
        budget.set_limit(50);
        assert!(budget.reserve(1).is_err());
        drop(held);
        assert!(budget.reserve(50).is_ok());
    }

    #[test]
    fn refusals_read_as_a_sentence() {
        let alone = OverBudget {
            needed: 3 << 30,
            held: 0,
            limit: 2 << 30,
            at_least: false,
        };
        assert_eq!(
            alone.to_string(),
            "would take about 3072 MB of memory (limit 2048 MB)"
        );
        let together = OverBudget {
            needed: 5 << 19,
            held: 1 << 20,
            limit: 3 << 20,
            at_least: true,
        };
        assert_eq!(
            together.to_string(),
            "would take more than 2.5 MB of memory more, and the profiles already read hold 1.0 MB (limit 3.0 MB for all of them)"
        );
        let full = OverBudget {
            needed: 1,
            held: 18 << 20,
            limit: 1 << 20,
            at_least: false,
        };
        assert_eq!(
            full.to_string(),
            "cannot start: the profiles already read hold 18.0 MB, the whole limit (1.0 MB)"
        );
    }
}
