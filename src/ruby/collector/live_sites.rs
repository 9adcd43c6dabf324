//! The tracked live objects, grouped by the stack that allocated them, for
//! a retention report (lib/memprofiler_pprof_rs/retention.rb).
//!
//! Meant for the child process a retention report forks, which keeps GC
//! off for its whole life; safe anywhere with GC off (`heap::GcOff`): with
//! no GC under way nothing is garbage waiting for a sweep, and with GC off
//! no object is freed unless Ruby code runs GC.start. So the frames are
//! named first (Ruby calls), and from listing the objects until they are in
//! Ruby arrays no Ruby code runs. GVL held, outside GC, never from a hook.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::ruby::classes::is_visible_object;
use crate::ruby::convert::object_value;
use crate::ruby::errors::RbResult;
use crate::ruby::frames::resolve_frames;
use crate::ruby::gvl::{current_thread, GvlHolds};
use crate::ruby::heap::GcOff;
use sampler::fast_hash::FastHashMap;
use sampler::stack_table::{Frame, FrameInfo, StackId};
use sampler::types::{FrameRef, ObjectAddress};

use super::Collector;

/// The live samples of one stack.
pub struct LiveSite {
    /// Leaf first.
    pub frames: Arc<[Frame]>,
    /// How many live objects and bytes its samples stand for.
    pub objects_estimate: f64,
    pub bytes_estimate: f64,
    /// How many samples those estimates rest on.
    pub samples: usize,
    /// Up to the asked-for number of its sampled objects (those Ruby code
    /// may be handed: not Ruby's internal or hidden objects).
    pub objects: Vec<ObjectAddress>,
}

impl Collector {
    /// Names for the frames of every stack with tracked live samples.
    /// Calls Ruby (which may let other threads run).
    pub fn live_frame_names(&self) -> RbResult<FastHashMap<FrameRef, FrameInfo>> {
        let (stacks, mut names) = self.with_sampler(|s| {
            let mut stacks: FastHashMap<StackId, Arc<[Frame]>> = FastHashMap::default();
            let mut names: FastHashMap<FrameRef, FrameInfo> = FastHashMap::default();
            for sample in s.state.live_samples() {
                stacks.entry(sample.stack).or_insert_with(|| {
                    let frames = s.state.stacks().frames(sample.stack);
                    for frame in frames.iter() {
                        if let Some(info) = s.state.stacks().resolved_info(frame.frame) {
                            names.insert(frame.frame, info.clone());
                        }
                    }
                    frames
                });
            }
            (stacks, names)
        })?;
        // Naming the frames allocates Ruby strings, which this thread must
        // not sample into the stacks being read.
        self.suppressed_thread
            .store(current_thread(), Ordering::Relaxed);
        let named = resolve_frames(&stacks, None, &mut GvlHolds::new());
        self.suppressed_thread.store(0, Ordering::Relaxed);
        names.extend(named?);
        Ok(names)
    }

    /// Every stack with tracked live samples, largest estimated bytes
    /// first, with up to `per_stack` of their objects. Light mode first
    /// forgets the samples whose objects died. Runs no Ruby code, so the
    /// addresses stay objects until the caller has them in Ruby arrays.
    pub fn live_sites(&self, per_stack: usize, _gc_off: &GcOff) -> RbResult<Vec<LiveSite>> {
        self.forget_dead_samples()?;
        let mut sites = self.with_sampler(|s| {
            let mut by_stack: FastHashMap<StackId, LiveSite> = FastHashMap::default();
            for sample in s.state.live_samples() {
                let site = by_stack.entry(sample.stack).or_insert_with(|| LiveSite {
                    frames: s.state.stacks().frames(sample.stack),
                    objects_estimate: 0.0,
                    bytes_estimate: 0.0,
                    samples: 0,
                    objects: Vec::new(),
                });
                site.samples += 1;
                site.objects_estimate += sample.weight;
                site.bytes_estimate += sample.weight * sample.size as f64;
                // SAFETY: a tracked live object: exact mode's FREEOBJ hook
                // forgets the freed, light mode has just forgotten them, and
                // with GC off and no GC under way (GcOff) none is garbage
                // waiting for a sweep.
                let visible = unsafe { is_visible_object(object_value(sample.object)) };
                if site.objects.len() < per_stack && visible {
                    site.objects.push(sample.object);
                }
            }
            by_stack.into_values().collect::<Vec<_>>()
        })?;
        sites.sort_by(|a, b| b.bytes_estimate.total_cmp(&a.bytes_estimate));
        Ok(sites)
    }
}
