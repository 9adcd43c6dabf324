//! Windows driven by a simulated process: allocations from call sites, a
//! clock that runs slower while the hook is on, polls when the windows
//! ask for them (or late, as in a long C call), and the collector's
//! countdown. What the estimates must be: each site's truth, per run.

use super::*;

const US: u64 = 1_000;

/// A simulated process with a collector's countdown and hook.
struct Sim {
    windows: Windows,
    counter: u64,
    now: u64,
    /// The process's CPU time: it runs only while it allocates.
    cpu: u64,
    hook_on: bool,
    countdown: u64,
    next_poll: Option<u64>,
    job_requested: bool,
    /// Polls are held back until then (a long C call).
    no_polls_until: u64,
    /// Per site: allocations, and the weighted samples.
    truth: Vec<f64>,
    estimate: Vec<f64>,
    hooked: u64,
    /// (window id, probability) of every sample, for the spread tests.
    samples: Vec<(usize, u32, f64, f64)>,
    /// What each sample costs (ns), and the time spent on samples.
    sample_ns: u64,
    sampling_ns: u64,
    /// Polls the windows asked for (the timer thread's wake-ups), while
    /// the process allocates or idles.
    timed_polls: u64,
}

impl Sim {
    fn new(policy: WindowPolicy, rate: f64, seed: u64, warm_up: u64, length: u64) -> Sim {
        let mut windows = Windows::new(policy, seed);
        windows.set_warm_up(warm_up);
        windows.set_window_length(length);
        windows.set_sample_rate(rate);
        let poll = windows.start(
            0,
            PollTime {
                wall_ns: 0,
                cpu_ns: 0,
            },
        );
        let mut sim = Sim {
            windows,
            counter: 0,
            now: 0,
            cpu: 0,
            hook_on: false,
            countdown: u64::MAX,
            next_poll: None,
            job_requested: false,
            no_polls_until: 0,
            truth: vec![0.0; 8],
            estimate: vec![0.0; 8],
            hooked: 0,
            samples: Vec::new(),
            sample_ns: 0,
            sampling_ns: 0,
            timed_polls: 0,
        };
        sim.apply(poll);
        sim
    }

    /// A budget of 100,000 hooked allocations a second, sample rate 0.01,
    /// no warm-up, windows of 1,000.
    fn with_budget(seed: u64) -> Sim {
        Sim::new(WindowPolicy::Budget(100_000.0), 0.01, seed, 0, 1_000)
    }

    fn apply(&mut self, poll: Poll) {
        if let Some(countdown) = poll.countdown {
            self.countdown = countdown;
        }
        self.hook_on = poll.hook_on;
        self.next_poll = poll.next_poll_in_ns.map(|d| self.now + d);
    }

    fn run_job(&mut self) {
        self.job_requested = false;
        let poll = self.windows.poll(self.counter, self.time());
        self.apply(poll);
    }

    fn time(&self) -> PollTime {
        PollTime {
            wall_ns: self.now,
            cpu_ns: self.cpu,
        }
    }

    /// Advances both clocks: the process runs.
    fn run_for(&mut self, ns: u64) {
        self.now += ns;
        self.cpu += ns;
    }

    /// `n` allocations of `site`, each `ns` long (three times that while
    /// hooked), with the jobs Ruby would run between them.
    fn allocate(&mut self, site: usize, n: u64, ns: u64) {
        for _ in 0..n {
            let polls_allowed = self.now >= self.no_polls_until;
            let poll_due = self.next_poll.is_some_and(|t| self.now >= t);
            if polls_allowed && (self.job_requested || poll_due) {
                if poll_due && !self.job_requested {
                    self.timed_polls += 1;
                }
                self.run_job();
            }
            self.truth[site] += 1.0;
            if self.hook_on {
                self.hooked += 1;
                self.run_for(3 * ns);
                if self.countdown > 0 {
                    self.countdown -= 1;
                } else {
                    let event = self.windows.on_event(0);
                    if let Some(sampled) = event.sample {
                        let weight = 1.0 / sampled.probability;
                        self.estimate[site] += weight;
                        self.samples.push((
                            site,
                            sampled.window,
                            sampled.window_probability,
                            weight,
                        ));
                        // In light mode every sample asks for the job,
                        // which polls the windows too.
                        self.job_requested = true;
                        if self.sample_ns > 0 {
                            self.run_for(self.sample_ns);
                            self.sampling_ns += self.sample_ns;
                            self.windows.record_sample_time(self.sample_ns);
                        }
                    }
                    self.countdown = event.countdown;
                    if event.switch_off {
                        self.job_requested = true;
                    }
                }
            } else {
                self.run_for(ns);
            }
            self.counter += 1;
        }
    }

