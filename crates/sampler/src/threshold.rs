//! Threshold sampling (Duffield, Lund, Thorup): how the live map keeps a
//! fixed memory bound over samples of unequal weight.
//!
//! Under a threshold τ, a sample standing for `w` objects is kept with
//! probability min(1, w / τ) and then stands for max(w, τ): unbiased for
//! every subset of samples, and the lowest variance for a given expected
//! count. Heavy samples (a window's, weighing thousands) are kept whole
//! while light ones (the warm-up's, weighing 1 / sample_rate) are thinned,
//! where halving every sample alike doubled the heavy ones' error too.
//! Thresholds compose: τ1 then τ2 >= τ1 is τ2 at once.

/// The threshold at which samples of `weights` keep `target` of them in
/// expectation: Σ min(1, w / τ) = target. Infinite when `target` is 0;
/// 0 (keep everything) when `target` is at least their number. Linear
/// passes, usually two or three (it runs in the allocation hook, over up
/// to `max_heap_samples` weights); `weights` may be reordered.
pub fn threshold_for(weights: &mut [f32], target: f64) -> f64 {
    if target <= 0.0 {
        return f64::INFINITY;
    }
    if weights.len() as f64 <= target {
        return 0.0;
    }
    let total: f64 = weights.iter().map(|&w| f64::from(w).max(0.0)).sum();
    // Samples at or above the threshold are kept whole and the rest share
    // what is left of the target. Lowering the threshold to that share
    // only adds samples kept whole, so it settles once none is added.
    let mut threshold = total / target;
    let mut whole_before = 0;
    for _ in 0..FIXED_POINT_PASSES {
        let (mut whole, mut rest) = (0usize, 0.0);
        for &w in weights.iter() {
            let w = f64::from(w).max(0.0);
            if w >= threshold {
                whole += 1;
            } else {
                rest += w;
            }
        }
        if whole == whole_before {
            return threshold;
        }
        let share = target - whole as f64;
        if share <= 0.0 {
            break;
        }
        whole_before = whole;
        threshold = rest / share;
    }
    threshold_by_sorting(weights, target)
}

/// Passes before `threshold_for` sorts instead (weights spread over many
/// orders of magnitude can add a few samples kept whole at each pass).
const FIXED_POINT_PASSES: usize = 16;

/// `threshold_for` by sorting, heaviest first.
fn threshold_by_sorting(weights: &mut [f32], target: f64) -> f64 {
    weights.sort_unstable_by(|a, b| b.total_cmp(a));
    let mut rest: f64 = weights.iter().map(|&w| f64::from(w).max(0.0)).sum();
    // The heaviest `kept` samples are kept whole; the rest share what is
    // left of the target in proportion to their weights.
    for (kept, &heaviest_of_rest) in weights.iter().enumerate() {
        let share = target - kept as f64;
        if share <= 0.0 {
            break;
        }
        let threshold = rest / share;
        if f64::from(heaviest_of_rest) <= threshold {
            return threshold;
        }
        rest -= f64::from(heaviest_of_rest).max(0.0);
    }
    // Not reached with positive weights (the heaviest `target` cannot each
    // outweigh the rest); thin alike rather than keep everything.
    let heaviest = weights.first().map_or(0.0, |&w| f64::from(w));
    let equal = weights
        .iter()
        .filter(|&&w| f64::from(w) >= heaviest)
        .count();
    heaviest * equal as f64 / target
}

/// Probability that a sample of `weight` is kept under `threshold`.
pub fn keep_probability(weight: f64, threshold: f64) -> f64 {
    if weight >= threshold {
        1.0
    } else {
        weight / threshold
    }
}

