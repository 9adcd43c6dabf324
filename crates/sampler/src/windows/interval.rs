//! What a flush reads of its interval's windows (`WindowFlush`): the share
//! of allocations the hook saw, what late polls missed, what the block
//! under way has not looked at yet, and what one window sample weighed,
//! for the errors of sampler/spread.rs.

use super::Windows;

/// An interval's windows, read by a flush.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowFlush {
    /// Share of the interval's allocations in windows the hook saw (1.0
    /// without windows; 0.0 without allocations).
    pub coverage: f64,
    /// In-window allocations the hook came on too late to see.
    pub missed: u64,
    /// How many allocations those stand for (each 1 / its window's q).
    pub missed_estimate: f64,
    /// Windows (blocks) the interval's allocations went past.
    pub windows: u64,
    /// How far in-use may read low for allocations windows missed (their
    /// objects were never tracked): the larger of the share of this
    /// interval's allocations missed and the share since start, estimated.
    /// Which of the missed objects are still alive is unknown.
    pub inuse_missed_share: f64,
    /// What one in-window sample weighed (1 / (rate x q), before any cap
    /// thinned it): the heaviest of this interval's windowed blocks, and
    /// that or the latest windowed block's since start (0.0: none).
    pub window_sample_weight: f64,
    pub latest_window_sample_weight: f64,
    /// Shares of this interval's allocations, and of those since start, in
    /// the block under way before its window: no window has looked at
    /// them yet (when it comes, its samples stand for them), so the
    /// allocations and in-use read them as nothing for now.
    pub unwindowed_share: f64,
    pub inuse_unwindowed_share: f64,
    /// The interval's own counts, for `give_back`.
    pub tally: IntervalTally,
}

/// What an interval counted of its windows: given back to the next interval
/// when the flush that ended it does not deliver its profile, so that the
/// next profile's windows cover both.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct IntervalTally {
    on: u64,
    missed: u64,
    missed_estimate: f64,
    windows: u64,
    began: u64,
    window_weight: f64,
}

impl Windows {
    /// A new interval (start, a forked child, a flush) begins at `counter`.
    pub(super) fn begin_interval(&mut self, counter: u64) {
        self.interval_on = 0;
        self.interval_missed = 0;
        self.interval_missed_estimate = 0.0;
        self.interval_windows = 0;
        self.interval_began = counter;
        // The block under way is this interval's too.
        self.interval_window_weight = self.block.sample_weight();
    }

    /// What the hook has seen of the cursor's stretch up to `counter` and
    /// not counted yet.
    fn open_observation(&self, counter: u64) -> u64 {
        match self.observed_from {
            Some(from) => {
                let (s, e) = self.current();
                counter.clamp(s, e).saturating_sub(from)
            }
            None => 0,
        }
    }

    /// The share of the allocations since the last flush (or start) in
    /// windows the hook saw, without ending the interval (1.0 without
    /// windows; 0.0 before any allocation).
    pub fn coverage_so_far(&self, counter: u64) -> f64 {
        if !self.enabled() {
            return 1.0;
        }
        let counter = self.frozen_at.map_or(counter, |frozen| frozen.min(counter));
        let all = counter.saturating_sub(self.interval_began);
        if all == 0 {
            0.0
        } else {
            ((self.interval_on + self.open_observation(counter)) as f64 / all as f64).min(1.0)
        }
    }

    /// Allocations of the block under way up to `counter` that its window
    /// has not reached yet (0 once it has, and for blocks sampled in full).
    fn unwindowed(&self, counter: u64) -> u64 {
        let block = &self.block;
        if block.probability >= 1.0 || counter <= block.begin {
            return 0;
        }
        // (A window that wraps begins at the block's start.)
        let window_start = block.stretches().0[0].0;
        if counter < window_start {
            counter - block.begin
        } else {
            0
        }
    }

    /// See `WindowFlush::inuse_missed_share`.
    fn inuse_missed_share(&self, counter: u64) -> f64 {
        share_of(self.interval_missed_estimate, counter, self.interval_began).max(share_of(
            self.run_missed_estimate,
            counter,
            self.run_began,
        ))
    }

    /// At a flush: the interval's windows; starts the next interval.
    pub fn flush(&mut self, counter: u64) -> WindowFlush {
        let counter = self.frozen_at.map_or(counter, |frozen| frozen.min(counter));
        let unwindowed = self.unwindowed(counter) as f64;
        let flush = WindowFlush {
            coverage: self.coverage_so_far(counter),
            missed: self.interval_missed,
            missed_estimate: self.interval_missed_estimate,
            windows: self.interval_windows,
            inuse_missed_share: self.inuse_missed_share(counter),
            window_sample_weight: self.interval_window_weight,
            latest_window_sample_weight: self.interval_window_weight.max(self.latest_window_weight),
            unwindowed_share: share_of(unwindowed, counter, self.interval_began),
            inuse_unwindowed_share: share_of(unwindowed, counter, self.run_began),
            tally: IntervalTally::default(),
        };
        // What the hook saw of the open stretch belongs to this interval.
        if let Some(from) = self.observed_from {
            self.close_observation(counter);
            let (s, e) = self.current();
            self.observed_from = Some(counter.clamp(s, e).max(from));
        }
        let tally = IntervalTally {
            on: self.interval_on,
            missed: self.interval_missed,
            missed_estimate: self.interval_missed_estimate,
            windows: self.interval_windows,
            began: self.interval_began,
            window_weight: self.interval_window_weight,
        };
        self.begin_interval(counter);
        WindowFlush { tally, ..flush }
    }

    /// The flush that ended the interval of `tally` did not deliver its
    /// profile: the interval under way takes it in, as if it had begun
    /// where that one did.
    pub fn give_back(&mut self, tally: IntervalTally) {
        self.interval_on += tally.on;
        self.interval_missed += tally.missed;
        self.interval_missed_estimate += tally.missed_estimate;
        self.interval_windows += tally.windows;
        self.interval_began = self.interval_began.min(tally.began);
        self.interval_window_weight = self.interval_window_weight.max(tally.window_weight);
    }
}

/// `count` over the allocations from `since` to `counter`, at most 1 (0.0
/// without any).
fn share_of(count: f64, counter: u64, since: u64) -> f64 {
    let all = counter.saturating_sub(since);
    if all == 0 {
        0.0
    } else {
        (count / all as f64).min(1.0)
    }
}