    /// Time passes without allocations (IO, sleep).
    fn idle(&mut self, ns: u64) {
        self.now += ns;
    }

    /// Time passes without allocations, but with the polls that come due
    /// meanwhile (another thread wakes to run them: a server's reactor or
    /// a flusher), each taking `job_ns` of CPU.
    fn idle_polled(&mut self, ns: u64, job_ns: u64) {
        let until = self.now + ns;
        while let Some(due) = self.next_poll.filter(|&due| due < until) {
            self.now = self.now.max(due);
            self.cpu += job_ns;
            self.timed_polls += 1;
            self.run_job();
        }
        self.now = until;
    }

    /// `allocate`, returning the share of those allocations the hook saw.
    fn hooked_share(&mut self, site: usize, n: u64, ns: u64) -> f64 {
        let hooked = self.hooked;
        self.allocate(site, n, ns);
        (self.hooked - hooked) as f64 / n as f64
    }

    fn ratio(&self, site: usize) -> f64 {
        self.estimate[site] / self.truth[site]
    }
}

#[test]
fn without_windows_the_hook_stays_on_and_nothing_is_scaled() {
    let mut sim = Sim::new(WindowPolicy::Fixed(1.0), 1.0, 1, 0, 1_000);
    assert!(sim.hook_on);
    assert!(!sim.windows.enabled());
    assert_eq!(sim.windows.flush(100).coverage, 1.0);
}

/// Every allocation is in a window with probability q, wherever it is in
/// the sequence: the share of allocations hooked in windows, stretch by
/// stretch of 250 positions (a quarter of a block) over many seeds.
#[test]
#[cfg_attr(miri, ignore = "statistical and slow under Miri; no unsafe code")]
fn every_allocation_is_in_a_window_with_probability_q() {
    let q = 0.1;
    let (chunk, chunks) = (250u64, 80usize);
    let mut seen = vec![0.0f64; chunks];
    let seeds = 2_000;
    for seed in 0..seeds {
        let mut sim = Sim::new(WindowPolicy::Fixed(q), 1.0, seed, 0, 100);
        for seen in seen.iter_mut() {
            let before = sim.estimate[0];
            sim.allocate(0, chunk, 50);
            // At rate 1.0 every in-window allocation is a sample of weight
            // 1 / q: the chunk's in-window count is its estimate x q.
            *seen += (sim.estimate[0] - before) * q;
        }
    }
    // ~3.6% standard error a chunk: 15% is four.
    for (index, &n) in seen.iter().enumerate() {
        let share = n / (chunk as f64 * seeds as f64);
        assert!((share / q - 1.0).abs() < 0.15, "chunk {index}: {share}");
    }
}

/// Where one window's stretch ends and the next begins at the same
/// allocation (a window that wraps in its block, or one that begins its
/// block right after the last one ended) and the hook stays on, that
/// allocation is in the second: nothing is missed, and every allocation
/// is seen.
#[test]
fn a_hook_that_stays_on_across_adjoining_windows_misses_nothing() {
    for seed in 0..20 {
        // Blocks of 2,000 with windows of 1,000: the gaps are short enough
        // for the hook to stay on between windows (`ARM_AHEAD`), and
        // about half the windows wrap. At a sample rate below 1 a window's
        // end is an event of its own.
        let mut sim = Sim::new(WindowPolicy::Fixed(0.5), 0.01, seed, 0, 1_000);
        sim.allocate(0, 200_000, 50);
        let flush = sim.windows.flush(sim.counter);
        assert!(flush.windows >= 99, "{flush:?}");
        assert_eq!(flush.missed, 0, "seed {seed}: {flush:?}");
        assert_eq!(flush.coverage, 0.5, "seed {seed}: {flush:?}");
    }
}

