//! How sure a flush's totals are: an estimated variance for each of the
//! four values, from the samples themselves.
//!
//! A sample stands for `w` objects: 1 / (the sample rate x its window's
//! probability q), and more where a cap thinned the samples. Windows are
//! placed one per block of the allocation sequence (sampler/windows/mod.rs):
//! stratified sampling with one window per stratum, so the variance is
//! estimated the way such designs are, from the differences between
//! neighbouring blocks' estimates (the successive-difference estimator:
//! half the sum of their squares). It takes in both the choice of the
//! windows and the sampling inside them, and leans high where the program
//! changes from block to block, never low. Blocks sampled in full (q = 1:
//! the warm-up, a process under its budget, no windows) have no window to
//! choose: only sampling inside them varies, x^2 (w^2 - w) for a sample
//! of value x (1 object, or its size).
//!
//! A total that rests on a handful of window samples, or on none (windows
//! that caught nothing of what lives), has neighbouring differences that
//! see almost nothing of what the windows could have missed: a 0.1 s
//! script whose two windows after the warm-up caught none of its kept
//! objects read 0.6x with ±6%. So one window sample's worth is added to
//! the variance, as a Poisson count seen n times has variance n + 1 under
//! a flat prior, not n: it dominates only while windows gave few samples.
//!
//! The relative standard error is the square root of the variance over
//! the total, and the effective sample count is total^2 over variance (for
//! plain Bernoulli sampling, the number of samples): fewer effective
//! samples than samples means windows cluster them.

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

/// What a window sample the flush does not hold would have weighed (the
/// heaviest window sample it holds counts too, as the caps left it): for
/// the allocations, the heaviest of this interval's windowed blocks; for
/// in-use, that or the latest windowed block's since start (live objects
/// come from any time). 0.0 where no window was involved.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct UnseenWeights {
    pub allocations: f64,
    pub inuse: f64,
}

/// The spread of each value type (alloc_objects, alloc_space,
/// inuse_objects, inuse_space) over `samples`.
pub fn spreads(samples: &[FlushedSample], unseen: UnseenWeights) -> [Spread; 4] {
    keyed_spreads(samples, unseen, 1, |_, keys| keys.push(0))[0]
}

