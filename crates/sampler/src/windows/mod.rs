//! Sampling windows: the NEWOBJ hook on for only part of the program.
//!
//! While Ruby has a NEWOBJ hook, every allocation takes its slow path, a
//! cost the gem cannot lower from inside the hook. So the hook is on only
//! in short windows of `window_length` consecutive allocations, placed at
//! random in the sequence of the process's allocations (Ruby's allocation
//! counter, `GC.stat(:total_allocated_objects)`), many a second.
//!
//! Where they are: the allocation sequence is cut into blocks, block k
//! `B_k` allocations long, and each block holds one window at a uniformly
//! random offset, wrapping around within the block (a window that would
//! run past the block's end continues at its start). So every allocation
//! of block k is in a window with probability exactly `q_k = L / B_k`,
//! whatever the program does, and a sample weighs 1 / (sample rate x q_k),
//! fixed when it is taken (Horvitz-Thompson): right for every site in
//! every interval on average, with nothing rescaled at a flush. One window
//! per block also spreads them evenly: an interval of N allocations holds
//! N / B windows, give or take one, so no interval of many blocks goes
//! without.
//!
//! Why allocation counts and not the clock: a window's bounds must not
//! depend on the program. Clock time would: the program runs slower while
//! the hook is on (on-time holds fewer allocations than off-time, more so
//! for code that allocates more), and a timer that fires while a server
//! waits for IO would open its window on whatever runs right after the IO.
//!
//! How the hook comes on in time: it cannot count allocations while off,
//! so a postponed job polls Ruby's counter (`poll`), woken by a timer
//! thread at times chosen from the allocation rate while the process runs
//! (over its CPU time: on a loaded machine it runs in slices), closer
//! together as the next window nears, and arms the hook before the window
//! starts: by a margin that polls need to come in time (`lead`), plus as
//! far as one more poll would not pay for (`ARM_AHEAD`: with no core to
//! spare, a poll costs the process as much as a thousand or more hooked
//! allocations). While on, the hook counts itself: the collector's
//! countdown runs to the next event (a sample, or a window's end), so an
//! allocation that is not sampled still costs one decrement. At a window's
//! end the hook asks the job to switch it off, or stays on if the next
//! window is near. A poll that comes after a window's start (a long C call
//! that let no job run, a busy machine that ran the timer thread late, or a
//! job Ruby flagged on a thread that then waited: ruby/window_timer.rs) arms
//! late: the part of the window before it is missed, as is a whole window
//! that ended before any poll came, and the lead grows while polls come
//! late. Missed allocations are counted (`WindowFlush::missed`, and what
//! they stand for, `missed_estimate`), and a flush shows them as one row of
//! their own: their sites are unknown. (Moving a late window to where the
//! hook came on instead would keep per-site totals only for code without
//! long C calls: it gives the window to the Ruby code after the call, and
//! a test with JSON.parse read its caller's rendering at 15 times its
//! share.)
//!
//! With a budget (`WindowPolicy::Budget`), each block's q is chosen when
//! the block begins, from the allocation rate so far and how many
//! allocations each window really hooked (its lead included), so that the
//! hook sees about `budget` allocations a second, plus what was saved
//! while it saw fewer (`CREDIT_SECONDS`); a block's q depends only on what
//! came before it, so nothing is biased. A warm-up keeps the hook
//! on for the first `warm_up` allocations since start (one block of
//! q = 1): a short profile (a block, a script, a test) is then complete.

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

mod budget;
mod interval;

pub use interval::{IntervalTally, WindowFlush};

use super::gaps::GapSampler;
use super::sample_cost::SampleCost;

/// How the probability that an allocation is in a window is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WindowPolicy {
    /// The same for every block (1.0: always on, no windows).
    Fixed(f64),
    /// Allocations per second the hook may see: each block's probability
    /// is chosen from the allocation rate so far, at most 1.
    Budget(f64),
}

/// Allocations per window by default.
pub const DEFAULT_WINDOW_LENGTH: u64 = 1_000;

/// Inside a window the hook is paid for already, so a sample costs only
/// itself: windows sample at sample_rate / q, so that a process takes as
/// many samples as it would without windows, up to this rate.
pub const MAX_IN_WINDOW_RATE: f64 = 0.1;

