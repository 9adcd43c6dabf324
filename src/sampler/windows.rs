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
//! Each sample weighs 1 / (its window's probability) on top of 1 / the
//! sample rate, fixed when it is taken (`sample_weight`): a Horvitz-Thompson
//! estimate, right in expectation for every call site and every interval
//! alike. Nothing is rescaled at a flush. (Before, a flush multiplied
//! every sample by all allocations over the allocations in on-windows, per
//! interval for allocations and since start for live objects: exact totals,
//! but an interval without an on-window read 0, so sums over intervals came
//! out low, and a live object sampled in one window was multiplied by a
//! factor that belonged to every other window since start.) How sure an
//! estimate is, is reported beside it (sampler/spread.rs).
//!
//! With a budget (`WindowPolicy::Budget`), q is chosen at each GC from the
//! allocation rate so far: budget / rate, between `MIN_BUDGET_PROBABILITY`
//! and 1. A process that allocates less than its budget keeps the hook on
//! all the time; a busy server samples a share that keeps the hooked
//! allocations near the budget. A window's q depends only on earlier
//! windows, never on what its own allocations are, so nothing is biased.
//!
//! A warm-up keeps every window on until this many allocations have been
//! made since start (`set_warm_up`): a short profile (a block, a script, a
//! test) spans few GC cycles, and would otherwise often sample none of
//! them, while a server pays the hook for under a second of its start.
//! Whether the warm-up is over depends only on the allocation counter at
//! earlier decisions, so it is one more way of choosing q from the past.

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

/// How the probability that a window is on is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WindowPolicy {
    /// The same for every window (1.0: always on, no windows).
    Fixed(f64),
    /// Allocations per second the hook may see: each window's probability
    /// is this over the allocation rate so far, at most 1.
    Budget(f64),
}

/// The lowest probability a budget chooses: below it, windows would be so
/// rare that a flush interval of a busy server held only a handful.
pub const MIN_BUDGET_PROBABILITY: f64 = 0.01;

/// The allocation rate's estimate is an exponential average over about
/// this many nanoseconds: a busy server's GC cycles last milliseconds, and
/// one cycle should not swing q; a quiet process's cycle can last minutes,
/// and should count fully.
const RATE_TIME_CONSTANT_NS: f64 = 1e9;

#[derive(Debug)]
pub struct Windows {
    policy: WindowPolicy,
    /// Allocations since start during which every window is on.
    warm_up: u64,
    rng: SmallRng,
    /// Whether the current window is on, and the probability it had.
    on: bool,
    probability: f64,
    /// Ruby's allocation counter when the current on-window began.
    on_since: u64,
    /// The GC count of the last decision (one decision per GC).
    decided_at_gc: Option<u32>,
    /// Budget: the counter and clock (ns) at the last decision, and the
    /// smoothed allocation rate (per second).
    last_tick: Option<(u64, u64)>,
    rate: Option<f64>,
    /// Allocations in on-windows this interval; the counter when the
    /// interval began (the last flush or start).
    interval_on: u64,
    interval_began: u64,
    /// The counter at start (the warm-up counts from it).
    run_began: u64,
    /// The counter when sampling stopped (stop, or paused for Ractors):
    /// later allocations were not sampled, so no flush counts them.
    frozen_at: Option<u64>,
}

impl Windows {
    pub fn new(policy: WindowPolicy, seed: u64) -> Self {
        let policy = match policy {
            WindowPolicy::Fixed(q) => WindowPolicy::Fixed(q.clamp(0.0, 1.0)),
            budget => budget,
        };
        Windows {
            policy,
            warm_up: 0,
            rng: SmallRng::seed_from_u64(seed),
            on: true,
            probability: 1.0,
            on_since: 0,
            decided_at_gc: None,
            last_tick: None,
            rate: None,
            interval_on: 0,
            interval_began: 0,
            run_began: 0,
            frozen_at: None,
        }
    }

    pub fn policy(&self) -> WindowPolicy {
        self.policy
    }

