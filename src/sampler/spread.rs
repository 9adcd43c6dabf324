//! How sure a flush's totals are: an estimated variance for each of the
//! four values, from the samples themselves.
//!
//! A sample stands for `w` objects: 1 / (its sample rate x its window's
//! probability q), and more where a cap thinned the samples. Sampling
//! happens in two stages, so the variance has two parts (the textbook
//! estimator for two-stage Poisson sampling, summed over the windows that
//! were on, each window a GC cycle):
//!
//! - between windows: a window is on or off as a whole, so its samples
//!   move together: (1 - q) x (the window's weighted sum)^2;
//! - within a window: each object is sampled on its own with probability
//!   1 / (w q): x^2 (w^2 q - w) for a sample of value x (1 object, or its
//!   size).
//!
//! Without windows (q = 1) only the second part is left: Bernoulli
//! sampling's variance. The relative standard error is the square root of
//! the variance over the total, and the effective sample count is total^2
//! over variance (for plain Bernoulli sampling, the number of samples):
//! fewer effective samples than samples means windows cluster them.

use crate::fast_hash::FastHashMap;

use super::state::FlushedSample;

/// One total's estimate and how sure it is.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Spread {
    pub total: f64,
    pub variance: f64,
}

impl Spread {
    /// The standard error over the total (None without a total: a 0 read
    /// from no sample says nothing of how far it is).
    pub fn relative_standard_error(&self) -> Option<f64> {
        (self.total > 0.0).then(|| self.variance.max(0.0).sqrt() / self.total)
    }

    /// total^2 / variance: as many samples as a plain random sample with
    /// the same relative standard error would have (infinite for a total
    /// known exactly, None without a total).
    pub fn effective_samples(&self) -> Option<f64> {
        if self.total <= 0.0 {
            None
        } else if self.variance <= 0.0 {
            Some(f64::INFINITY)
        } else {
            Some(self.total * self.total / self.variance)
        }
    }
}

/// The spread of each value type (alloc_objects, alloc_space,
/// inuse_objects, inuse_space) over `samples`.
pub fn spreads(samples: &[FlushedSample]) -> [Spread; 4] {
    let mut spreads = [Spread::default(); 4];
    // Each window's weighted sums, keyed by (window, value type).
    let mut window_sums: FastHashMap<(u32, usize), (f64, f64)> = FastHashMap::default();
    for sample in samples {
        let q = f64::from(sample.window_probability).clamp(f64::MIN_POSITIVE, 1.0);
        for (objects, space) in [(0, 1), (2, 3)] {
            let weight = sample.values[objects];
            if weight <= 0.0 {
                continue;
            }
            for index in [objects, space] {
                let value = sample.values[index];
                // value = weight x x, where x is 1 (objects) or the size.
                let x = value / weight;
                let spread = &mut spreads[index];
                spread.total += value;
                spread.variance += x * x * (weight * weight * q - weight).max(0.0);
                let entry = window_sums
                    .entry((sample.window, index))
                    .or_insert((q, 0.0));
                entry.1 += value;
            }
        }
    }
    for ((_, index), (q, sum)) in window_sums {
        spreads[index].variance += (1.0 - q) * sum * sum;
    }
    spreads
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::stack_table::StackId;
    use rand::rngs::SmallRng;
    use rand::{RngExt, SeedableRng};

    fn sample(window: u32, q: f64, weight: f64, size: f64, live: bool) -> FlushedSample {
        let values = if live {
            [0.0, 0.0, weight, weight * size]
        } else {
            [weight, weight * size, 0.0, 0.0]
        };
        FlushedSample {
            stack: StackId::from_stored(0).expect("a stack id"),
            class: 0,
            gc_age: None,
            values,
            window,
            window_probability: q as f32,
        }
    }

    #[test]
    fn without_windows_the_spread_is_bernoulli_sampling() {
        // 10,000 samples at rate 0.01: 1,000,000 objects, 1% error.
        let samples: Vec<_> = (0..10_000)
            .map(|i| sample(i % 50, 1.0, 100.0, 40.0, false))
            .collect();
        let [objects, space, inuse, _] = spreads(&samples);
        assert_eq!(objects.total, 1_000_000.0);
        let rse = objects.relative_standard_error().unwrap();
        assert!((rse - (0.99f64 / 10_000.0).sqrt()).abs() < 1e-9, "{rse}");
        assert!((objects.effective_samples().unwrap() - 10_101.0).abs() < 1.0);
        assert_eq!(
            space.relative_standard_error(),
            objects.relative_standard_error()
        );
        assert_eq!(inuse.relative_standard_error(), None);
        // Every object sampled: exact.
        let exact: Vec<_> = (0..10).map(|i| sample(i, 1.0, 1.0, 8.0, true)).collect();
        let [_, _, inuse, _] = spreads(&exact);
        assert_eq!(inuse.relative_standard_error(), Some(0.0));
        assert_eq!(inuse.effective_samples(), Some(f64::INFINITY));
    }

    #[test]
    fn windows_cluster_samples_and_the_spread_says_so() {
        // 20 windows at q 0.1 of 100 samples each: about 20 effective
        // samples, not 2,000.
        let samples: Vec<_> = (0..2_000)
            .map(|i| sample(i / 100, 0.1, 1_000.0, 1.0, true))
            .collect();
        let [_, _, inuse, _] = spreads(&samples);
        let effective = inuse.effective_samples().unwrap();
        assert!((20.0..25.0).contains(&effective), "{effective}");
    }

    /// Simulates the two stages many times: the estimated variance is, on
    /// average, the variance the estimates really have.
    #[test]
    #[cfg_attr(miri, ignore = "statistical and slow under Miri; no unsafe code")]
    fn the_estimated_variance_matches_the_real_spread() {
        let (q, rate) = (0.2, 0.05);
        let windows = 200u32;
        let per_window = 500u32;
        let mut rng = SmallRng::seed_from_u64(3);
        let (mut totals, mut variances) = (Vec::new(), Vec::new());
        for _ in 0..400 {
            let mut samples = Vec::new();
            for window in 0..windows {
                if rng.random::<f64>() >= q {
                    continue;
                }
                // Windows differ: some allocate little of this site.
                let share = if window % 4 == 0 { 0.9 } else { 0.1 };
                for _ in 0..per_window {
                    if rng.random::<f64>() < share * rate {
                        samples.push(sample(window, q, 1.0 / (q * rate), 1.0, false));
                    }
                }
            }
            let [objects, ..] = spreads(&samples);
            totals.push(objects.total);
            variances.push(objects.variance);
        }
        let n = totals.len() as f64;
        let mean = totals.iter().sum::<f64>() / n;
        let real = totals.iter().map(|t| (t - mean).powi(2)).sum::<f64>() / (n - 1.0);
        let estimated = variances.iter().sum::<f64>() / n;
        let truth = f64::from(windows / 4 * per_window) * 0.9
            + f64::from(windows * 3 / 4 * per_window) * 0.1;
        assert!((mean / truth - 1.0).abs() < 0.02, "{mean} vs {truth}");
        assert!(
            (estimated / real - 1.0).abs() < 0.15,
            "estimated {estimated}, real {real}"
        );
    }
}
