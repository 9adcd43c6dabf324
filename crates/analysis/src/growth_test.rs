//! When `diff` may call a row's growth real: a steady trend, larger than
//! the profiles' sampling error.
//!
//! Sampled profiles are estimates. A profile of this gem says how far its
//! total may be off (pprof/spread_comment.rs); a row holding a share p of
//! that total is off by about the total's relative error / sqrt(p) (the
//! same effective samples, spread over fewer), so its standard error is
//! rse x sqrt(value x total). A profile without the comment (exact, or
//! from another tool) counts as exact: error 0.

use pprof::spread_comment::{parse_spread_comment, TotalSpread};

use super::decoded_profile::DecodedProfile;

/// Standard errors need this many of them between two values to call the
/// difference real (about 1 in 40 by chance, one-sided, for normal errors).
const ERROR_BARS: f64 = 2.0;

/// At most this many values go into the trend test.
const TREND_POINTS: usize = 64;

/// Mann-Kendall's z must be above this for a rising trend through noise
/// (about 1 in 1,000 by chance).
const TREND_Z: f64 = 3.0;

/// Each profile's relative standard error of `sample_type`'s total (0:
/// exact, or not said).
pub fn total_errors(profiles: &[&DecodedProfile], sample_type: &str) -> Vec<f64> {
    profiles
        .iter()
        .map(
            |profile| match parse_spread_comment(profile.comments(), sample_type) {
                Some(TotalSpread::Estimated { rse, .. }) => rse,
                _ => 0.0,
            },
        )
        .collect()
}

/// A value's standard error, from its profile's total and that total's
/// relative error.
pub fn standard_error(value: i64, total: i64, total_rse: f64) -> f64 {
    if value <= 0 || total <= 0 {
        return 0.0;
    }
    total_rse * ((value as f64) * (total as f64)).sqrt()
}

/// Whether `to - from` is more than the error bars of both.
pub fn beyond_error(from: i64, to: i64, from_error: f64, to_error: f64) -> bool {
    let difference = (to as f64 - from as f64).abs();
    difference > ERROR_BARS * from_error.hypot(to_error)
}

/// Whether the last values of a series are above its first by more than
/// their error bars: the means of its first and last quarters (one value
/// each below 8), so that one noisy profile at either end decides nothing.
/// `errors[i]`: the standard error of `values[i]`.
pub fn ends_apart(values: &[i64], errors: &[f64]) -> bool {
    let n = values.len();
    if n < 2 {
        return false;
    }
    let k = (n / 4).max(1);
    let mean = |range: std::ops::Range<usize>| {
        let value = range.clone().map(|i| values[i] as f64).sum::<f64>() / k as f64;
        let error = range.map(|i| errors[i] * errors[i]).sum::<f64>().sqrt() / k as f64;
        (value, error)
    };
    let (first, first_error) = mean(0..k);
    let (last, last_error) = mean(n - k..n);
    last - first > ERROR_BARS * first_error.hypot(last_error)
}

/// Whether `values` (oldest first) rise: in every interval; or never
/// falling and up in at least three intervals and in more than half (a
/// leak in a server stays level in an interval that served none of what
/// leaks, where sampling noise would move a row both ways, and a cache
/// that filled stays level from then on); or, with enough of them, as a
/// trend through noise (Mann-Kendall's test, which looks only at which of
/// each pair is larger).
pub fn rises_steadily(values: &[i64]) -> bool {
    let n = values.len();
    if n < 2 {
        return false;
    }
    let ups = values.windows(2).filter(|w| w[1] > w[0]).count();
    if ups == n - 1 {
        return true;
    }
    if never_falls(values) && ups >= 3 && 2 * ups > n - 1 {
        return true;
    }
    // Below 8 values the test cannot reach its threshold reliably.
    if n < 8 {
        return false;
    }
    // The test compares every pair: on at most TREND_POINTS values, evenly
    // spaced (a trend survives thinning; diff's time must not grow with
    // the square of the profiles it is given).
    let points: Vec<i64> = if n > TREND_POINTS {
        (0..TREND_POINTS)
            .map(|k| values[k * (n - 1) / (TREND_POINTS - 1)])
            .collect()
    } else {
        values.to_vec()
    };
    let n = points.len();
    let mut s = 0i64;
    for i in 0..n {
        for j in i + 1..n {
            s += (points[j] - points[i]).signum();
        }
    }
    let n = n as f64;
    let variance = n * (n - 1.0) * (2.0 * n + 5.0) / 18.0;
    let z = (s as f64 - 1.0) / variance.sqrt();
    z > TREND_Z
}