/// A server idle between requests polls its windows meanwhile (another
/// thread runs the job), and those polls see no allocations. When each
/// poll made the busy rate forget a twentieth of how fast a request
/// allocates, the polls of an idle spell made it forget nearly all, and
/// the next request ran past its window before the next poll (5.2% of
/// the allocations missed here). Forgetting over the process's running
/// time, polls that ran only themselves change nothing.
#[test]
#[cfg_attr(miri, ignore = "statistical and slow under Miri; no unsafe code")]
fn polls_while_idle_do_not_make_the_next_request_miss_its_window() {
    let (mut missed, mut all) = (0.0, 0.0);
    for seed in 0..10 {
        let mut sim = Sim::with_budget(seed);
        for _ in 0..2_000 {
            sim.allocate(0, 1_500, 100);
            sim.idle_polled(3_000 * US, 5 * US);
        }
        missed += sim.windows.flush(sim.counter).missed_estimate;
        all += sim.counter as f64;
    }
    assert!(missed / all < 0.002, "{} missed", missed / all);
}

const SERVER_SEEDS: u64 = 40;

/// A server: requests of three sites, bursts, and idle time between
/// requests (where a clock-timed window would open on the next request's
/// first site). Each site's estimate over a run is right, and no window
/// is missed.
#[test]
#[cfg_attr(miri, ignore = "statistical and slow under Miri; no unsafe code")]
fn a_bursty_server_is_estimated_right_per_site() {
    let mut ratios = vec![Vec::new(); 4];
    for seed in 0..SERVER_SEEDS {
        // (The default budget. At half of it, with each window hooking
        // ~3,000 allocations, these 40 seeds read site 1 at 0.977, five of
        // their standard errors low; 1,600 other seeds read it at 0.999.)
        let mut sim = Sim::new(WindowPolicy::Budget(100_000.0), 0.05, seed, 10_000, 1_000);
        for request in 0..4_000u64 {
            sim.allocate(0, 200, 40); // parsing: fast
            sim.allocate(1, 1_000, 200); // the work: slow
            if request % 10 == 0 {
                sim.allocate(2, 500, 20); // a burst
            }
            sim.allocate(3, 100, 40);
            sim.idle(500 * US);
        }
        for (site, ratios) in ratios.iter_mut().enumerate() {
            ratios.push(sim.ratio(site));
        }
        let flush = sim.windows.flush(sim.counter);
        assert!(flush.coverage > 0.0 && flush.coverage < 0.5, "{flush:?}");
        // Polls arm the hook in time for the bursts too: little is missed.
        let missed = flush.missed_estimate / sim.counter as f64;
        assert!(missed < 0.02, "seed {seed}: {missed} missed, {flush:?}");
    }
    // Within 4 standard errors of the mean over the seeds (the bursty
    // site, in few windows, spreads the most), and within 10%.
    for (site, ratios) in ratios.iter().enumerate() {
        let n = ratios.len() as f64;
        let mean = ratios.iter().sum::<f64>() / n;
        let sd = (ratios.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
        let tolerance = (4.0 * sd / n.sqrt()).min(0.1);
        assert!(
            (mean - 1.0).abs() < tolerance,
            "site {site}: mean {mean}, {ratios:?}"
        );
    }
}

/// Samples 150 frames deep cost ~5 µs each: the rate inside windows comes
/// down until they take about their share of the time, and the estimates
/// stay right (each sample weighs what its rate makes it).
#[test]
fn costly_samples_are_held_to_their_share_of_the_time() {
    let mut ratios = Vec::new();
    for seed in 0..SERVER_SEEDS {
        let mut sim = Sim::with_budget(seed);
        sim.sample_ns = 5 * US;
        // 10M allocations a second against 100,000 hooked: q = 0.01, so
        // windows would sample at 0.1, 10,000 samples a second (5%).
        sim.allocate(0, 20_000_000, 100);
        let share = sim.sampling_ns as f64 / sim.now as f64;
        assert!(
            share < 1.5 * crate::sample_cost::SAMPLE_TIME_SHARE,
            "seed {seed}: samples took {share} of the time"
        );
        ratios.push(sim.ratio(0));
    }
    let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
    assert!((mean - 1.0).abs() < 0.05, "mean {mean}, {ratios:?}");
    // Cheap samples are not held back.
    let mut sim = Sim::with_budget(1);
    sim.sample_ns = 100;
    sim.allocate(0, 20_000_000, 100);
    assert!(
        (sim.windows.block.sample_rate - MAX_IN_WINDOW_RATE).abs() < 1e-12,
        "{}",
        sim.windows.block.sample_rate
    );
}

/// The budget holds the hooked allocations near it, lead included.
#[test]
fn a_budget_holds_the_hooked_allocations_near_it() {
    // 10M allocations a second (100 ns each) against 100,000 a second.
    let mut sim = Sim::with_budget(3);
    for _ in 0..200 {
        sim.allocate(0, 10_000, 100);
    }
    let hooked_before = sim.hooked;
    let (counter, now) = (sim.counter, sim.now);
    for _ in 0..2_000 {
        sim.allocate(0, 10_000, 100);
    }
    let seconds = (sim.now - now) as f64 / 1e9;
    let hooked_rate = (sim.hooked - hooked_before) as f64 / seconds;
    assert!(
        (50_000.0..200_000.0).contains(&hooked_rate),
        "{hooked_rate} hooked a second"
    );
    assert!((sim.ratio(0) - 1.0).abs() < 0.1, "{}", sim.ratio(0));
    let flush = sim.windows.flush(sim.counter);
    assert!(flush.windows > 100, "{flush:?}");
    // (A poll can come an allocation or two after the lead.)
    assert!(
        flush.missed * 1_000 < flush.windows * 1_000 / 10,
        "{flush:?}"
    );
    let _ = counter;
}

/// Budget not yet spent is saved (a second of it at start) and spent
/// when allocations come: a short script's phases get many windows, not
/// the few a per-second rate allows in a fraction of a second; over a
/// longer run the hook still sees about the budget.
#[test]
#[cfg_attr(miri, ignore = "statistical and slow under Miri; no unsafe code")]
fn a_short_script_spends_the_saved_budget_on_its_phases() {
    for seed in 0..5 {
        let mut sim = Sim::with_budget(seed);
        // Two phases of 1M allocations at 10M a second: 0.2 s in all,
        // 20,000 hooked allocations at 100,000 a second, and the second
        // saved at start. (Each window also hooks its lead and the way the
        // polls leave to it, `ARM_AHEAD`: about 3,000 allocations a window.)
        sim.allocate(0, 1_000_000, 100);
        sim.allocate(1, 1_000_000, 100);
        let flush = sim.windows.flush(sim.counter);
        assert!(flush.windows >= 25, "seed {seed}: {flush:?}");
        for phase in 0..2 {
            let ratio = sim.ratio(phase);
            assert!(
                (ratio - 1.0).abs() < 0.25,
                "seed {seed}, phase {phase}: {ratio}"
            );
        }
        // Then the budget: at most a second's worth more than it over 10 s.
        let (hooked, now) = (sim.hooked, sim.now);
        for _ in 0..10_000 {
            sim.allocate(2, 10_000, 100);
        }
        let seconds = (sim.now - now) as f64 / 1e9;
        let rate = (sim.hooked - hooked) as f64 / seconds;
        assert!(
            rate < 100_000.0 * 1.25,
            "{rate} hooked a second over {seconds} s"
        );
    }
}

/// A busy process that went quiet (q = 1: the hook on all the time) and
/// then became busy again: the hook must go back to windows, though it
/// never went off to measure the process unhooked.
#[test]
#[cfg_attr(miri, ignore = "statistical and slow under Miri; no unsafe code")]
fn a_quiet_process_that_becomes_busy_goes_back_to_windows() {
    let mut sim = Sim::with_budget(2);
    // Busy for 0.5 s, then 10,000 allocations a second for 30 s: under
    // the budget.
    sim.allocate(0, 5_000_000, 100);
    sim.allocate(0, 300_000, 100 * US);
    let _ = sim.windows.flush(sim.counter);
    // Then 10M a second (when unhooked).
    sim.allocate(1, 4_000_000, 100);
    let share = sim.hooked_share(1, 4_000_000, 100);
    assert!(
        share < 0.1,
        "the hook saw {share} of a busy process's allocations"
    );
    assert!((sim.ratio(1) - 1.0).abs() < 0.1, "{}", sim.ratio(1));
}

/// One poll held back while the process allocates (a long C call, a busy
/// machine) makes the lead large; the hook must still go off between
/// windows afterwards, not stay on for good.
#[test]
#[cfg_attr(miri, ignore = "statistical and slow under Miri; no unsafe code")]
fn one_late_poll_does_not_keep_the_hook_on_for_good() {
    for seed in 0..4 {
        let mut sim = Sim::with_budget(seed);
        sim.allocate(0, 15_000_000, 100);
        // Until the hook is off and the next window near (within 4 ms).
        while sim.hook_on || sim.windows.current().0 > sim.counter + 40_000 {
            sim.allocate(0, 1, 100);
        }
        sim.no_polls_until = sim.now + 5_000 * US;
        sim.allocate(0, 50_000, 100);
        sim.no_polls_until = 0;
        sim.allocate(0, 1, 100);
        assert!(
            sim.windows.late_factor > 1.0,
            "seed {seed}: no poll came late"
        );
        sim.allocate(1, 10_000_000, 100);
        let share = sim.hooked_share(1, 10_000_000, 100);
        assert!(
            share < 0.05,
            "seed {seed}: the hook saw {share} of the allocations"
        );
    }
}

/// A long C call that lets no job run: the window it covers is missed,
/// counted, and never scaled for. In-use may read low by what was missed
/// (its objects were never tracked), this interval's share or since
/// start's, whichever is more.
#[test]
fn a_window_the_hook_came_on_too_late_for_is_counted_as_missed() {
    let mut sim = Sim::new(WindowPolicy::Fixed(0.1), 1.0, 5, 0, 1_000);
    sim.allocate(0, 50_000, 50);
    let before = sim.windows.flush(sim.counter);
    assert_eq!(before.missed, 0);
    assert_eq!(before.inuse_missed_share, 0.0);
    sim.no_polls_until = sim.now + 2_000 * US;
    sim.allocate(0, 40_000, 50);
    sim.allocate(0, 10_000, 50);
    let flush = sim.windows.flush(sim.counter);
    assert!(flush.missed > 0, "{flush:?}");
    assert!(flush.coverage < 0.1, "{flush:?}");
    let share = flush.missed_estimate / 50_000.0;
    assert!((flush.inuse_missed_share - share).abs() < 1e-9, "{flush:?}");
    // Later intervals miss nothing, but objects of the missed windows may
    // still be alive: since start's share stays.
    sim.allocate(0, 100_000, 50);
    let after = sim.windows.flush(sim.counter);
    assert_eq!(after.missed, 0, "{after:?}");
    let since_start = flush.missed_estimate / 200_000.0;
    assert!(
        (after.inuse_missed_share - since_start).abs() < 1e-9,
        "{after:?}"
    );
}

#[test]
fn the_warm_up_hooks_every_allocation_then_windows_begin() {
    let mut sim = Sim::new(WindowPolicy::Fixed(0.01), 1.0, 7, 30_000, 1_000);
    sim.allocate(0, 30_000, 50);
    let flush = sim.windows.flush(sim.counter);
    assert_eq!(flush.coverage, 1.0);
    assert_eq!(sim.estimate[0], 30_000.0, "weight 1 each");
    sim.allocate(1, 1_000_000, 50);
    let flush = sim.windows.flush(sim.counter);
    assert!((0.005..0.02).contains(&flush.coverage), "{flush:?}");
    assert!((sim.ratio(1) - 1.0).abs() < 0.1, "{}", sim.ratio(1));
    assert!(sim.hooked < 100_000, "{}", sim.hooked);
}

/// What one window sample weighs, for the error of a total that windows
/// gave few samples of: none during the warm-up; after it, 1 / (in-window
/// rate x q), kept for in-use once an interval has no window of its own.
#[test]
#[cfg_attr(
    miri,
    ignore = "a million simulated allocations: slow under Miri; no unsafe code"
)]
fn a_flush_tells_what_one_window_sample_weighs() {
    let mut sim = Sim::new(WindowPolicy::Fixed(0.01), 0.001, 7, 30_000, 1_000);
    sim.allocate(0, 20_000, 50);
    let flush = sim.windows.flush(sim.counter);
    assert_eq!(flush.window_sample_weight, 0.0, "{flush:?}");
    assert_eq!(flush.latest_window_sample_weight, 0.0, "{flush:?}");
    sim.allocate(0, 1_000_000, 50);
    let flush = sim.windows.flush(sim.counter);
    // Inside windows: sample_rate / q, at most 10%.
    let weight = 1.0 / (0.1 * 0.01);
    assert!(
        (flush.window_sample_weight - weight).abs() < 1e-6,
        "{flush:?}"
    );
    assert_eq!(
        flush.latest_window_sample_weight,
        flush.window_sample_weight
    );
    // Restarted: nothing of the last run's windows.
    sim.windows.freeze(sim.counter);
    sim.windows.start(sim.counter, sim.time());
    let flush = sim.windows.flush(sim.counter);
    assert_eq!(flush.latest_window_sample_weight, 0.0, "{flush:?}");
}

