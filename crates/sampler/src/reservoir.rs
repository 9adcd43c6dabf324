//! Which samples the allocation list keeps once it is full: VarOpt
//! sampling (Cohen, Duffield, Kaplan, Lund and Thorup, "Stream sampling for
//! variance-optimal estimation of subset sums", SODA 2009).
//!
//! Samples carry different weights (a warm-up sample stands for 1/rate
//! allocations, a window's sample for 1/(rate x window probability)). A
//! uniform reservoir thins both alike, so a few heavy samples decide a
//! phase's estimate. VarOpt keeps samples heavier than a threshold
//! whole and lets the others go with probability 1 - weight / threshold,
//! counting each kept one as max(weight, threshold). That is unbiased for
//! every subset (a site, a phase), has the least variance a list of its
//! length can have, and its kept weights always sum to exactly what was
//! offered; with equal weights it is the uniform reservoir.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A slot of weight above the threshold, lightest first in the heap.
#[derive(Debug, Clone, Copy)]
struct Heavy {
    weight: f64,
    slot: u32,
}

impl PartialEq for Heavy {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Heavy {}

impl PartialOrd for Heavy {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Heavy {
    /// Reversed, so that `BinaryHeap` (a max-heap) pops the lightest.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .weight
            .total_cmp(&self.weight)
            .then(other.slot.cmp(&self.slot))
    }
}

/// A sample's weight as the lists count it: 1 / a probability, so at
/// least 1 (a weight that is not a number counts 1), and at most
/// `MAX_WEIGHT`, so that records keep it (as f32) and thresholds over a
/// full live map stay finite.
pub fn usable_weight(weight: f64) -> f64 {
    if weight.is_nan() {
        1.0
    } else {
        weight.clamp(1.0, MAX_WEIGHT)
    }
}

/// The heaviest a sample counts: 1 / a sample rate of 1e-30, and far from
/// f32's limit even summed over a full live map.
pub const MAX_WEIGHT: f64 = 1e30;

/// The new sample's slot until one is freed for it.
const NEW: u32 = u32::MAX;

/// The weights of the allocation list's slots, and which of them count
/// as the threshold.
#[derive(Debug, Default)]
pub struct Reservoir {
    /// Each slot's weight when it was offered.
    weights: Vec<f64>,
    /// Slots heavier than the threshold: they count their own weight.
    heavy: BinaryHeap<Heavy>,
    /// The other slots: each counts the threshold.
    light: Vec<u32>,
    /// Slots becoming light during one offer (kept to reuse its buffer).
    moving: Vec<Heavy>,
    /// What a light slot counts (0 until the list first overflows).
    threshold: f64,
}

/// What a flush needs of the reservoir: each kept slot's scale.
#[derive(Debug, Default)]
pub struct ReservoirScales {
    weights: Vec<f64>,
    threshold: f64,
}

impl ReservoirScales {
    /// What the sample in `slot` is multiplied by: max(weight, threshold) /
    /// weight, 1 while the list never overflowed.
    pub fn scale(&self, slot: usize) -> f64 {
        match self.weights.get(slot) {
            Some(&weight) if self.threshold > weight => self.threshold / weight,
            _ => 1.0,
        }
    }
}

impl Reservoir {
    /// Offers a sample of `weight`, with `uniform` drawn from [0, 1). Returns
    /// the slot it takes (a new one at the end while the list is shorter
    /// than `cap`, else the slot of the sample it displaces), or None if it
    /// is the one let go.
    pub fn offer(&mut self, weight: f64, uniform: f64, cap: usize) -> Option<usize> {
        let weight = usable_weight(weight);
        // Once a sample was let go, the list stays at its length until the
        // flush, even if the cap is raised: an appended sample would be
        // kept for certain, and count its own weight, not the threshold.
        if self.weights.len() < cap && self.threshold == 0.0 {
            let slot = self.weights.len();
            self.weights.push(weight);
            self.heavy.push(Heavy {
                weight,
                slot: slot as u32,
            });
            return Some(slot);
        }
        if self.weights.is_empty() {
            return None;
        }
        // The new sample and the list, one too many: find the threshold t
        // at which the light ones' chances min(1, w / t) sum to their
        // number less one.
        let mut new_heavy = weight > self.threshold;
        self.moving.clear();
        let mut light_weight = self.threshold * self.light.len() as f64;
        if !new_heavy {
            self.moving.push(Heavy { weight, slot: NEW });
            light_weight += weight;
        }
        loop {
            let lightest_heavy = match (self.heavy.peek(), new_heavy) {
                (Some(h), true) if h.weight <= weight => Some((h.weight, false)),
                (_, true) => Some((weight, true)),
                (Some(h), false) => Some((h.weight, false)),
                (None, false) => None,
            };
            let Some((lightest, is_new)) = lightest_heavy else {
                break;
            };
            let light_count = self.light.len() + self.moving.len();
            if light_count >= 2 && lightest * (light_count - 1) as f64 >= light_weight {
                break;
            }
            let slot = if is_new {
                new_heavy = false;
                NEW
            } else {
                self.heavy.pop().map_or(NEW, |h| h.slot)
            };
            self.moving.push(Heavy {
                weight: lightest,
                slot,
            });
            light_weight += lightest;
        }
        let light_count = self.light.len() + self.moving.len();
        let threshold = light_weight / (light_count.max(2) - 1) as f64;
        // Let one light sample go: each with probability 1 - w / threshold
        // (these sum to 1), first among the moving ones.
        let mut draw = uniform;
        let mut freed = None;
        for (i, m) in self.moving.iter().enumerate() {
            draw -= (1.0 - m.weight / threshold).max(0.0);
            if draw < 0.0 {
                freed = Some(self.moving.swap_remove(i).slot);
                break;
            }
        }
        let freed = match freed {
            Some(slot) => slot,
            None if !self.light.is_empty() => {
                let chance = (1.0 - self.threshold / threshold).max(f64::MIN_POSITIVE);
                let index = ((draw.max(0.0) / chance) as usize).min(self.light.len() - 1);
                self.light.swap_remove(index)
            }
            // Rounding left nothing to let go: the last moving one goes.
            None => self.moving.pop().map_or(NEW, |m| m.slot),
        };
        self.threshold = threshold;
        let taken = (freed != NEW).then_some(freed);
        for m in self.moving.drain(..) {
            let slot = if m.slot == NEW { freed } else { m.slot };
            self.light.push(slot);
        }
        if let Some(slot) = taken {
            self.weights[slot as usize] = weight;
            if new_heavy {
                self.heavy.push(Heavy { weight, slot });
            }
        }
        taken.map(|slot| slot as usize)
    }