/// What a kept sample of `weight` stands for under `threshold`.
pub fn kept_weight(weight: f64, threshold: f64) -> f64 {
    weight.max(threshold)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{RngExt, SeedableRng};

    fn expected_kept(weights: &[f32], threshold: f64) -> f64 {
        weights
            .iter()
            .map(|&w| keep_probability(f64::from(w), threshold))
            .sum()
    }

    #[test]
    fn equal_weights_are_halved_alike() {
        let mut weights = vec![10.0f32; 100];
        let threshold = threshold_for(&mut weights, 50.0);
        assert!((threshold - 20.0).abs() < 1e-9);
        assert!((keep_probability(10.0, threshold) - 0.5).abs() < 1e-12);
        assert_eq!(kept_weight(10.0, threshold), 20.0);
    }

    #[test]
    fn heavy_samples_are_kept_whole_and_light_ones_share_the_rest() {
        // 10 window samples of 5,000 and 990 warm-up samples of 100.
        let mut weights: Vec<f32> = std::iter::repeat_n(5_000.0, 10)
            .chain(std::iter::repeat_n(100.0, 990))
            .collect();
        let threshold = threshold_for(&mut weights, 500.0);
        assert_eq!(keep_probability(5_000.0, threshold), 1.0);
        assert!((expected_kept(&weights, threshold) - 500.0).abs() < 1e-6);
        // The 990 light ones keep 490 between them.
        assert!((990.0 * 100.0 / threshold - 490.0).abs() < 1e-6);
    }

    #[test]
    fn the_expected_count_is_the_target_for_any_weights() {
        let mut rng = SmallRng::seed_from_u64(3);
        for _ in 0..200 {
            let n = rng.random_range(2..400usize);
            let mut weights: Vec<f32> = (0..n)
                .map(|_| {
                    if rng.random::<f64>() < 0.1 {
                        rng.random_range(1_000.0..100_000.0)
                    } else {
                        rng.random_range(1.0..200.0)
                    }
                })
                .collect();
            let target = rng.random_range(1..n) as f64;
            let threshold = threshold_for(&mut weights, target);
            let kept = expected_kept(&weights, threshold);
            assert!((kept - target).abs() < 1e-3 * target, "{kept} for {target}");
        }
    }

    #[test]
    fn the_passes_and_the_sort_agree() {
        let mut rng = SmallRng::seed_from_u64(5);
        for _ in 0..500 {
            let n = rng.random_range(2..300usize);
            // Weights over up to ten orders of magnitude.
            let mut weights: Vec<f32> = (0..n)
                .map(|_| 10f32.powf(rng.random_range(0.0..10.0)))
                .collect();
            let target = rng.random_range(1..n) as f64;
            let mut sorted = weights.clone();
            let by_passes = threshold_for(&mut weights, target);
            let by_sorting = threshold_by_sorting(&mut sorted, target);
            assert!(
                (by_passes / by_sorting - 1.0).abs() < 1e-5,
                "{by_passes} vs {by_sorting}"
            );
        }
    }

    #[test]
    fn more_equal_heavy_samples_than_the_target_are_thinned_alike() {
        let mut weights = vec![7.0f32; 10];
        let threshold = threshold_for(&mut weights, 3.0);
        assert!((expected_kept(&weights, threshold) - 3.0).abs() < 1e-9);
    }

    #[test]
    fn edge_targets() {
        assert_eq!(threshold_for(&mut [1.0, 2.0], 0.0), f64::INFINITY);
        assert_eq!(threshold_for(&mut [1.0, 2.0], 2.0), 0.0);
        assert_eq!(threshold_for(&mut [], 1.0), 0.0);
        assert_eq!(keep_probability(3.0, 0.0), 1.0);
        assert_eq!(kept_weight(3.0, 0.0), 3.0);
        assert_eq!(keep_probability(3.0, f64::INFINITY), 0.0);
    }

    #[test]
    #[cfg_attr(miri, ignore = "statistical; too slow under Miri")]
    fn thinning_is_unbiased_for_a_subset() {
        // 20 heavy samples among 2,000 light ones, thinned to 300: the
        // heavy ones' estimate is exact, the light ones' unbiased.
        let mut rng = SmallRng::seed_from_u64(9);
        let base: Vec<f32> = std::iter::repeat_n(5_000.0f32, 20)
            .chain(std::iter::repeat_n(100.0, 2_000))
            .collect();
        let truth_light = 2_000.0 * 100.0;
        let runs = 400;
        let mut light_sum = 0.0;
        for _ in 0..runs {
            let mut weights = base.clone();
            let threshold = threshold_for(&mut weights, 300.0);
            let (mut heavy, mut light) = (0.0, 0.0);
            for &w in &base {
                let w = f64::from(w);
                if rng.random::<f64>() < keep_probability(w, threshold) {
                    let kept = kept_weight(w, threshold);
                    if w > 1_000.0 {
                        heavy += kept;
                    } else {
                        light += kept;
                    }
                }
            }
            assert_eq!(heavy, 20.0 * 5_000.0);
            light_sum += light;
        }
        let mean = light_sum / f64::from(runs);
        assert!((mean / truth_light - 1.0).abs() < 0.02, "{mean}");
    }
}