#[test]
fn coverage_so_far_is_what_the_next_flush_reports() {
    let mut sim = Sim::new(WindowPolicy::Fixed(0.2), 1.0, 9, 0, 1_000);
    sim.allocate(0, 123_457, 50);
    let so_far = sim.windows.coverage_so_far(sim.counter);
    assert!((0.1..0.3).contains(&so_far), "{so_far}");
    assert_eq!(sim.windows.flush(sim.counter).coverage, so_far);
    // Split across flushes, the coverage adds up.
    let mut on = 0.0;
    for _ in 0..10 {
        sim.allocate(0, 10_000, 50);
        on += sim.windows.flush(sim.counter).coverage * 10_000.0;
    }
    assert!((on / 100_000.0 - 0.2).abs() < 0.05, "{on}");
}

#[test]
fn allocations_after_a_freeze_are_in_no_window() {
    let mut sim = Sim::new(WindowPolicy::Fixed(0.5), 1.0, 11, 0, 1_000);
    sim.allocate(0, 100_000, 50);
    sim.windows.freeze(sim.counter);
    let poll = sim.windows.poll(sim.counter, sim.time());
    assert!(!poll.hook_on);
    sim.apply(poll);
    let estimate = sim.estimate[0];
    sim.allocate(0, 100_000, 50);
    assert_eq!(sim.estimate[0], estimate);
    let flush = sim.windows.flush(sim.counter);
    assert!(
        (flush.coverage - 0.5).abs() < 0.1,
        "counts up to the freeze: {flush:?}"
    );
}