/// The lowest probability a budget chooses.
pub const MIN_BUDGET_PROBABILITY: f64 = 0.001;

/// Polls come at least this far apart, and at most this far apart while
/// the process runs Ruby code (ns).
const POLL_MIN_NS: u64 = 50_000;
const POLL_MAX_NS: u64 = 20_000_000;

/// The lead: the hook must be on when the next window is at most this many
/// allocations away, or one and a half times as many as a poll asked for at
/// the shortest interval may see (bursts and late polls included),
/// whichever is more. (It is armed `ARM_AHEAD` further out.)
const MIN_LEAD: u64 = 500;

/// What a poll costs, in hooked allocations: it wakes the timer thread and
/// interrupts the running thread for a job, which on a machine with no
/// core to spare costs a Rails process as much CPU as a thousand or more
/// hooked allocations (docs/performance.md).
const POLL_COST: u64 = 1_000;

/// The hook is armed when the next window is at most this many allocations
/// beyond the lead: closer, one more poll, which halves the way, costs more
/// than the hooked allocations it saves. A window at most this far beyond
/// the lead after the last one's end keeps the hook on in between.
const ARM_AHEAD: u64 = 2 * POLL_COST;

/// The next poll is asked for at this share of the time the way to the
/// lead should take at the busy rate: half near the window, three quarters
/// while it is more than `FAR_AHEAD` beyond the lead. Far out, the quarter
/// left is 2,000 allocations or more to spare for a burst or a late
/// wake-up, and a poll saved is worth `POLL_COST`; near, half the way is
/// what keeps late polls rare (docs/performance.md).
const NEAR_SHARE: f64 = 0.5;
const FAR_SHARE: f64 = 0.75;
const FAR_AHEAD: u64 = 4 * ARM_AHEAD;

/// The most the lead grows while polls come late.
const MAX_LATE_FACTOR: f64 = 8.0;

/// One block of the allocation sequence and its window.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Block {
    id: u32,
    begin: u64,
    len: u64,
    /// Where its window starts, from `begin` (wrapping within the block).
    offset: u64,
    /// Allocations of its window (min(window_length, len)).
    window: u64,
    probability: f64,
    /// The sample rate inside its window.
    sample_rate: f64,
}

impl Block {
    /// What an in-window sample of a windowed block weighs (0.0 for a
    /// block sampled in full).
    fn sample_weight(&self) -> f64 {
        let weight = 1.0 / (self.sample_rate * self.probability);
        if self.probability < 1.0 && weight.is_finite() {
            weight
        } else {
            0.0
        }
    }

    /// Its window as at most two stretches [start, end), in order.
    fn stretches(&self) -> ([(u64, u64); 2], usize) {
        let end = self.offset + self.window;
        if end <= self.len {
            let s = self.begin + self.offset;
            ([(s, s + self.window), (0, 0)], 1)
        } else {
            let wrapped = end - self.len;
            (
                [
                    (self.begin, self.begin + wrapped),
                    (self.begin + self.offset, self.begin + self.len),
                ],
                2,
            )
        }
    }
}

/// A sampled allocation's window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampled {
    /// The block's id.
    pub window: u32,
    /// The probability that the allocation was in a window (q).
    pub window_probability: f64,
    /// The probability that it was sampled at all (the sample rate in
    /// its window x q): the sample weighs 1 / this.
    pub probability: f64,
}

/// What the hook is to do at an event.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Event {
    /// Sample this allocation.
    pub sample: Option<Sampled>,
    /// Allocations to skip before the next event (`u64::MAX`: none).
    pub countdown: u64,
    /// The hook should go off: ask the job to switch it.
    pub switch_off: bool,
}

/// When a poll runs: a monotonic clock, and the CPU time the process has
/// used (both ns). Allocations happen only while the process runs, so
/// allocations over CPU time is how fast it allocates while it runs, also
/// when the machine is busy and it runs a fraction of the wall time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PollTime {
    pub wall_ns: u64,
    pub cpu_ns: u64,
}

