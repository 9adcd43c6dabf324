//! Sampling windows: the NEWOBJ hook on for only part of the program.
//!
//! While Ruby has a NEWOBJ hook, every allocation takes its slow path, a
//! cost the gem cannot lower from inside the hook. So the hook can be on
//! for a random part of the time only: each GC cycle (from one GC's start
//! to the next) is a window, and a window is on with probability `q`,
//! decided by a coin that knows nothing of the program. The hook is
//! switched from a postponed job after the GC starts, never from a hook.
//!
//! Why GC cycles and not clock slots: a window's bounds must not depend on
//! whether it is on. Time slots would: the program runs slower while the
//! hook is on, so an on-slot would hold fewer allocations than an off-slot
//! and every estimate would come out low, by more for code that allocates
//! more. A GC cycle ends after a number of allocations that the hook does
//! not change (the gem allocates no Ruby object), so every allocation is in
//! an on-window with the same probability.
//!
//! Estimates are scaled by the ratio of all allocations to those made in
//! on-windows (both read from Ruby's allocation counter), rather than by
//! 1 / q: the same expectation, but the total allocation count comes out
//! exact, and the variance left is only in how stacks share it.

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

#[derive(Debug)]
pub struct Windows {
    /// Probability that a window is on (1.0: always, no windows).
    probability: f64,
    rng: SmallRng,
    /// Whether the current window is on.
    on: bool,
    /// Ruby's allocation counter when the current on-window began.
    on_since: u64,
    /// The GC count of the last decision (one decision per GC).
    decided_at_gc: Option<u32>,
    /// Allocations in on-windows, and the counter, since the interval
    /// began (the last flush or start).
    interval_on: u64,
    interval_began: u64,
    /// The same since start: live samples may come from any interval.
    run_on: u64,
    run_began: u64,
}

/// What a flush multiplies its samples' values by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowScale {
    /// For allocation samples: allocations / allocations in on-windows,
    /// this interval.
    pub allocations: f64,
    /// For live samples: the same since start.
    pub live: f64,
    /// Share of this interval's allocations made in on-windows.
    pub coverage: f64,
}

impl Windows {
    pub fn new(probability: f64, seed: u64) -> Self {
        Windows {
            probability: probability.clamp(0.0, 1.0),
            rng: SmallRng::seed_from_u64(seed),
            on: true,
            on_since: 0,
            decided_at_gc: None,
            interval_on: 0,
            interval_began: 0,
            run_on: 0,
            run_began: 0,
        }
    }

    pub fn probability(&self) -> f64 {
        self.probability
    }

    /// Whether windows are in use at all.
    pub fn enabled(&self) -> bool {
        self.probability < 1.0
    }

    pub fn is_on(&self) -> bool {
        self.on
    }

    /// At start: the first window's coin is thrown like every other.
    /// `counter`: Ruby's allocation counter; `gc_count`: its GC count.
    pub fn start(&mut self, counter: u64, gc_count: u32) -> bool {
        self.interval_on = 0;
        self.interval_began = counter;
        self.run_on = 0;
        self.run_began = counter;
        self.on = self.throw();
        self.on_since = counter;
        self.decided_at_gc = Some(gc_count);
        self.on
    }

    fn throw(&mut self) -> bool {
        !self.enabled() || self.rng.random::<f64>() < self.probability
    }

    fn close_on_window(&mut self, counter: u64) {
        if self.on {
            let made = counter.saturating_sub(self.on_since);
            self.interval_on += made;
            self.run_on += made;
        }
        self.on_since = counter;
    }

    /// After a GC started (from the postponed job): a new window, on or
    /// off. Returns the new state, or None if this GC was decided already.
    pub fn next_window(&mut self, counter: u64, gc_count: u32) -> Option<bool> {
        if !self.enabled() || self.decided_at_gc == Some(gc_count) {
            return None;
        }
        self.close_on_window(counter);
        self.decided_at_gc = Some(gc_count);
        self.on = self.throw();
        Some(self.on)
    }

    /// At a flush: the scales for its samples; starts the next interval.
    pub fn flush(&mut self, counter: u64) -> WindowScale {
        self.close_on_window(counter);
        let ratio = |all: u64, on: u64| if on == 0 { 0.0 } else { all as f64 / on as f64 };
        let interval_all = counter.saturating_sub(self.interval_began);
        let scale = if self.enabled() {
            WindowScale {
                allocations: ratio(interval_all, self.interval_on),
                live: ratio(counter.saturating_sub(self.run_began), self.run_on),
                coverage: if interval_all == 0 {
                    0.0
                } else {
                    self.interval_on as f64 / interval_all as f64
                },
            }
        } else {
            WindowScale {
                allocations: 1.0,
                live: 1.0,
                coverage: 1.0,
            }
        };
        self.interval_on = 0;
        self.interval_began = counter;
        scale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_windows_nothing_is_scaled_and_no_gc_switches() {
        let mut w = Windows::new(1.0, 1);
        assert!(w.start(100, 0));
        assert_eq!(w.next_window(200, 1), None);
        let scale = w.flush(300);
        assert_eq!(
            (scale.allocations, scale.live, scale.coverage),
            (1.0, 1.0, 1.0)
        );
    }

    #[test]
    fn one_decision_per_gc() {
        let mut w = Windows::new(0.5, 1);
        w.start(0, 0);
        assert_eq!(w.next_window(10, 0), None, "GC 0 was decided at start");
        assert!(w.next_window(10, 1).is_some());
        assert_eq!(w.next_window(20, 1), None);
    }

    #[test]
    fn scales_by_all_allocations_over_those_in_on_windows() {
        // Drive the coin until we see on and off windows, tracking truth.
        let mut w = Windows::new(0.3, 7);
        let mut counter = 0;
        let mut on_allocations = 0;
        let mut on = w.start(counter, 0);
        for gc in 1..=1_000u32 {
            let cycle = 1_000 + u64::from(gc % 7) * 100;
            if on {
                on_allocations += cycle;
            }
            counter += cycle;
            on = w.next_window(counter, gc).expect("a new GC");
        }
        let scale = w.flush(counter);
        let expected = counter as f64 / on_allocations as f64;
        assert!((scale.allocations - expected).abs() < 1e-9);
        assert!((scale.live - expected).abs() < 1e-9);
        assert!(
            (scale.coverage - 0.3).abs() < 0.05,
            "coverage {}",
            scale.coverage
        );
        // The next interval starts afresh; the run keeps counting.
        on_allocations = if on { 500 } else { 0 };
        let next = w.flush(counter + 500);
        if on {
            assert!((next.allocations - 1.0).abs() < 1e-9);
        } else {
            assert_eq!(next.allocations, 0.0);
        }
        assert!(next.live > 1.0 && on_allocations <= 500);
    }

    #[test]
    fn the_share_of_on_windows_is_the_probability() {
        let mut w = Windows::new(0.25, 42);
        w.start(0, 0);
        let on = (1..=100_000u32)
            .filter(|&gc| w.next_window(u64::from(gc) * 10, gc) == Some(true))
            .count();
        assert!((on as f64 / 100_000.0 - 0.25).abs() < 0.01, "{on}");
    }
}
