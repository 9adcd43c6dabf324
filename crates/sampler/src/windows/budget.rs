//! With a budget (`WindowPolicy::Budget`): each block's probability, from
//! the allocation rate the polls observe and the budget saved while the
//! process allocated less. A block's q depends only on what came before
//! it (see the top of windows/mod.rs), so nothing is biased.

use super::{PollTime, WindowPolicy, Windows, MIN_BUDGET_PROBABILITY, POLL_MAX_NS, POLL_MIN_NS};

/// The average allocation rate is an exponential average over about this
/// many nanoseconds.
const RATE_TIME_CONSTANT_NS: f64 = 1e9;

/// The busy rate forgets a faster rate by at most this share a poll, and
/// over at least about this much of the process's running time.
const BUSY_RATE_FORGET_PER_POLL: f64 = 0.05;
const BUSY_RATE_MEMORY_NS: f64 = 2e6;

/// A budget not spent (while the process allocated less than it, or was
/// idle) is saved, up to this many seconds of it, and spent over about
/// `CREDIT_DRAIN_SECONDS` when allocations come: a burst, a short phase or
/// a short script gets many windows, not the few a per-second rate allows.
/// Over any second or more the hook still sees at most the budget, plus
/// what was saved.
const CREDIT_SECONDS: f64 = 1.0;
const CREDIT_DRAIN_SECONDS: f64 = 0.25;

impl Windows {
    /// The probability for a block beginning at `begin` (not in the warm-up).
    pub(super) fn next_probability(&self) -> f64 {
        match (self.policy, self.rate) {
            (WindowPolicy::Fixed(q), _) => q,
            (WindowPolicy::Budget(_), None) => 1.0,
            (WindowPolicy::Budget(budget), Some(rate)) => {
                let hooked_rate = rate * self.hook_ratio.max(1.0);
                let allowed = budget + self.credit / CREDIT_DRAIN_SECONDS;
                if hooked_rate <= allowed {
                    1.0
                } else {
                    (allowed / hooked_rate).max(MIN_BUDGET_PROBABILITY)
                }
            }
        }
    }

    pub(super) fn observe_rate(&mut self, counter: u64, now: PollTime) {
        if let Some((last_counter, last)) = self.last_poll {
            let elapsed = now.wall_ns.saturating_sub(last.wall_ns);
            if elapsed > 0 {
                let made = counter.saturating_sub(last_counter) as f64;
                let rate = made * 1e9 / elapsed as f64;
                // How fast it allocates while it runs: over its CPU time
                // (which includes its other threads', so never below the
                // wall-clock rate). Polls are timed by it: on a busy
                // machine the process runs in bursts at this rate.
                let cpu_elapsed = now.cpu_ns.saturating_sub(last.cpu_ns);
                let running_rate = if cpu_elapsed > 0 {
                    rate.max(made * 1e9 / cpu_elapsed as f64)
                } else {
                    rate
                };
                // The average rate (what a budget divides), from stretches
                // the hook was off for: hooked, the process runs slower.
                // Until there is one, the hooked rate times 4, the most the
                // hook slows a process: fewer windows rather than too many.
                if !self.hooked_since_poll {
                    let share = 1.0 - (-(elapsed as f64) / RATE_TIME_CONSTANT_NS).exp();
                    self.rate = Some(match (self.rate, self.rate_unhooked) {
                        (Some(old), true) => old + share * (rate - old),
                        _ => rate,
                    });
                    self.rate_unhooked = true;
                } else if !self.rate_unhooked {
                    self.rate = Some(4.0 * rate);
                } else if let Some(old) = self.rate.filter(|&old| rate > old) {
                    // Hooked, the process runs slower, so what it made is
                    // at most its rate unwatched: a floor. Without it a
                    // process that went quiet (q = 1, the hook always on)
                    // and then busy would never have its hook off again to
                    // measure the rate, and would stay hooked for good.
                    let share = 1.0 - (-(elapsed as f64) / RATE_TIME_CONSTANT_NS).exp();
                    self.rate = Some(old + share * (rate - old));
                }
                // (A first estimate from hooked time all the same: too low,
                // until the first unhooked stretch raises it.)
                let unhooked = !self.hooked_since_poll || self.busy_rate <= 0.0;
                if unhooked && self.last_poll_asked <= POLL_MIN_NS {
                    self.approach_max = (self.approach_max * 0.99).max(made);
                }
                // While running: polls close together. A poll after a
                // quiet spell says nothing of how fast a burst will be.
                if unhooked && elapsed <= 4 * POLL_MAX_NS {
                    self.busy_rate_unhooked |= !self.hooked_since_poll;
                    // It forgets a faster rate by at most a twentieth a
                    // poll, and less for a poll after which the process
                    // barely ran: polls come closest together near a
                    // window, and while idle (on another thread), where
                    // forgetting a fast phase within a millisecond let the
                    // next one run past the window.
                    let ran = if cpu_elapsed > 0 {
                        cpu_elapsed
                    } else {
                        elapsed
                    };
                    let share = BUSY_RATE_FORGET_PER_POLL
                        .min(1.0 - (-(ran as f64) / BUSY_RATE_MEMORY_NS).exp());
                    self.busy_rate = if running_rate > self.busy_rate {
                        running_rate
                    } else {
                        self.busy_rate + share * (running_rate - self.busy_rate)
                    };
                }
            }
        }
        self.last_poll = Some((counter, now));
        self.hooked_since_poll = self.armed;
    }

    /// The most budget that can be saved (0 without a budget).
    pub(super) fn credit_limit(&self) -> f64 {
        match self.policy {
            WindowPolicy::Budget(budget) => budget * CREDIT_SECONDS,
            WindowPolicy::Fixed(_) => 0.0,
        }
    }

    /// At a poll (before the hook's state changes): the budget earned since
    /// the last, less what the hook saw since (the warm-up is not paid from
    /// the budget).
    pub(super) fn settle_credit(&mut self, counter: u64, now_ns: u64) {
        if let Some((settled, at_ns)) = self.credit_at {
            if let Some(since) = self.on_since {
                let from = since
                    .max(settled)
                    .max(self.run_began.saturating_add(self.warm_up));
                self.credit -= counter.saturating_sub(from) as f64;
            }
            if let WindowPolicy::Budget(budget) = self.policy {
                self.credit += budget * now_ns.saturating_sub(at_ns) as f64 / 1e9;
            }
        }
        self.credit = self.credit.clamp(0.0, self.credit_limit());
        self.credit_at = Some((counter, now_ns));
    }
}