/// What a poll decided.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Poll {
    /// Whether the hook should be on.
    pub hook_on: bool,
    /// When it was just armed: the countdown to set before switching it on.
    pub countdown: Option<u64>,
    /// When to poll next, from now (ns); None: no need (sampling stopped).
    pub next_poll_in_ns: Option<u64>,
}

#[derive(Debug)]
pub struct Windows {
    policy: WindowPolicy,
    warm_up: u64,
    window_length: u64,
    /// The collector's sample rate, and the gaps between samples inside
    /// windows (at each block's rate).
    sample_rate: f64,
    gaps: GapSampler,
    rng: SmallRng,
    block: Block,
    /// The stretch of `block` the cursor is in (0 or 1).
    stretch: usize,
    next_block_id: u32,
    /// The hook is on (as far as the windows know): armed by a poll, until
    /// a window's end asks for it off.
    armed: bool,
    /// Since when (counter) the hook has been on without a break.
    on_since: Option<u64>,
    /// Position of the next event while armed.
    next_event: u64,
    /// In-window allocations to skip before the next sample.
    pending_gap: u64,
    /// While the hook is on in the cursor's stretch: where it began to see
    /// it (the part not yet counted in `stretch_seen` and `interval_on`).
    observed_from: Option<u64>,
    /// Allocations of the cursor's stretch the hook saw, counted so far.
    stretch_seen: u64,
    /// How near (allocations) a window must be to arm the hook, from the
    /// busy rate at the last poll.
    lead: u64,
    // Rates: the last poll (counter, time), the average rate (per second
    // of wall time), the rate while the process runs, and hooked /
    // in-window allocations.
    last_poll: Option<(u64, PollTime)>,
    rate: Option<f64>,
    busy_rate: f64,
    /// How far ahead the last poll asked for the next (ns), and the most
    /// allocations seen between two polls asked for at the shortest
    /// interval (decaying).
    last_poll_asked: u64,
    approach_max: f64,
    /// The hook was on at some time since the last poll: the process ran
    /// slower than it does unwatched, so the busy rate learns nothing.
    hooked_since_poll: bool,
    /// `rate` has been measured with the hook off.
    rate_unhooked: bool,
    /// The busy rate has been measured with the hook off at least once
    /// (until then it is the hooked rate: too low to plan polls by).
    busy_rate_unhooked: bool,
    hook_ratio: f64,
    /// Budget saved (hooked allocations), as of `credit_at` (counter, ns).
    credit: f64,
    credit_at: Option<(u64, u64)>,
    /// This interval: allocations the hook saw in windows, missed, hooked
    /// in all, and windows crossed; the counter at its start.
    interval_on: u64,
    interval_missed: u64,
    interval_missed_estimate: f64,
    /// Since start: how many allocations missed windows stand for.
    run_missed_estimate: f64,
    /// Multiplies the lead: doubled at each poll that comes too late, back
    /// towards 1 at each arm in time.
    late_factor: f64,
    interval_windows: u64,
    interval_began: u64,
    /// See `WindowFlush::window_sample_weight`.
    interval_window_weight: f64,
    latest_window_weight: f64,
    /// Since the last update of `hook_ratio`.
    ratio_hooked: u64,
    ratio_on: u64,
    run_began: u64,
    /// What a sample costs: caps the in-window rate under a budget.
    sample_cost: SampleCost,
    /// The counter when sampling stopped (stop, or paused for Ractors).
    frozen_at: Option<u64>,
}