    /// Every window is on until `allocations` have been made since start
    /// (0: windows from the first GC). Takes effect at the next start.
    pub fn set_warm_up(&mut self, allocations: u64) {
        self.warm_up = allocations;
    }

    pub fn warm_up(&self) -> u64 {
        self.warm_up
    }

    /// Whether the warm-up still keeps every window on at `counter`.
    fn warming_up(&self, counter: u64) -> bool {
        counter.saturating_sub(self.run_began) < self.warm_up
    }

    /// Whether windows are in use at all.
    pub fn enabled(&self) -> bool {
        match self.policy {
            WindowPolicy::Fixed(q) => q < 1.0,
            WindowPolicy::Budget(_) => true,
        }
    }

    pub fn is_on(&self) -> bool {
        self.on
    }

    /// The probability that the current window is on (1.0 without windows).
    pub fn probability(&self) -> f64 {
        self.probability
    }

    /// What a sample taken now weighs for the window it is in: 1 / its
    /// probability (1.0 without windows).
    pub fn sample_weight(&self) -> f64 {
        1.0 / self.probability
    }

    /// At start: the first window's coin is thrown like every other (with
    /// a budget, the rate is not known yet: the first window is on).
    /// `counter`: Ruby's allocation counter; `gc_count`: its GC count;
    /// `now_ns`: a monotonic clock.
    pub fn start(&mut self, counter: u64, gc_count: u32, now_ns: u64) -> bool {
        self.interval_on = 0;
        self.interval_began = counter;
        self.run_began = counter;
        self.last_tick = Some((counter, now_ns));
        self.rate = None;
        self.frozen_at = None;
        self.probability = self.next_probability(counter);
        self.on = self.throw();
        self.on_since = counter;
        self.decided_at_gc = Some(gc_count);
        self.on
    }

    fn next_probability(&self, counter: u64) -> f64 {
        if self.warming_up(counter) {
            return 1.0;
        }
        match (self.policy, self.rate) {
            (WindowPolicy::Fixed(q), _) => q,
            (WindowPolicy::Budget(_), None) => 1.0,
            (WindowPolicy::Budget(budget), Some(rate)) => {
                if rate <= budget {
                    1.0
                } else {
                    (budget / rate).max(MIN_BUDGET_PROBABILITY)
                }
            }
        }
    }

    fn throw(&mut self) -> bool {
        self.probability >= 1.0 || self.rng.random::<f64>() < self.probability
    }

    fn close_on_window(&mut self, counter: u64) {
        if self.on {
            self.interval_on += counter.saturating_sub(self.on_since);
        }
        self.on_since = counter;
    }

    /// Budget: folds the allocation rate since the last decision into the
    /// estimate.
    fn observe_rate(&mut self, counter: u64, now_ns: u64) {
        if let Some((last_counter, last_ns)) = self.last_tick {
            let elapsed = now_ns.saturating_sub(last_ns);
            if elapsed > 0 {
                let rate = counter.saturating_sub(last_counter) as f64 * 1e9 / elapsed as f64;
                let share = 1.0 - (-(elapsed as f64) / RATE_TIME_CONSTANT_NS).exp();
                self.rate = Some(match self.rate {
                    Some(old) => old + share * (rate - old),
                    None => rate,
                });
            }
        }
        self.last_tick = Some((counter, now_ns));
    }

    /// Sampling stopped at `counter` (stop, or paused for Ractors): what
    /// is allocated from here on is in no window.
    pub fn freeze(&mut self, counter: u64) {
        if self.frozen_at.is_none() {
            self.close_on_window(counter);
            self.frozen_at = Some(counter);
        }
    }

    /// In a forked child: its own coins (else every worker forked from one
    /// parent would sample the same cycles), and an interval starting now,
    /// as its allocation samples do.
    pub fn start_child_interval(&mut self, counter: u64, seed: u64) {
        self.rng = SmallRng::seed_from_u64(seed);
        if self.frozen_at.is_none() {
            self.on_since = counter;
            self.interval_on = 0;
            self.interval_began = counter;
        }
    }