/// The same for parts of the samples: `keys_of(sample, keys)` pushes the
/// keys (below `key_count`) a sample counts for, such as the function it
/// was allocated in, or each function on its stack once. A key's spread is
/// estimated as the total's is, over that key's values alone: a part that
/// windows see in runs (a function that allocates a long run, met by few
/// windows) spreads by how many windows met it, not by how many samples
/// it has, and only this says so.
pub fn keyed_spreads(
    samples: &[FlushedSample],
    unseen: UnseenWeights,
    key_count: usize,
    mut keys_of: impl FnMut(&FlushedSample, &mut Vec<u32>),
) -> Vec<[Spread; 4]> {
    let mut spreads = vec![[Spread::default(); 4]; key_count];
    // The heaviest window sample held, per pair (allocations, in-use).
    let mut heaviest = [unseen.allocations, unseen.inuse];
    // Windowed samples by block id. Ids wrap at 2^16 (ObjectInfo): blocks
    // that far apart share an id, which only makes the variance lean higher.
    let mut windowed: Vec<(u32, u32)> = Vec::new();
    let mut keys = Vec::new();
    for (i, sample) in samples.iter().enumerate() {
        let q = f64::from(sample.window_probability).clamp(f64::MIN_POSITIVE, 1.0);
        // (Every window sample counts for the heaviest, keyed or not: the
        // total's unseen sample weighs the same.)
        for objects in [0, 2] {
            let weight = sample.values[objects];
            if q < 1.0 && weight > 0.0 {
                heaviest[objects / 2] = heaviest[objects / 2].max(weight);
            }
        }
        keys.clear();
        keys_of(sample, &mut keys);
        keys.retain(|&key| (key as usize) < key_count);
        if keys.is_empty() {
            continue;
        }
        let mut counted = false;
        for (objects, space) in [(0, 1), (2, 3)] {
            let weight = sample.values[objects];
            if weight <= 0.0 {
                continue;
            }
            counted = true;
            for &key in &keys {
                for index in [objects, space] {
                    let value = sample.values[index];
                    let spread = &mut spreads[key as usize][index];
                    spread.total += value;
                    if q >= 1.0 {
                        // value = weight x x, where x is 1 (objects) or the size.
                        let x = value / weight;
                        spread.variance += x * x * (weight * weight - weight).max(0.0);
                    }
                }
            }
        }
        if counted && q < 1.0 {
            windowed.push((sample.window % WINDOW_IDS, i as u32));
        }
    }
    // 1/2 sum over neighbours (Y_i - Y_{i+1})^2, blocks without samples
    // counting 0: sum Y_i^2 - sum Y_{i-1} Y_i over the blocks present,
    // block by block in order.
    windowed.sort_unstable();
    let mut current = BlockSums::new(key_count);
    let mut previous = BlockSums::new(key_count);
    let mut first: Option<BlockSums> = None;
    let mut previous_block: Option<u32> = None;
    let mut at = 0;
    while at < windowed.len() {
        let block = windowed[at].0;
        while at < windowed.len() && windowed[at].0 == block {
            let sample = &samples[windowed[at].1 as usize];
            keys.clear();
            keys_of(sample, &mut keys);
            keys.retain(|&key| (key as usize) < key_count);
            for (objects, space) in [(0, 1), (2, 3)] {
                if sample.values[objects] > 0.0 {
                    for &key in &keys {
                        current.add(key, objects, sample.values[objects]);
                        current.add(key, space, sample.values[space]);
                    }
                }
            }
            at += 1;
        }
        let adjacent = previous_block.is_some_and(|p| p + 1 == block);
        for &key in &current.touched {
            let k = key as usize;
            for (index, spread) in spreads[k].iter_mut().enumerate() {
                let y = current.sums[k][index];
                let before = if adjacent {
                    previous.sums[k][index]
                } else {
                    0.0
                };
                spread.variance += y * y - before * y;
            }
        }
        if first.is_none() {
            first = Some(if block == 0 {
                current.clone()
            } else {
                BlockSums::new(0)
            });
        }
        previous.clear();
        std::mem::swap(&mut previous, &mut current);
        previous_block = Some(block);
    }
    // The last id's neighbour is the first (ids wrap).
    if let (Some(first), Some(WRAP_LAST)) = (&first, previous_block) {
        for &key in &first.touched {
            let k = key as usize;
            for (index, spread) in spreads[k].iter_mut().enumerate() {
                spread.variance -= first.sums[k][index] * previous.sums[k][index];
            }
        }
    }
    // One unseen window sample: w^2 objects^2, and w^2 times the mean size
    // squared for the space.
    for key_spreads in &mut spreads {
        for (pair, (objects, space)) in [(0, 1), (2, 3)].into_iter().enumerate() {
            let weight = heaviest[pair];
            let count = key_spreads[objects].total;
            if weight > 0.0 && weight.is_finite() && count > 0.0 {
                let mean_size = key_spreads[space].total / count;
                key_spreads[objects].variance += weight * weight;
                key_spreads[space].variance += (weight * mean_size).powi(2);
            }
        }
    }
    spreads
}

/// One block's estimate of each key's four values, and which keys it has.
#[derive(Debug, Clone)]
struct BlockSums {
    sums: Vec<[f64; 4]>,
    touched: Vec<u32>,
    in_block: Vec<bool>,
}

impl BlockSums {
    fn new(key_count: usize) -> Self {
        BlockSums {
            sums: vec![[0.0; 4]; key_count],
            touched: Vec::new(),
            in_block: vec![false; key_count],
        }
    }

    fn add(&mut self, key: u32, index: usize, value: f64) {
        let k = key as usize;
        if !self.in_block[k] {
            self.in_block[k] = true;
            self.touched.push(key);
        }
        self.sums[k][index] += value;
    }

    fn clear(&mut self) {
        for &key in &self.touched {
            self.sums[key as usize] = [0.0; 4];
            self.in_block[key as usize] = false;
        }
        self.touched.clear();
    }
}

const WRAP_LAST: u32 = WINDOW_IDS - 1;

/// Widens the spreads of `totals` (the allocation pair or the in-use
/// pair) for a `share` of allocations no window looked at: windows missed
/// them (`WindowFlush::inuse_missed_share`: their objects were never
/// tracked) or the block under way has not reached its window yet
/// (`unwindowed_share`). The totals may read up to that share low, and
/// what those allocations hold is unknown, so it is counted as an error of
/// that size: the relative standard error grows to at least `share`, and
/// a diff's error bars with it.
pub fn widen_for_unobserved(totals: &mut [Spread], share: f64) {
    if share > 0.0 && share.is_finite() {
        for spread in totals {
            spread.variance += (share * spread.total).powi(2);
        }
    }
}