#[test]
fn a_forked_child_draws_its_own_windows() {
    let mut parent = Sim::new(WindowPolicy::Fixed(0.1), 0.3, 13, 0, 1_000);
    let mut child = Sim::new(WindowPolicy::Fixed(0.1), 0.3, 13, 0, 1_000);
    parent.allocate(0, 10_000, 50);
    child.allocate(0, 10_000, 50);
    let counter = child.counter;
    child.windows.start_child_interval(counter, 99);
    child.run_job();
    parent.allocate(0, 200_000, 50);
    child.allocate(0, 200_000, 50);
    assert_ne!(parent.estimate[0], child.estimate[0]);
    assert!((child.estimate[0] / 200_000.0 - 1.0).abs() < 0.2);
}

/// (Found in review: the placeholder block of `new` set a weight.)
#[test]
fn renewed_windows_report_no_window_weight_before_start() {
    let old = Windows::new(WindowPolicy::Fixed(1.0), 1);
    let mut renewed = old.renewed(WindowPolicy::Fixed(0.5), 2);
    let flush = renewed.flush(1_000);
    assert_eq!(flush.latest_window_sample_weight, 0.0, "{flush:?}");
}

/// The block under way before its window: no window has looked at its
/// allocations yet, and the flush says how many (for the errors).
#[test]
fn a_flush_tells_which_allocations_no_window_has_looked_at_yet() {
    let (mut before, mut after) = (0, 0);
    for seed in 0..40 {
        let mut sim = Sim::new(WindowPolicy::Fixed(0.01), 0.001, seed, 0, 1_000);
        sim.allocate(0, 30_000, 50);
        let window_start = sim.windows.block.stretches().0[0].0;
        let in_first_block = sim.windows.block.begin == 0;
        let flush = sim.windows.flush(sim.counter);
        if in_first_block && window_start > 30_000 {
            before += 1;
            assert_eq!(flush.unwindowed_share, 1.0, "seed {seed}: {flush:?}");
            assert_eq!(flush.inuse_unwindowed_share, 1.0, "seed {seed}");
        } else {
            after += 1;
            assert_eq!(flush.unwindowed_share, 0.0, "seed {seed}: {flush:?}");
        }
        // The next interval: still before the window, or not.
        sim.allocate(0, 30_000, 50);
        let flush = sim.windows.flush(sim.counter);
        let window_start = sim.windows.block.stretches().0[0].0;
        if sim.windows.block.begin == 0 && window_start > 60_000 {
            assert_eq!(flush.unwindowed_share, 1.0, "seed {seed}: {flush:?}");
            assert!((flush.inuse_unwindowed_share - 1.0).abs() < 1e-12);
        }
    }
    assert!(before > 0 && after > 0, "{before} {after}");
}