    /// After a GC started (from the postponed job): a new window, on or
    /// off. Returns the new state, or None if this GC was decided already.
    pub fn next_window(&mut self, counter: u64, gc_count: u32, now_ns: u64) -> Option<bool> {
        if !self.enabled() || self.frozen_at.is_some() || self.decided_at_gc == Some(gc_count) {
            return None;
        }
        self.close_on_window(counter);
        self.decided_at_gc = Some(gc_count);
        if matches!(self.policy, WindowPolicy::Budget(_)) {
            self.observe_rate(counter, now_ns);
        }
        self.probability = self.next_probability(counter);
        self.on = self.throw();
        Some(self.on)
    }

    /// The share of the allocations since the last flush (or start) made
    /// while the hook was on, without ending the interval (1.0 without
    /// windows; 0.0 before any allocation).
    pub fn coverage_so_far(&self, counter: u64) -> f64 {
        if !self.enabled() {
            return 1.0;
        }
        let counter = self.frozen_at.map_or(counter, |frozen| frozen.min(counter));
        let open = if self.on && self.frozen_at.is_none() {
            counter.saturating_sub(self.on_since)
        } else {
            0
        };
        let all = counter.saturating_sub(self.interval_began);
        if all == 0 {
            0.0
        } else {
            (self.interval_on + open) as f64 / all as f64
        }
    }