/// Whether no value of `values` is below the one before.
pub fn never_falls(values: &[i64]) -> bool {
    values.windows(2).all(|w| w[1] >= w[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_noisy_rise_is_a_trend_and_noise_alone_is_not() {
        // 30 values rising by 10 a step with noise of +-40.
        let noise = [
            17, -33, 8, 40, -21, -40, 3, 29, -12, 35, -27, 11, -5, 38, -38, 20, -17, 2, 33, -29,
            14, -9, 25, -36, 6, 39, -24, -1, 31, -15,
        ];
        let rising: Vec<i64> = (0..30).map(|i| 100 + 10 * i + noise[i as usize]).collect();
        assert!(rises_steadily(&rising));
        let flat: Vec<i64> = (0..30).map(|i| 100 + noise[i as usize]).collect();
        assert!(!rises_steadily(&flat));
        // Too few values for a trend: every step up, or nothing.
        assert!(rises_steadily(&[1, 2, 3]));
        assert!(!rises_steadily(&[1, 3, 2, 4]));
        assert!(!rises_steadily(&[5]));
        // Level in the intervals that served none of it, never down.
        assert!(rises_steadily(&[1, 2, 2, 3, 4, 5, 6]));
        assert!(rises_steadily(&[1, 2, 3, 3, 4]));
        // Up in fewer than three, or in half or less (a cache that filled),
        // or down once: not steady.
        assert!(!rises_steadily(&[1, 1, 50]));
        assert!(!rises_steadily(&[1, 2, 3, 3]));
        assert!(!rises_steadily(&[1, 2, 3, 3, 3]));
        assert!(!rises_steadily(&[1, 2, 3, 4, 4, 4, 4]));
        assert!(!rises_steadily(&[1, 2, 3, 4, 3, 5]));
        // 100,000 profiles: thinned to 64 points, still a trend, and quick.
        let long: Vec<i64> = (0..100_000)
            .map(|i| i + noise[(i % 30) as usize] * 50)
            .collect();
        assert!(rises_steadily(&long));
        let flat_long: Vec<i64> = (0..100_000).map(|i| noise[(i % 30) as usize]).collect();
        assert!(!rises_steadily(&flat_long));
    }

    #[test]
    fn growth_within_the_error_bars_is_not_called() {
        // Totals of 10,000 at 10% error: a row of 2,500 is off by ~500.
        let error = standard_error(2_500, 10_000, 0.1);
        assert!((error - 500.0).abs() < 1e-9);
        assert!(!beyond_error(2_500, 3_500, error, error));
        assert!(beyond_error(2_500, 4_000, error, error));
        // Exact profiles: any difference is real.
        assert!(beyond_error(2_500, 2_501, 0.0, 0.0));
        assert_eq!(standard_error(0, 10_000, 0.1), 0.0);
        // A series rising from 1,000 to 4,000 whose last value alone is
        // off by 2,000: its last quarter, not that value, is compared.
        let values: Vec<i64> = (0..16).map(|i| 1_000 + 200 * i).collect();
        let mut errors = vec![100.0; 16];
        errors[15] = 2_000.0;
        assert!(!beyond_error(values[0], values[15], errors[0], errors[15]));
        assert!(ends_apart(&values, &errors));
        assert!(!ends_apart(&[1_000, 1_100], &[100.0, 100.0]));
        assert!(ends_apart(&[1_000, 1_500], &[100.0, 100.0]));
    }
}
