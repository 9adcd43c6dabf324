//! The tracked live objects, grouped by the stack that allocated them, for
//! a retention report (lib/memprofiler_pprof_rs/retention.rb).
//!
//! Only for the throwaway child process a retention report forks, with GC
//! off (`heap::GcOff::after_full_gc`) from a full GC until the objects are
//! in Ruby arrays: a GC in between could free a listed object, and a lazy
//! sweep left pending could free one later, while the report holds it.
//! GVL held, outside GC, never from a hook.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::ruby::classes::is_visible_object;
use crate::ruby::convert::object_value;
use crate::ruby::errors::RbResult;
use crate::ruby::frames::resolve_frames;
use crate::ruby::gvl::{current_thread, GvlHolds};
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
    /// Up to the asked-for number of its sampled objects (those Ruby code
    /// may be handed: not Ruby's internal or hidden objects).
    pub objects: Vec<ObjectAddress>,
}

pub struct LiveSites {
    pub sites: Vec<LiveSite>,
    /// A name for every frame the sites hold.
    pub frame_names: FastHashMap<FrameRef, FrameInfo>,
}

impl Collector {
    /// Every stack with tracked live samples, with up to `per_stack` of
    /// their objects. Light mode first forgets the samples whose objects
    /// died (which calls Ruby; with GC off, no object is freed meanwhile).
    pub fn live_sites(&self, per_stack: usize) -> RbResult<LiveSites> {
        self.forget_dead_samples()?;
        let (mut by_stack, frames) = self.with_sampler(|s| {
            let mut by_stack: FastHashMap<StackId, LiveSite> = FastHashMap::default();
            for sample in s.state.live_samples() {
                let site = by_stack.entry(sample.stack).or_insert_with(|| LiveSite {
                    frames: s.state.stacks().frames(sample.stack),
                    objects_estimate: 0.0,
                    bytes_estimate: 0.0,
                    objects: Vec::new(),
                });
                site.objects_estimate += sample.weight;
                site.bytes_estimate += sample.weight * sample.size as f64;
                // SAFETY: a tracked live object (light mode has just
                // forgotten the dead; exact mode's FREEOBJ hook has), and
                // with GC off it stays one.
                let visible = unsafe { is_visible_object(object_value(sample.object)) };
                if site.objects.len() < per_stack && visible {
                    site.objects.push(sample.object);
                }
            }
            let mut frame_names: FastHashMap<FrameRef, FrameInfo> = FastHashMap::default();
            for site in by_stack.values() {
                for frame in site.frames.iter() {
                    if let Some(info) = s.state.stacks().resolved_info(frame.frame) {
                        frame_names.insert(frame.frame, info.clone());
                    }
                }
            }
            let frames: FastHashMap<StackId, Arc<[Frame]>> = by_stack
                .iter()
                .map(|(&id, site)| (id, site.frames.clone()))
                .collect();
            (by_stack, (frames, frame_names))
        })?;
        let (stacks, mut frame_names) = frames;
        // Naming the frames allocates Ruby strings, which this thread must
        // not sample into the stacks being read.
        self.suppressed_thread
            .store(current_thread(), Ordering::Relaxed);
        let named = resolve_frames(&stacks, None, &mut GvlHolds::new());
        self.suppressed_thread.store(0, Ordering::Relaxed);
        frame_names.extend(named?);
        let mut sites: Vec<LiveSite> = by_stack.drain().map(|(_, site)| site).collect();
        sites.sort_by(|a, b| b.bytes_estimate.total_cmp(&a.bytes_estimate));
        Ok(LiveSites { sites, frame_names })
    }
}
