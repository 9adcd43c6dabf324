//! Which allocations get sampled.
//!
//! Instead of flipping a coin per allocation, we draw how many allocations to
//! skip before the next sample from the geometric distribution with mean
//! (1 - rate) / rate. That gives exactly the same distribution of sampled
//! allocations as a coin flip with probability `rate`, but costs one decrement
//! on the allocation path and one random draw per *sample*.

use std::sync::atomic::{AtomicU64, Ordering};

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

/// The allocation-path half: a countdown of allocations still to skip. Only
/// ever touched by threads holding the GVL, so relaxed atomics suffice; they
/// are atomics so that the type is honestly `Sync`.
#[derive(Debug, Default)]
pub struct SkipCountdown {
    remaining: AtomicU64,
}

impl SkipCountdown {
    /// True if this allocation is to be skipped (and counts it).
    #[inline]
    pub fn skip(&self) -> bool {
        let remaining = self.remaining.load(Ordering::Relaxed);
        if remaining == 0 {
            return false;
        }
        self.remaining.store(remaining - 1, Ordering::Relaxed);
        true
    }

    pub fn set(&self, gap: u64) {
        self.remaining.store(gap, Ordering::Relaxed);
    }
}

/// The slow half: draws the gaps. Lives behind the sampler lock.
#[derive(Debug)]
pub struct GapSampler {
    rate: f64,
    seed: u64,
    // ln(1 - rate), cached: the draw is ln(u) / ln(1 - rate).
    log_complement: f64,
    rng: SmallRng,
}

impl GapSampler {
    /// `rate` must be within 0.0..=1.0 (the binding layer validates it).
    pub fn new(rate: f64, seed: u64) -> Self {
        let mut sampler = GapSampler {
            rate: 1.0,
            seed,
            log_complement: f64::NEG_INFINITY,
            rng: SmallRng::seed_from_u64(seed),
        };
        sampler.set_rate(rate);
        sampler
    }

    pub fn set_rate(&mut self, rate: f64) {
        assert!(
            (0.0..=1.0).contains(&rate),
            "sample rate {rate} outside 0..=1"
        );
        self.rate = rate;
        // ln_1p, not (1.0 - rate).ln(): below ~1e-16, 1.0 - rate rounds to
        // 1.0, whose log 0.0 made every gap 0 (everything sampled).
        self.log_complement = (-rate).ln_1p();
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// How much one sample stands for: 1 / rate (0 when nothing is sampled).
    pub fn weight(&self) -> f64 {
        if self.rate > 0.0 {
            1.0 / self.rate
        } else {
            0.0
        }
    }

    /// Number of allocations to skip before the next sampled one.
    pub fn next_gap(&mut self) -> u64 {
        if self.rate >= 1.0 {
            return 0;
        }
        if self.rate <= 0.0 {
            return u64::MAX;
        }
        // u in (0, 1]: 1 - [0, 1).
        let u: f64 = 1.0 - self.rng.random::<f64>();
        let gap = (u.ln() / self.log_complement).floor();
        if gap >= u64::MAX as f64 {
            u64::MAX
        } else {
            gap as u64
        }
    }
}

/// A seed that differs between processes and between collectors.
pub fn entropy_seed(extra: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let pid = u64::from(std::process::id());
    mix_seed(nanos ^ pid.rotate_left(32), extra)
}

/// A new seed from `seed` and `extra` (e.g. a forked child's pid): different
/// inputs give unrelated seeds, the same inputs the same seed.
pub fn mix_seed(seed: u64, extra: u64) -> u64 {
    // splitmix64 finaliser over the mixed inputs.
    let mut z = seed ^ extra.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampled_fraction(rate: f64, allocations: u64) -> f64 {
        let mut gaps = GapSampler::new(rate, 42);
        let countdown = SkipCountdown::default();
        countdown.set(gaps.next_gap());
        let mut sampled = 0u64;
        for _ in 0..allocations {
            if !countdown.skip() {
                sampled += 1;
                countdown.set(gaps.next_gap());
            }
        }
        sampled as f64 / allocations as f64
    }

    #[test]
    fn rate_one_samples_everything() {
        assert_eq!(sampled_fraction(1.0, 10_000), 1.0);
    }

    #[test]
    fn rate_zero_samples_nothing() {
        assert_eq!(sampled_fraction(0.0, 10_000), 0.0);
    }

    #[test]
    #[cfg_attr(miri, ignore = "statistical, no unsafe code; too slow under Miri")]
    fn gaps_match_the_rate_on_average() {
        for &rate in &[0.5, 0.1, 0.01] {
            let fraction = sampled_fraction(rate, 2_000_000);
            let error = (fraction - rate).abs() / rate;
            assert!(error < 0.05, "rate {rate}: sampled {fraction}");
        }
    }

    #[test]
    fn same_seed_same_gaps() {
        let mut a = GapSampler::new(0.01, 7);
        let mut b = GapSampler::new(0.01, 7);
        let xs: Vec<u64> = (0..100).map(|_| a.next_gap()).collect();
        let ys: Vec<u64> = (0..100).map(|_| b.next_gap()).collect();
        assert_eq!(xs, ys);
    }

    #[test]
    #[cfg_attr(miri, ignore = "statistical, no unsafe code; too slow under Miri")]
    fn tiny_rates_sample_almost_nothing() {
        for &rate in &[5e-324, 1e-300, 1e-18, 1e-12] {
            assert_eq!(sampled_fraction(rate, 100_000), 0.0, "rate {rate}");
            assert!(
                GapSampler::new(rate, 3).next_gap() > 1_000_000,
                "rate {rate}"
            );
        }
    }

    #[test]
    fn weight_is_inverse_rate() {
        assert_eq!(GapSampler::new(0.25, 1).weight(), 4.0);
        assert_eq!(GapSampler::new(0.0, 1).weight(), 0.0);
    }

    #[test]
    #[should_panic]
    fn rate_out_of_range_is_rejected() {
        GapSampler::new(1.5, 1);
    }
}