impl Windows {
    pub fn new(policy: WindowPolicy, seed: u64) -> Self {
        let policy = match policy {
            WindowPolicy::Fixed(q) => WindowPolicy::Fixed(q.clamp(0.0, 1.0)),
            budget => budget,
        };
        let mut windows = Windows {
            policy,
            warm_up: 0,
            window_length: DEFAULT_WINDOW_LENGTH,
            sample_rate: 1.0,
            gaps: GapSampler::new(1.0, seed.wrapping_add(1)),
            rng: SmallRng::seed_from_u64(seed),
            block: Block {
                id: 0,
                begin: 0,
                len: 1,
                offset: 0,
                window: 1,
                probability: 1.0,
                sample_rate: 1.0,
            },
            stretch: 0,
            next_block_id: 0,
            armed: false,
            on_since: None,
            next_event: 0,
            pending_gap: 0,
            observed_from: None,
            stretch_seen: 0,
            lead: MIN_LEAD,
            last_poll: None,
            rate: None,
            busy_rate: 0.0,
            last_poll_asked: POLL_MIN_NS,
            approach_max: 0.0,
            hooked_since_poll: false,
            rate_unhooked: false,
            busy_rate_unhooked: false,
            hook_ratio: 2.0,
            credit: 0.0,
            credit_at: None,
            interval_on: 0,
            interval_missed: 0,
            interval_missed_estimate: 0.0,
            run_missed_estimate: 0.0,
            late_factor: 1.0,
            interval_windows: 0,
            interval_began: 0,
            interval_window_weight: 0.0,
            latest_window_weight: 0.0,
            ratio_hooked: 0,
            ratio_on: 0,
            run_began: 0,
            sample_cost: SampleCost::default(),
            frozen_at: None,
        };
        windows.block = windows.new_block(0);
        // (A placeholder until start, at a sample rate not yet set.)
        windows.interval_window_weight = 0.0;
        windows.latest_window_weight = 0.0;
        windows
    }

    pub fn policy(&self) -> WindowPolicy {
        self.policy
    }

    /// New windows with `policy` and `seed`, and these' settings (warm-up,
    /// window length, sample rate).
    pub fn renewed(&self, policy: WindowPolicy, seed: u64) -> Windows {
        let mut windows = Windows::new(policy, seed);
        windows.warm_up = self.warm_up;
        windows.window_length = self.window_length;
        windows.sample_rate = self.sample_rate;
        // (The same process: its samples cost what they did.)
        windows.sample_cost = self.sample_cost;
        windows
    }

    /// Every allocation is in a window until `allocations` have been made
    /// since start (0: windows from the start). Takes effect at the next
    /// start.
    pub fn set_warm_up(&mut self, allocations: u64) {
        self.warm_up = allocations;
    }

    pub fn warm_up(&self) -> u64 {
        self.warm_up
    }

    /// Allocations per window (at least 1). Takes effect at the next start.
    pub fn set_window_length(&mut self, allocations: u64) {
        self.window_length = allocations.max(1);
    }

    pub fn window_length(&self) -> u64 {
        self.window_length
    }

    /// The collector's sample rate (0..=1): what windows sample at where
    /// q is 1, and what they make up for elsewhere. From the next block on.
    pub fn set_sample_rate(&mut self, rate: f64) {
        self.sample_rate = rate.clamp(0.0, 1.0);
    }

    /// The sample rate inside a window of probability q. Under a budget
    /// it is also held to what keeps samples within their share of the
    /// time (sampler/sample_cost.rs), never below the sample rate.
    fn in_window_rate(&self, q: f64) -> f64 {
        if q >= 1.0 {
            return self.sample_rate;
        }
        let mut rate = (self.sample_rate / q).min(MAX_IN_WINDOW_RATE);
        if let WindowPolicy::Budget(_) = self.policy {
            rate = rate.min(self.sample_cost.rate_cap(self.busy_rate * q));
        }
        rate.max(self.sample_rate)
    }

    /// One sample took `ns` in the hook.
    pub fn record_sample_time(&mut self, ns: u64) {
        self.sample_cost.record_in_hook(ns);
    }

    /// The upkeep of `samples` new samples (object ids, sizes) took `ns`.
    pub fn record_upkeep_time(&mut self, ns: u64, samples: usize) {
        self.sample_cost.record_upkeep(ns, samples);
    }

    /// Whether windows are in use at all.
    pub fn enabled(&self) -> bool {
        match self.policy {
            WindowPolicy::Fixed(q) => q < 1.0,
            WindowPolicy::Budget(_) => true,
        }
    }

    /// Whether the hook should be on now.
    pub fn is_on(&self) -> bool {
        !self.enabled() || self.armed
    }

    // ----- the schedule --------------------------------------------------