/// Each window costs a few timed polls (each a wake-up of the timer thread
/// and a job: on a machine with no core to spare, as much CPU as a
/// thousand or more hooked allocations): three quarters of the way while
/// the window is far, then by halves until one more would cost more than
/// hooking the rest of the way (`ARM_AHEAD`), about three to five a window
/// at 1M-10M allocations a second (measured on this simulation: 4.6 at 10M,
/// 3.9 at 3.3M, 2.8 at 1M; 7.3, 5.9 and 4.0 with every poll at half the
/// way, 9.2-9.4 when they closed in all the way to the lead).
#[test]
#[cfg_attr(miri, ignore = "statistical and slow under Miri; no unsafe code")]
fn a_window_costs_few_polls() {
    for ns in [100, 300, 1_000] {
        let mut sim = Sim::with_budget(5);
        sim.allocate(0, 2_000_000, ns);
        let _ = sim.windows.flush(sim.counter);
        let polls = sim.timed_polls;
        sim.allocate(0, 20_000_000, ns);
        let flush = sim.windows.flush(sim.counter);
        let per_window = (sim.timed_polls - polls) as f64 / flush.windows as f64;
        assert!(
            per_window < 5.5,
            "{ns} ns an allocation: {per_window} polls a window"
        );
        assert_eq!(flush.missed, 0, "{ns} ns an allocation: {flush:?}");
    }
}

