//! What one sample costs the process, and the in-window sample rate that
//! keeps the time spent on samples within a share of the time it runs.
//!
//! The window budget bounds the allocations the hook sees. Inside a window
//! a sample costs far more than a hooked allocation (a backtrace, interning
//! it, and later an object id and a size): ~1 µs on a shallow stack, 5 µs
//! or more 150 frames deep, where the windows' samples alone took several
//! percent of a Rails app's time. So the rate inside windows is also held
//! to `SAMPLE_TIME_SHARE` of running time, from the measured cost. Few
//! samples per window over the same windows lose little: samples in one
//! window (one request, one loop) say much the same thing.

/// The share of the process's running time its samples may take.
pub const SAMPLE_TIME_SHARE: f64 = 0.01;

/// Each measurement moves the average this much of the way.
const SMOOTHING: f64 = 1.0 / 64.0;

/// A measurement counts as at most this many times the average.
const OUTLIER_FACTOR: f64 = 4.0;

/// Running averages of what a sample costs (ns): in the hook (backtrace,
/// interning, recording), and afterwards (its upkeep: object id, size).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SampleCost {
    in_hook_ns: f64,
    upkeep_ns: f64,
}

impl SampleCost {
    /// One sample took `ns` in the hook.
    pub fn record_in_hook(&mut self, ns: u64) {
        Self::update(&mut self.in_hook_ns, ns as f64);
    }

    /// Upkeep of `samples` new samples took `ns` in all.
    pub fn record_upkeep(&mut self, ns: u64, samples: usize) {
        if samples > 0 {
            Self::update(&mut self.upkeep_ns, ns as f64 / samples as f64);
        }
    }

    fn update(average: &mut f64, value: f64) {
        if !value.is_finite() || value < 0.0 {
            return;
        }
        *average = if *average == 0.0 {
            value
        } else {
            // A sample preempted, or a job that also finished a lazy
            // sweep, says little of the next: at most a few times the
            // average counts (a real change still shows within ~100).
            let value = value.min(OUTLIER_FACTOR * *average);
            *average + SMOOTHING * (value - *average)
        };
    }

    /// What a sample costs, all in (0 until measured).
    pub fn per_sample_ns(&self) -> f64 {
        self.in_hook_ns + self.upkeep_ns
    }

    /// The highest sample rate among `hooked_per_second` hooked allocations
    /// (per second of running) whose samples take at most
    /// `SAMPLE_TIME_SHARE` of the time; 1.0 while the cost is unknown.
    pub fn rate_cap(&self, hooked_per_second: f64) -> f64 {
        let cost = self.per_sample_ns();
        if cost <= 0.0 || hooked_per_second <= 0.0 || !hooked_per_second.is_finite() {
            return 1.0;
        }
        (SAMPLE_TIME_SHARE * 1e9 / (cost * hooked_per_second)).min(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_cost_caps_nothing() {
        let cost = SampleCost::default();
        assert_eq!(cost.rate_cap(1e6), 1.0);
    }

    #[test]
    fn the_cap_keeps_sampling_to_its_share_of_time() {
        let mut cost = SampleCost::default();
        cost.record_in_hook(4_000);
        cost.record_upkeep(3_000, 3);
        assert_eq!(cost.per_sample_ns(), 5_000.0);
        // 50,000 hooked allocations a second: 2,000 samples of 5 µs are 1%.
        let cap = cost.rate_cap(50_000.0);
        assert!((cap - 0.04).abs() < 1e-12);
        assert!((cap * 50_000.0 * 5_000.0 / 1e9 - SAMPLE_TIME_SHARE).abs() < 1e-12);
    }

    #[test]
    fn the_average_follows_the_cost_smoothly() {
        let mut cost = SampleCost::default();
        cost.record_in_hook(1_000);
        for _ in 0..1_000 {
            cost.record_in_hook(3_000);
        }
        assert!((cost.per_sample_ns() - 3_000.0).abs() < 1.0);
        // One slow sample (a page fault, a preemption) moves it little.
        cost.record_in_hook(1_000_000);
        assert!(cost.per_sample_ns() < 3_200.0);
        // A real change (a deeper stack) shows within ~100 samples.
        for _ in 0..150 {
            cost.record_in_hook(10_000);
        }
        assert!(cost.per_sample_ns() > 9_000.0, "{}", cost.per_sample_ns());
    }

    #[test]
    fn upkeep_of_no_samples_is_ignored() {
        let mut cost = SampleCost::default();
        cost.record_upkeep(1_000, 0);
        assert_eq!(cost.per_sample_ns(), 0.0);
    }
}