    fn new_block(&mut self, begin: u64) -> Block {
        let id = self.next_block_id;
        self.next_block_id = self.next_block_id.wrapping_add(1);
        let into_run = begin.saturating_sub(self.run_began);
        if into_run < self.warm_up {
            // The warm-up: one block, all of it in the window.
            let len = self.warm_up - into_run;
            return Block {
                id,
                begin,
                len,
                offset: 0,
                window: len,
                probability: 1.0,
                sample_rate: self.sample_rate,
            };
        }
        let q = self.next_probability();
        let window = self.window_length;
        // len = window / q, so that window / len is q (up to rounding,
        // which the probability follows exactly).
        let len = ((window as f64 / q.max(f64::MIN_POSITIVE)).round() as u64).max(window);
        let probability = window as f64 / len as f64;
        let block = Block {
            id,
            begin,
            len,
            offset: self.rng.random_range(0..len),
            window,
            probability,
            sample_rate: self.in_window_rate(probability),
        };
        let weight = block.sample_weight();
        if weight > 0.0 {
            self.interval_window_weight = self.interval_window_weight.max(weight);
            self.latest_window_weight = weight;
        }
        block
    }

    /// The cursor's stretch.
    fn current(&self) -> (u64, u64) {
        self.block.stretches().0[self.stretch]
    }

    /// Moves the cursor to the next stretch, beginning blocks as needed.
    fn advance(&mut self) {
        let (_, count) = self.block.stretches();
        self.stretch += 1;
        if self.stretch >= count {
            let begin = self.block.begin + self.block.len;
            self.block = self.new_block(begin);
            self.stretch = 0;
            self.enter_block();
            // (A window that wraps is two stretches of one block.)
            self.interval_windows += 1;
        }
        self.observed_from = None;
        self.stretch_seen = 0;
    }

    /// The cursor entered a new block: samples from here at its rate. (A
    /// gap drawn at another rate is drawn again: gaps are memoryless, so
    /// every allocation of the block is sampled with exactly its rate.)
    fn enter_block(&mut self) {
        if self.gaps.rate() != self.block.sample_rate {
            self.gaps.set_rate(self.block.sample_rate);
            self.pending_gap = self.gaps.next_gap();
        }
    }

    /// Counts what the hook saw of the cursor's stretch up to `to` (the
    /// hook on since `observed_from`), and ends that observation.
    fn close_observation(&mut self, to: u64) {
        if let Some(from) = self.observed_from.take() {
            let (s, e) = self.current();
            let to = to.clamp(s, e);
            if to > from {
                let seen = to - from;
                self.interval_on += seen;
                self.ratio_on += seen;
                self.stretch_seen += seen;
            }
        }
    }

    /// Leaves the cursor's stretch (it ended): what the hook did not see of
    /// it was missed.
    fn leave_stretch(&mut self) {
        let (s, e) = self.current();
        self.close_observation(e);
        let missed = (e - s).saturating_sub(self.stretch_seen);
        self.interval_missed += missed;
        let estimate = missed as f64 / self.block.probability;
        self.interval_missed_estimate += estimate;
        self.run_missed_estimate += estimate;
        self.advance();
    }

    /// With the hook on from `x` (the next allocation's position) and
    /// `gap` in-window allocations to skip: the next event. Leaves the
    /// cursor on the stretch the event is in or at.
    fn schedule_from(&mut self, x: u64, mut gap: u64) -> Event {
        loop {
            let (s, e) = self.current();
            if e <= x {
                self.leave_stretch();
                continue;
            }
            if s > x
                && s - x
                    > self
                        .lead
                        .saturating_add(ARM_AHEAD)
                        .max(self.lead.saturating_mul(2))
            {
                // Far: off until a poll arms it again.
                self.armed = false;
                self.pending_gap = gap;
                return Event {
                    sample: None,
                    countdown: u64::MAX,
                    switch_off: true,
                };
            }
            let from = s.max(x);
            if self.observed_from.is_none() {
                self.observed_from = Some(from);
            }
            let target = from.saturating_add(gap);
            if target < e {
                self.next_event = target;
                self.pending_gap = 0;
                return Event {
                    sample: None,
                    countdown: target - x,
                    switch_off: false,
                };
            }
            // No sample in the rest of this stretch: an event at its end.
            gap -= e - from;
            self.next_event = e;
            self.pending_gap = gap;
            return Event {
                sample: None,
                countdown: e - x,
                switch_off: false,
            };
        }
    }