    /// Ends the interval: the scales of its kept samples, and an empty
    /// reservoir for the next one.
    pub fn take(&mut self) -> ReservoirScales {
        let scales = ReservoirScales {
            weights: std::mem::take(&mut self.weights),
            threshold: self.threshold,
        };
        self.clear();
        scales
    }

    pub fn clear(&mut self) {
        self.weights.clear();
        self.heavy.clear();
        self.light.clear();
        self.moving.clear();
        self.threshold = 0.0;
    }

    pub fn memory_bytes(&self) -> usize {
        self.weights.capacity() * std::mem::size_of::<f64>()
            + self.heavy.capacity() * std::mem::size_of::<Heavy>()
            + self.light.capacity() * std::mem::size_of::<u32>()
            + self.moving.capacity() * std::mem::size_of::<Heavy>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{RngExt, SeedableRng};

    /// Offers `weights` to a reservoir of `cap` and returns the estimate of
    /// each group's total (`group` maps an index to its group).
    fn estimate(
        weights: &[f64],
        group: impl Fn(usize) -> usize,
        cap: usize,
        seed: u64,
    ) -> [f64; 2] {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut reservoir = Reservoir::default();
        let mut kept = vec![usize::MAX; cap];
        for (i, &w) in weights.iter().enumerate() {
            if let Some(slot) = reservoir.offer(w, rng.random::<f64>(), cap) {
                kept[slot] = i;
            }
        }
        let scales = reservoir.take();
        let mut totals = [0.0; 2];
        for (slot, &i) in kept.iter().enumerate().filter(|(_, &i)| i != usize::MAX) {
            totals[group(i)] += weights[i] * scales.scale(slot);
        }
        totals
    }

    #[test]
    fn keeps_everything_below_the_cap() {
        let weights = [1.0, 100.0, 5.0];
        let totals = estimate(&weights, |_| 0, 10, 1);
        assert_eq!(totals[0], 106.0);
    }

    #[test]
    #[cfg_attr(miri, ignore = "statistical and slow under Miri; no unsafe code")]
    fn estimates_each_group_of_mixed_weights() {
        // A warm-up phase of light samples, then a phase of few heavy ones:
        // each phase is 1,000,000 allocations.
        let mut weights = vec![100.0; 10_000];
        weights.extend(std::iter::repeat_n(5_000.0, 200));
        let group = |i: usize| usize::from(i >= 10_000);
        let runs = 200;
        let mut sums = [0.0; 2];
        let mut worst_heavy: f64 = 0.0;
        for seed in 0..runs {
            let totals = estimate(&weights, group, 1_000, seed);
            sums[0] += totals[0];
            sums[1] += totals[1];
            worst_heavy = worst_heavy.max((totals[1] / 1e6 - 1.0).abs());
        }
        for sum in sums {
            let mean = sum / runs as f64 / 1e6;
            assert!((mean - 1.0).abs() < 0.02, "mean {mean}");
        }
        // Heavy samples are kept first, so the heavy phase keeps nearly all
        // of its 200 samples (a uniform reservoir would keep ~20).
        assert!(worst_heavy < 0.02, "worst heavy-phase error {worst_heavy}");
    }

    #[test]
    #[cfg_attr(miri, ignore = "statistical and slow under Miri; no unsafe code")]
    fn kept_weights_sum_to_what_was_offered() {
        let mut rng = SmallRng::seed_from_u64(7);
        let weights: Vec<f64> = (0..20_000)
            .map(|i| match i % 7 {
                0 => 5_000.0,
                1 | 2 => 333.0,
                _ => 100.0 + (i % 13) as f64,
            })
            .collect();
        for cap in [1, 2, 10, 1_000] {
            let totals = estimate(&weights, |_| 0, cap, rng.random());
            let offered: f64 = weights.iter().sum();
            assert!(
                (totals[0] / offered - 1.0).abs() < 1e-9,
                "cap {cap}: {totals:?}"
            );
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "statistical and slow under Miri; no unsafe code")]
    fn is_unbiased_for_uniform_weights() {
        let weights = vec![1.0; 5_000];
        let group = |i: usize| usize::from(i % 10 == 0);
        let runs = 200;
        let mut sums = [0.0; 2];
        for seed in 0..runs {
            let totals = estimate(&weights, group, 500, seed);
            sums[0] += totals[0];
            sums[1] += totals[1];
        }
        let means = sums.map(|s| s / runs as f64);
        assert!((means[0] / 4_500.0 - 1.0).abs() < 0.02, "{means:?}");
        assert!((means[1] / 500.0 - 1.0).abs() < 0.05, "{means:?}");
    }

    #[test]
    fn a_smaller_cap_keeps_the_list_at_its_length() {
        let mut reservoir = Reservoir::default();
        for i in 0..10 {
            assert_eq!(reservoir.offer(1.0, 0.5, 10), Some(i));
        }
        // The cap lowered mid-interval: new samples replace, never append.
        for _ in 0..100 {
            assert!(reservoir.offer(1.0, 0.99, 5).is_none_or(|slot| slot < 10));
        }
        assert!(reservoir.take().threshold >= 1.0);
    }

    #[test]
    fn a_cap_raised_after_an_overflow_keeps_the_estimate_exact() {
        let mut rng = SmallRng::seed_from_u64(3);
        for _ in 0..1_000 {
            let weights = [10.0, 10.0, 10.0, 10.0, 1.0, 1.0];
            let mut reservoir = Reservoir::default();
            let mut kept = [usize::MAX; 6];
            for (i, &w) in weights.iter().enumerate() {
                let cap = if i < 4 { 2 } else { 4 };
                if let Some(slot) = reservoir.offer(w, rng.random::<f64>(), cap) {
                    kept[slot] = i;
                }
            }
            let scales = reservoir.take();
            let total: f64 = kept
                .iter()
                .enumerate()
                .filter(|(_, &i)| i != usize::MAX)
                .map(|(slot, &i)| weights[i] * scales.scale(slot))
                .sum();
            assert!((total - 42.0).abs() < 1e-9, "{total}");
        }
    }

    #[test]
    fn odd_weights_count_as_one() {
        let mut reservoir = Reservoir::default();
        assert_eq!(reservoir.offer(f64::NAN, 0.0, 1), Some(0));
        assert_eq!(reservoir.offer(0.0, 0.2, 1), Some(0));
        // Two samples of weight 1 offered, one kept: it counts 2.
        assert_eq!(reservoir.take().scale(0), 2.0);
    }
}