    /// At a flush: the share of the interval's allocations made while the
    /// hook was on (1.0 without windows, 0.0 without allocations); starts
    /// the next interval.
    pub fn flush(&mut self, counter: u64) -> f64 {
        let counter = self.frozen_at.map_or(counter, |frozen| frozen.min(counter));
        self.close_on_window(counter);
        let all = counter.saturating_sub(self.interval_began);
        let coverage = if !self.enabled() {
            1.0
        } else if all == 0 {
            0.0
        } else {
            self.interval_on as f64 / all as f64
        };
        self.interval_on = 0;
        self.interval_began = counter;
        coverage
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn fixed(q: f64, seed: u64) -> Windows {
        Windows::new(WindowPolicy::Fixed(q), seed)
    }

    /// `fixed(q, seed)` with a warm-up, started at counter 0.
    fn warming(q: f64, seed: u64, warm_up: u64) -> Windows {
        let mut w = fixed(q, seed);
        w.set_warm_up(warm_up);
        w.start(0, 0, 0);
        w
    }

    /// Decides the windows of GCs 1..=gcs, `per_gc` allocations apart.
    fn run_cycles(w: &mut Windows, gcs: u32, per_gc: u64) {
        for gc in 1..=gcs {
            w.next_window(u64::from(gc) * per_gc, gc, 0);
        }
    }

    #[test]
    fn without_windows_nothing_is_scaled_and_no_gc_switches() {
        let mut w = fixed(1.0, 1);
        assert!(w.start(100, 0, 0));
        assert_eq!(w.next_window(200, 1, MS), None);
        assert_eq!(w.sample_weight(), 1.0);
        assert_eq!(w.flush(300), 1.0);
    }

    #[test]
    fn one_decision_per_gc() {
        let mut w = fixed(0.5, 1);
        w.start(0, 0, 0);
        assert_eq!(w.next_window(10, 0, MS), None, "GC 0 was decided at start");
        assert!(w.next_window(10, 1, MS).is_some());
        assert_eq!(w.next_window(20, 1, 2 * MS), None);
    }

    /// Each interval's estimate is its samples' weights alone: right on
    /// average over many intervals, whether or not a given interval had an
    /// on-window (an interval without one reads 0, one with one more than
    /// its share), and the coverage is the share of allocations hooked.
    #[test]
    fn weights_alone_estimate_every_interval_right_on_average() {
        let mut w = fixed(0.3, 7);
        let (mut counter, mut gc) = (0u64, 0u32);
        let mut on = w.start(counter, 0, 0);
        let (mut estimated, mut truth, mut empty) = (0.0, 0.0, 0);
        for _interval in 0..20_000 {
            // Three GC cycles an interval: often none of them on.
            let mut interval_estimate = 0.0;
            for _ in 0..3 {
                gc += 1;
                let cycle = 1_000 + u64::from(gc % 7) * 100;
                if on {
                    interval_estimate += cycle as f64 * w.sample_weight();
                }
                truth += cycle as f64;
                counter += cycle;
                on = w
                    .next_window(counter, gc, u64::from(gc) * MS)
                    .expect("a new GC");
            }
            let coverage = w.flush(counter);
            assert!((0.0..=1.0).contains(&coverage));
            if interval_estimate == 0.0 {
                empty += 1;
                assert_eq!(coverage, 0.0);
            }
            estimated += interval_estimate;
        }
        assert!(empty > 5_000, "{empty} intervals without an on-window");
        assert!(
            (estimated / truth - 1.0).abs() < 0.03,
            "{estimated} vs {truth}"
        );
    }

    #[test]
    fn the_share_of_on_windows_is_the_probability() {
        let mut w = fixed(0.25, 42);
        w.start(0, 0, 0);
        let on = (1..=100_000u32)
            .filter(|&gc| w.next_window(u64::from(gc) * 10, gc, u64::from(gc) * MS) == Some(true))
            .count();
        assert!((on as f64 / 100_000.0 - 0.25).abs() < 0.01, "{on}");
    }

    #[test]
    fn allocations_after_a_stop_are_in_no_window() {
        for on_at_stop in [true, false] {
            let mut w = fixed(0.5, 11);
            let mut on = w.start(0, 0, 0);
            let mut gc = 0;
            while on != on_at_stop {
                gc += 1;
                on = w
                    .next_window(u64::from(gc) * 100, gc, u64::from(gc) * MS)
                    .unwrap();
            }
            let stopped_at = u64::from(gc) * 100 + 50;
            w.freeze(stopped_at);
            assert_eq!(w.next_window(stopped_at + 1_000, gc + 1, MS), None);
            let late = w.flush(stopped_at + 1_000_000);
            let truth = w.flush(stopped_at);
            assert_eq!(truth, 0.0, "the second flush has no allocations");
            let mut again = fixed(0.5, 11);
            let mut on = again.start(0, 0, 0);
            for gc in 1..=gc {
                on = again
                    .next_window(u64::from(gc) * 100, gc, u64::from(gc) * MS)
                    .unwrap();
            }
            assert_eq!(on, on_at_stop);
            let expected = again.flush(stopped_at);
            assert_eq!(late, expected, "a flush after stop counts up to the stop");
        }
    }

    #[test]
    fn a_forked_child_throws_its_own_coins_from_a_fresh_interval() {
        let mut parent = fixed(0.5, 3);
        parent.start(0, 0, 0);
        let mut child = fixed(0.5, 3);
        let on_at_fork = child.start(0, 0, 0);
        child.start_child_interval(1_000, 99);
        let coins = |w: &mut Windows| -> Vec<bool> {
            (1..=64u32)
                .map(|gc| w.next_window(1_000 + u64::from(gc), gc, 0).unwrap())
                .collect()
        };
        let child_coins = coins(&mut child);
        assert_ne!(coins(&mut parent), child_coins);
        // Allocation 1_000 + k is in the window decided at GC k (the one
        // before GC 1 is the state at the fork); the parent's 1_000
        // allocations before the fork are in none of the child's.
        let on =
            u32::from(on_at_fork) + child_coins[..63].iter().map(|&c| u32::from(c)).sum::<u32>();
        assert_eq!(child.flush(1_064), f64::from(on) / 64.0);
    }

    #[test]
    fn the_warm_up_keeps_every_window_on_then_windows_begin() {
        // 10,000 allocations per GC at q 0.1, a warm-up of 50,000: the
        // windows decided at counters below 50,000 are on and weigh 1.
        let mut w = fixed(0.1, 11);
        w.set_warm_up(50_000);
        assert!(w.start(1_000, 0, 0));
        for gc in 1..=4u32 {
            assert_eq!(
                w.next_window(1_000 + u64::from(gc) * 10_000, gc, 0),
                Some(true)
            );
            assert_eq!(w.sample_weight(), 1.0);
        }
        let mut on = 0;
        for gc in 5..=2_004u32 {
            if w.next_window(1_000 + u64::from(gc) * 10_000, gc, 0) == Some(true) {
                on += 1;
                assert!((w.sample_weight() - 10.0).abs() < 1e-9);
            }
        }
        assert!((f64::from(on) / 2_000.0 - 0.1).abs() < 0.02, "{on}");
        // A flush within the warm-up is exact: everything was hooked.
        let mut w = warming(0.1, 11, 1_000_000);
        run_cycles(&mut w, 50, 10_000);
        assert_eq!(w.flush(500_000), 1.0);
        // The warm-up counts from each start, not from the first.
        w.freeze(600_000);
        assert!(w.start(2_000_000, 60, 0));
        assert_eq!(w.next_window(2_010_000, 61, 0), Some(true));
    }

    #[test]
    fn coverage_so_far_is_what_the_next_flush_reports() {
        let mut w = warming(0.5, 21, 20_000);
        run_cycles(&mut w, 40, 5_000);
        let so_far = w.coverage_so_far(203_000);
        assert!(so_far > 0.0 && so_far < 1.0, "{so_far}");
        assert_eq!(w.flush(203_000), so_far);
        assert_eq!(fixed(1.0, 1).coverage_so_far(5), 1.0);
    }

    #[test]
    fn a_warm_up_keeps_estimates_unbiased() {
        // Site 0 allocates only in the first 300,000 allocations (inside a
        // 200,000 warm-up and past it), site 1 throughout. Averaged over
        // many seeds, the weighted estimates match the truth.
        let (mut estimate, mut truth) = ([0.0f64; 2], [0.0f64; 2]);
        for seed in 0..400 {
            let mut w = fixed(0.2, seed);
            w.set_warm_up(200_000);
            let mut on = w.start(0, 0, 0);
            let mut sampled = [0.0f64; 2];
            let mut counter = 0u64;
            for gc in 1..=100u32 {
                let site = usize::from(counter >= 300_000);
                if on {
                    sampled[site] += 10_000.0 * w.sample_weight();
                }
                truth[site] += 10_000.0;
                counter += 10_000;
                on = w.next_window(counter, gc, 0).expect("a new GC");
            }
            w.flush(counter);
            for site in 0..2 {
                estimate[site] += sampled[site];
            }
        }
        for site in 0..2 {
            let error = (estimate[site] - truth[site]).abs() / truth[site];
            assert!(
                error < 0.03,
                "site {site}: {} vs {}",
                estimate[site],
                truth[site]
            );
        }
    }

    #[test]
    fn under_its_budget_a_process_keeps_the_hook_on() {
        // 10,000 allocations per 100 ms: 100,000/s, under a 200,000/s budget.
        let mut w = Windows::new(WindowPolicy::Budget(200_000.0), 3);
        assert!(w.start(0, 0, 0), "the first window is on: no rate yet");
        for gc in 1..=100u32 {
            let now = u64::from(gc) * 100 * MS;
            assert_eq!(w.next_window(u64::from(gc) * 10_000, gc, now), Some(true));
            assert_eq!(w.sample_weight(), 1.0);
        }
        assert_eq!(w.flush(1_000_000), 1.0);
    }

    #[test]
    fn over_its_budget_the_share_sampled_is_budget_over_rate() {
        // 1M allocations/s against a 100,000/s budget: q = 0.1.
        let mut w = Windows::new(WindowPolicy::Budget(100_000.0), 5);
        w.start(0, 0, 0);
        let mut on = 0;
        for gc in 1..=20_000u32 {
            let now = u64::from(gc) * 10 * MS;
            if w.next_window(u64::from(gc) * 10_000, gc, now) == Some(true) {
                on += 1;
                assert!((w.sample_weight() - 10.0).abs() < 1e-6);
            }
        }
        assert!((f64::from(on) / 20_000.0 - 0.1).abs() < 0.01, "{on}");
        // Far over budget, q stops at its floor.
        let mut w = Windows::new(WindowPolicy::Budget(1.0), 5);
        w.start(0, 0, 0);
        w.next_window(1_000_000, 1, 1_000 * MS);
        assert!((w.sample_weight() - 1.0 / MIN_BUDGET_PROBABILITY).abs() < 1e-6);
    }

    #[test]
    fn a_quiet_spell_after_a_busy_one_turns_the_hook_back_on_within_seconds() {
        let mut w = Windows::new(WindowPolicy::Budget(100_000.0), 9);
        w.start(0, 0, 0);
        let (mut counter, mut now, mut gc) = (0u64, 0u64, 0u32);
        // 2 s at 5M allocations/s, a GC every 10 ms.
        for _ in 0..200 {
            (counter, now, gc) = (counter + 50_000, now + 10 * MS, gc + 1);
            w.next_window(counter, gc, now);
        }
        assert!(
            w.sample_weight() > 40.0,
            "q about 0.02: {}",
            w.sample_weight()
        );
        // Then 1,000 allocations a second, a GC every 2 s: on after 3.
        for _ in 0..3 {
            (counter, now, gc) = (counter + 2_000, now + 2_000 * MS, gc + 1);
            w.next_window(counter, gc, now);
        }
        assert_eq!(w.sample_weight(), 1.0);
        assert!(w.is_on());
    }

    /// Two call sites whose mix changes with the allocation rate, so that
    /// q (chosen from the rate) is lower exactly where one site dominates.
    /// Weighting each window by 1 / q keeps both sites' estimates right on
    /// average; without the weights the busy site is undercounted.
    #[test]
    fn a_budget_keeps_estimates_unbiased_when_the_mix_follows_the_rate() {
        let (mut estimate, mut truth) = ([0.0f64; 2], [0.0f64; 2]);
        // The same sampled windows without the weights, scaled by the
        // plain ratio of all allocations to sampled ones.
        let mut unweighted = [0.0f64; 2];
        for seed in 0..200 {
            let mut w = Windows::new(WindowPolicy::Budget(100_000.0), seed);
            let (mut counter, mut now) = (0u64, 0u64);
            w.start(counter, 0, now);
            let mut sampled = [0.0f64; 2];
            let (mut plain, mut on_allocations) = ([0.0f64; 2], 0.0f64);
            for gc in 1..=400u32 {
                // Busy phases (1M/s, site 0) and quiet ones (50,000/s, site 1).
                let busy = (gc / 50) % 2 == 0;
                let cycle = 10_000u64;
                let site = usize::from(!busy);
                if w.is_on() {
                    sampled[site] += cycle as f64 * w.sample_weight();
                    plain[site] += cycle as f64;
                    on_allocations += cycle as f64;
                }
                truth[site] += cycle as f64;
                counter += cycle;
                now += if busy { 10 * MS } else { 200 * MS };
                w.next_window(counter, gc, now);
            }
            w.flush(counter);
            for site in 0..2 {
                estimate[site] += sampled[site];
                unweighted[site] += plain[site] * counter as f64 / on_allocations;
            }
        }
        // (By a third here: the rate's average lags the half-second phases,
        // so q only partly follows them.)
        assert!(
            unweighted[0] < truth[0] * 0.8,
            "without weights the busy site is undercounted: {unweighted:?} vs {truth:?}"
        );
        for site in 0..2 {
            let error = (estimate[site] - truth[site]).abs() / truth[site];
            assert!(error < 0.02, "site {site}: {estimate:?} vs {truth:?}");
        }
    }
}