    // ----- the hook --------------------------------------------------------

    /// In the NEWOBJ hook, when the countdown reached an event. `overrun`:
    /// allocations since the event that could not be handled (the sampler
    /// lock busy), so this one is that many past it. Returns whether to
    /// sample this allocation, and the next countdown.
    pub fn on_event(&mut self, overrun: u64) -> Event {
        if !self.armed || self.frozen_at.is_some() {
            return Event {
                sample: None,
                countdown: u64::MAX,
                switch_off: true,
            };
        }
        let position = self.next_event.saturating_add(overrun);
        // Stretches that ended by this allocation are left. Where the next
        // window begins where the last ended, this allocation is its first:
        // seen from here, and sampled if no in-window gap remains.
        let mut left = false;
        while self.current().1 <= position {
            self.leave_stretch();
            left = true;
        }
        let (s, e) = self.current();
        if position >= s && position < e {
            if left {
                self.observed_from = Some(position);
                if self.pending_gap > 0 {
                    let gap = self.pending_gap - 1;
                    return self.schedule_from(position + 1, gap);
                }
            }
            let sample = Some(Sampled {
                window: self.block.id,
                window_probability: self.block.probability,
                probability: self.block.sample_rate * self.block.probability,
            });
            let gap = self.gaps.next_gap();
            let mut event = self.schedule_from(position + 1, gap);
            event.sample = sample;
            return event;
        }
        let gap = self.pending_gap;
        self.schedule_from(position + 1, gap)
    }

    // ----- the job -----------------------------------------------------------

    /// At start: a first block from `counter`, the warm-up if any.
    /// Returns the first poll's decision.
    pub fn start(&mut self, counter: u64, now: PollTime) -> Poll {
        self.run_began = counter;
        self.run_missed_estimate = 0.0;
        self.latest_window_weight = 0.0;
        self.begin_interval(counter);
        self.frozen_at = None;
        self.armed = false;
        self.on_since = None;
        self.last_poll = None;
        self.rate = None;
        self.rate_unhooked = false;
        self.busy_rate = 0.0;
        self.busy_rate_unhooked = false;
        self.approach_max = 0.0;
        self.credit = self.credit_limit();
        self.credit_at = None;
        self.block = self.new_block(counter);
        // (Not the last run's block, which begin_interval above counted.)
        self.interval_window_weight = self.block.sample_weight();
        self.stretch = 0;
        self.late_factor = 1.0;
        self.observed_from = None;
        self.stretch_seen = 0;
        self.gaps.set_rate(self.block.sample_rate);
        self.pending_gap = self.gaps.next_gap();
        self.poll(counter, now)
    }

    /// The hook is being switched off (the collector applied a poll's
    /// `hook_on: false`) at `counter`.
    fn hook_went_off(&mut self, counter: u64) {
        if let Some(since) = self.on_since.take() {
            self.ratio_hooked += counter.saturating_sub(since);
            self.close_observation(counter);
        }
        if self.ratio_on >= 20 * self.window_length {
            let observed = self.ratio_hooked as f64 / self.ratio_on as f64;
            self.hook_ratio += 0.5 * (observed.max(1.0) - self.hook_ratio);
            self.ratio_hooked = 0;
            self.ratio_on = 0;
        }
    }