/// A server whose code allocates at speeds that change from one stretch to
/// the next, waits between requests with polls coming due meanwhile, and
/// now and then holds polls back for milliseconds (a GC, a long C call):
/// its polls reach each window with few missed, and few a window.
/// (Measured on this simulation, these 2 seeds: 12.2 polls a window,
/// those that come while it waits included, and 0.13% of allocations
/// missed, against 15.7 and 0.07% with every poll at half the way; with
/// the holds 11.8 and 2.8%, against 14.8 and 2.5%.)
#[test]
#[cfg_attr(miri, ignore = "statistical and slow under Miri; no unsafe code")]
fn a_server_of_changing_speeds_misses_little_for_few_polls() {
    for holds in [false, true] {
        let (mut polls, mut windows, mut missed, mut total) = (0, 0, 0.0, 0);
        for seed in 0..2u64 {
            let mut rng = SmallRng::seed_from_u64(seed + 100);
            let mut sim = Sim::new(WindowPolicy::Budget(100_000.0), 0.01, seed, 10_000, 1_000);
            sim.allocate(0, 20_000, 500);
            let _ = sim.windows.flush(sim.counter);
            let (polls_before, counter_before) = (sim.timed_polls, sim.counter);
            for _ in 0..3_000 {
                let mut left = rng.random_range(5_000..20_000u64);
                while left > 0 {
                    let stretch = rng.random_range(200..3_000u64).min(left);
                    let ns = [150, 400, 700, 1_200][rng.random_range(0..4)];
                    if holds && rng.random_range(0..20) == 0 {
                        sim.no_polls_until = sim.now + rng.random_range(200..5_000u64) * US;
                    }
                    sim.allocate(rng.random_range(0..4), stretch, ns);
                    left -= stretch;
                    if rng.random_range(0..4) == 0 {
                        sim.idle_polled(rng.random_range(50..2_000u64) * US, 20 * US);
                    }
                }
                sim.idle_polled(rng.random_range(100..3_000u64) * US, 20 * US);
            }
            let flush = sim.windows.flush(sim.counter);
            polls += sim.timed_polls - polls_before;
            windows += flush.windows;
            missed += flush.missed_estimate;
            total += sim.counter - counter_before;
        }
        let per_window = polls as f64 / windows as f64;
        let missed = missed / total as f64;
        let (most_polls, most_missed) = if holds { (13.0, 0.032) } else { (13.5, 0.0025) };
        assert!(
            per_window < most_polls && missed < most_missed,
            "holds {holds}: {per_window} polls a window, {missed} missed"
        );
    }
}