/// How many block ids a sample can carry (ObjectInfo keeps 16 bits).
const WINDOW_IDS: u32 = 1 << 16;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stack_table::StackId;
    use crate::types::ClassRef;
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
            class: ClassRef(0),
            gc_age: None,
            values,
            window,
            window_probability: q as f32,
            labels: crate::label_sets::NO_LABELS,
        }
    }

    #[test]
    fn missed_windows_widen_only_the_inuse_errors() {
        let samples: Vec<_> = (0..1_000)
            .map(|i| sample(i % 50, 1.0, 1.0, 40.0, i % 2 == 0))
            .collect();
        let mut widened = spreads(&samples, UnseenWeights::default());
        let exact = widened;
        widen_for_unobserved(&mut widened[2..], 0.2);
        assert_eq!(widened[..2], exact[..2]);
        for index in 2..4 {
            assert_eq!(exact[index].relative_standard_error(), Some(0.0));
            let rse = widened[index].relative_standard_error().unwrap();
            assert!((rse - 0.2).abs() < 1e-12, "{rse}");
            assert_eq!(widened[index].total, exact[index].total);
        }
        for share in [0.0, f64::NAN, -1.0] {
            let mut same = exact;
            widen_for_unobserved(&mut same[2..], share);
            assert_eq!(same, exact);
        }
    }

    #[test]
    fn without_windows_the_spread_is_bernoulli_sampling() {
        // 10,000 samples at rate 0.01: 1,000,000 objects, 1% error.
        let samples: Vec<_> = (0..10_000)
            .map(|i| sample(i % 50, 1.0, 100.0, 40.0, false))
            .collect();
        let [objects, space, inuse, _] = spreads(&samples, UnseenWeights::default());
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
        let [_, _, inuse, _] = spreads(&exact, UnseenWeights::default());
        assert_eq!(inuse.relative_standard_error(), Some(0.0));
        assert_eq!(inuse.effective_samples(), Some(f64::INFINITY));
    }

    /// Simulates stratified windows many times (one window of 100
    /// allocations at a random offset per block of 1,000, sampled at 5%
    /// inside): on average the estimated variance is at least the real one,
    /// and not far above it for a steady program.
    #[test]
    #[cfg_attr(miri, ignore = "statistical and slow under Miri; no unsafe code")]
    fn the_estimated_variance_covers_the_real_spread() {
        let (block, window, rate) = (1_000u32, 100u32, 0.05);
        let q = f64::from(window) / f64::from(block);
        let mut rng = SmallRng::seed_from_u64(3);
        for (name, share) in [
            ("steady", (|_: u32| 0.3) as fn(u32) -> f64),
            (
                "phased",
                |i: u32| if (i / 20_000) % 2 == 0 { 0.9 } else { 0.05 },
            ),
        ] {
            let (mut totals, mut variances) = (Vec::new(), Vec::new());
            let mut truth = 0.0;
            for run in 0..300 {
                let mut samples = Vec::new();
                for b in 0..200u32 {
                    let offset = rng.random_range(0..block);
                    for j in 0..window {
                        let position = b * block + (offset + j) % block;
                        let site = rng.random::<f64>() < share(position);
                        if site && rng.random::<f64>() < rate {
                            samples.push(sample(b, q, 1.0 / (q * rate), 1.0, false));
                        }
                    }
                }
                if run == 0 {
                    truth = (0..200 * block).map(share).sum::<f64>();
                }
                let [objects, ..] = spreads(&samples, UnseenWeights::default());
                totals.push(objects.total);
                variances.push(objects.variance);
            }
            let n = totals.len() as f64;
            let mean = totals.iter().sum::<f64>() / n;
            let real = totals.iter().map(|t| (t - mean).powi(2)).sum::<f64>() / (n - 1.0);
            let estimated = variances.iter().sum::<f64>() / n;
            assert!(
                (mean / truth - 1.0).abs() < 0.02,
                "{name}: {mean} vs {truth}"
            );
            assert!(
                estimated > real * 0.85 && estimated < real * 2.0,
                "{name}: estimated {estimated}, real {real}"
            );
        }
    }

    /// A part allocated in runs longer than a window but shorter than a
    /// block (5% of allocations, in runs of 485 every 9,700; windows of
    /// 100 in blocks of 10,000): a window meets a run or not, so the part
    /// spreads several times more than its samples alone would say, and
    /// its own spread says so (leaning high where runs begin and end
    /// between neighbouring blocks), while the rest's stays near the truth.
    #[test]
    #[cfg_attr(miri, ignore = "statistical and slow under Miri; no unsafe code")]
    fn a_part_seen_in_runs_spreads_by_the_windows_that_met_it() {
        let (block, window, rate) = (10_000u32, 100u32, 0.5);
        let q = f64::from(window) / f64::from(block);
        let in_run = |position: u32| position % 9_700 < 485;
        let mut rng = SmallRng::seed_from_u64(11);
        let (mut totals, mut variances, mut counts) = (vec![], vec![], vec![]);
        for _ in 0..300 {
            let mut samples = Vec::new();
            for b in 0..300u32 {
                let offset = rng.random_range(0..block);
                for j in 0..window {
                    let position = b * block + (offset + j) % block;
                    if rng.random::<f64>() < rate {
                        let mut s = sample(b, q, 1.0 / (q * rate), 1.0, false);
                        s.class = ClassRef(u64::from(in_run(position)));
                        samples.push(s);
                    }
                }
            }
            let keyed = keyed_spreads(&samples, UnseenWeights::default(), 2, |s, keys| {
                keys.push(s.class.0 as u32)
            });
            totals.push([keyed[0][0].total, keyed[1][0].total]);
            variances.push([keyed[0][0].variance, keyed[1][0].variance]);
            counts.push(samples.iter().filter(|s| s.class.0 == 1).count() as f64);
        }
        let n = totals.len() as f64;
        for key in 0..2 {
            let mean = totals.iter().map(|t| t[key]).sum::<f64>() / n;
            let real = totals.iter().map(|t| (t[key] - mean).powi(2)).sum::<f64>() / (n - 1.0);
            let estimated = variances.iter().map(|v| v[key]).sum::<f64>() / n;
            assert!(
                estimated > real * 0.8 && estimated < real * 2.5,
                "key {key}: estimated {estimated}, real {real}"
            );
            if key == 1 {
                let truth = (0..300 * block).filter(|&p| in_run(p)).count() as f64;
                assert!((mean / truth - 1.0).abs() < 0.03, "{mean}");
                // What its samples alone would say: w^2 per sample.
                let w = 1.0 / (q * rate);
                let naive = counts.iter().sum::<f64>() / n * w * w;
                assert!(real > 4.0 * naive, "real {real}, naive {naive}");
            }
        }
    }

    /// A 0.1 s script: a warm-up of 250,000 allocations sampled at 10%,
    /// then two blocks of 80,000 with a window of 1,000 each (q 1/80),
    /// sampled at 10% inside (weight 800); every 100th allocation is kept.
    /// About one run in eight, the windows catch no kept object and in-use
    /// reads 0.61x: only the unseen sample's term says so.
    #[test]
    #[cfg_attr(miri, ignore = "statistical and slow under Miri; no unsafe code")]
    fn a_short_profile_the_windows_barely_saw_is_not_confidently_wrong() {
        let (warm_up, block, window, rate) = (250_000u32, 80_000u32, 1_000u32, 0.1);
        let q = f64::from(window) / f64::from(block);
        let truth = f64::from((warm_up + 2 * block) / 100);
        let mut rng = SmallRng::seed_from_u64(7);
        let runs = 2_000;
        let far_out = |unseen: UnseenWeights, rng: &mut SmallRng| {
            let (mut beyond_2, mut beyond_2_5) = (0, 0);
            for _ in 0..runs {
                let mut samples = Vec::new();
                for _ in 0..warm_up / 100 {
                    if rng.random::<f64>() < rate {
                        samples.push(sample(0, 1.0, 1.0 / rate, 24.0, true));
                    }
                }
                for b in 1..=2u32 {
                    let offset = rng.random_range(0..block);
                    for j in 0..window {
                        let kept = ((offset + j) % block).is_multiple_of(100);
                        if kept && rng.random::<f64>() < rate {
                            samples.push(sample(b, q, 1.0 / (q * rate), 24.0, true));
                        }
                    }
                }
                let [_, _, inuse, _] = spreads(&samples, unseen);
                let z = (inuse.total - truth) / inuse.variance.sqrt();
                beyond_2 += usize::from(z.abs() > 2.0);
                beyond_2_5 += usize::from(z.abs() > 2.5);
            }
            (
                beyond_2 as f64 / f64::from(runs),
                beyond_2_5 as f64 / f64::from(runs),
            )
        };
        // Without the term: the runs with no window sample are far out.
        let (_, before) = far_out(UnseenWeights::default(), &mut rng);
        assert!(before > 0.08, "{before}");
        let unseen = UnseenWeights {
            allocations: 0.0,
            inuse: 1.0 / (q * rate),
        };
        let (beyond_2, beyond_2_5) = far_out(unseen, &mut rng);
        assert!(
            beyond_2 < 0.15 && beyond_2_5 < 0.01,
            "{beyond_2} {beyond_2_5}"
        );
    }
}