    /// From the postponed job, with Ruby's allocation counter and the
    /// clocks: arms the hook when the next window is near, and says when
    /// to poll again.
    pub fn poll(&mut self, counter: u64, now: PollTime) -> Poll {
        if !self.enabled() {
            return Poll {
                hook_on: true,
                countdown: None,
                next_poll_in_ns: None,
            };
        }
        if self.frozen_at.is_some() {
            return Poll {
                hook_on: false,
                countdown: None,
                next_poll_in_ns: None,
            };
        }
        self.observe_rate(counter, now);
        self.settle_credit(counter, now.wall_ns);
        let per_shortest_poll = self.busy_rate * POLL_MIN_NS as f64 / 1e9;
        self.lead = if self.busy_rate <= 0.0 {
            // The rate is not known yet (the first poll): on until the
            // first window rather than risk missing it.
            u64::MAX
        } else if !self.busy_rate_unhooked {
            // Known only from hooked time, which runs up to ~4 times slower.
            MIN_LEAD.max((6.0 * per_shortest_poll) as u64)
        } else {
            let lead = 1.5 * per_shortest_poll.max(self.approach_max) * self.late_factor;
            // At most a quarter of a block: a longer lead would keep the
            // hook on between windows (`2 * lead` in `schedule_from`) for
            // good, and the lead learns only while the hook is off.
            MIN_LEAD.max((lead as u64).min(self.block.len / 4))
        };
        if self.armed {
            return self.hook_on(None);
        }
        self.hook_went_off(counter);
        // Windows that went by with the hook off were missed, and one
        // under way is missed up to here: the poll came late.
        let mut late = false;
        loop {
            let (s, e) = self.current();
            if e > counter {
                late |= s < counter;
                break;
            }
            late = true;
            self.leave_stretch();
        }
        if late {
            self.late_factor = (self.late_factor * 2.0).min(MAX_LATE_FACTOR);
        }
        let (s, _) = self.current();
        if s <= counter.saturating_add(self.lead).saturating_add(ARM_AHEAD) {
            if !late {
                self.late_factor = (self.late_factor * 0.8).max(1.0);
            }
            self.armed = true;
            self.hooked_since_poll = true;
            self.on_since = Some(counter);
            let gap = self.pending_gap;
            let event = self.schedule_from(counter, gap);
            if event.switch_off {
                // (Cannot happen: the window is within the lead and ARM_AHEAD.)
                self.armed = false;
                self.on_since = None;
            } else {
                return self.hook_on(Some(event.countdown));
            }
        }
        // A share of the time the rest of the way should take, ahead of the
        // lead: closer together as the window nears. (At the shortest
        // interval until the rate is known.)
        let next = if !self.busy_rate_unhooked {
            POLL_MIN_NS
        } else {
            let ahead = (s - counter).saturating_sub(self.lead) as f64;
            let share = if ahead > FAR_AHEAD as f64 {
                FAR_SHARE
            } else {
                NEAR_SHARE
            };
            ((ahead / self.busy_rate * 1e9 * share) as u64).clamp(POLL_MIN_NS, POLL_MAX_NS)
        };
        self.last_poll_asked = next;
        Poll {
            hook_on: false,
            countdown: None,
            next_poll_in_ns: Some(next),
        }
    }

    /// A poll's answer with the hook on (`countdown`: it was just armed).
    /// The next poll only keeps the rates current, soon while the rate,
    /// and so the lead, is not known yet.
    fn hook_on(&mut self, countdown: Option<u64>) -> Poll {
        let next = if self.busy_rate <= 0.0 {
            POLL_MIN_NS
        } else {
            POLL_MAX_NS
        };
        self.last_poll_asked = next;
        Poll {
            hook_on: true,
            countdown,
            next_poll_in_ns: Some(next),
        }
    }

    /// Sampling stopped at `counter` (stop, or paused for Ractors): what
    /// is allocated from here on is in no window.
    pub fn freeze(&mut self, counter: u64) {
        if self.frozen_at.is_none() && self.enabled() {
            self.armed = false;
            self.hook_went_off(counter);
            self.frozen_at = Some(counter);
        }
    }

    /// In a forked child: its own windows from here (else every worker
    /// forked from one parent would sample the same allocations), and an
    /// interval starting now, as its allocation samples do.
    pub fn start_child_interval(&mut self, counter: u64, seed: u64) {
        self.rng = SmallRng::seed_from_u64(seed);
        self.gaps = GapSampler::new(self.gaps.rate(), seed.wrapping_add(1));
        if self.frozen_at.is_none() && self.enabled() {
            let was_on = self.on_since.is_some();
            self.block = self.new_block(counter.max(self.block.begin));
            self.stretch = 0;
            self.observed_from = None;
            self.stretch_seen = 0;
            self.armed = false;
            self.on_since = was_on.then_some(counter);
            self.gaps.set_rate(self.block.sample_rate);
            self.pending_gap = self.gaps.next_gap();
            self.last_poll = None;
        }
        self.begin_interval(counter);
    }
}

#[cfg(test)]
mod tests;
