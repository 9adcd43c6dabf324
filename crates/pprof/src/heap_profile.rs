//! Turns a `FlushSnapshot` into a pprof `Profile` and gzips it.
//!
//! Functions are interned per (frame, file) and locations per (function,
//! line), so each appears once however many samples use it; samples with the
//! same stack are merged into one pprof sample whose values are the sums.

use std::cell::OnceCell;

use sampler::block_frames::{BlockAttribution, FrameCode};
use sampler::fast_hash::FastHashMap;
use sampler::label_sets::{LabelNames, LabelSetId};
use sampler::stack_table::{Frame, StackId};
use sampler::state::FlushSnapshot;
use sampler::types::{ClassRef, FrameRef, TRUNCATION_FRAME};

/// What samples are merged by: stack, class, GC age (live samples only),
/// and the labels they were allocated under.
type SampleKey = (StackId, ClassRef, Option<u32>, LabelSetId);
/// A merged sample: its key and the sums of its four values.
type MergedSample = (SampleKey, [f64; 4]);
use super::function_errors::{FunctionKeys, FunctionSpreadInputs};
use super::gzip::{gzip_bytes, GzipStream};
use super::string_table::StringTable;

pub use sampler::stack_table::FrameInfo;

/// Profile-wide facts that are not in the snapshot.
#[derive(Debug, Clone, Default)]
pub struct ProfileMeta {
    pub time_nanos: i64,
    pub duration_nanos: i64,
    pub sample_rate: f64,
    /// The process the profile describes (the mapping's file name).
    pub program: String,
    pub comments: Vec<String>,
    /// If set, the smallest samples are folded into one "(other)" sample
    /// until the uncompressed profile fits in this many bytes.
    pub max_raw_bytes: Option<usize>,
    /// If set, the same until the profile has at most this many samples,
    /// "(other)" included (Pyroscope refuses more than 16,000).
    pub max_samples: Option<usize>,
    pub sample_labels: SampleLabels,
    /// Allocations sampling windows missed (the hook came on too late):
    /// one sample of their own, "(missed by sampling windows)", since
    /// their sites are unknown.
    pub missed: Option<[f64; 4]>,
    /// Names the label sets samples carry (kept whatever `sample_labels`
    /// says: the app set them on purpose, and their number is bounded).
    pub label_names: LabelNames,
    /// If set, the leading functions' errors go in comments
    /// (pprof/function_errors.rs), estimated with these.
    pub function_spreads: Option<FunctionSpreadInputs>,
}

/// The frame of the sample that stands for allocations windows missed.
pub const MISSED_FRAME: &str = "(missed by sampling windows)";

/// Where a sample's class and GC age go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SampleLabels {
    /// A `class` string label and, on live samples, a `gc_age` number
    /// label: `go tool pprof -tagfocus`, the CLI's `--by class`.
    #[default]
    Keep,
    /// The class as the stack's leaf frame (as async-profiler shows the
    /// allocated class in Java allocation profiles), and no labels.
    /// Grafana Pyroscope makes each distinct string label value a series of
    /// its own: 3,000 classes exceed its default 5,000 active series.
    ClassFrame,
    /// Neither: samples differ by stack only, as in Go's heap profiles.
    Drop,
}

/// Go's heap-profile sample types, in the C gem's slot order.
pub const SAMPLE_TYPES: [(&str, &str); 4] = [
    ("alloc_objects", "count"),
    ("alloc_space", "bytes"),
    ("inuse_objects", "count"),
    ("inuse_space", "bytes"),
];

const MAPPING_ID: u64 = 1;

/// The class of samples merged without one (`SampleLabels::Drop`).
const NO_CLASS: ClassRef = ClassRef(0);

/// Label keys (no '-': Pyroscope rejects it).
pub const CLASS_LABEL: &str = "class";
pub const GC_AGE_LABEL: &str = "gc_age";
pub const GC_AGE_UNIT: &str = "collections";

/// The nearest of `outer` frames that has a file, and the file: where a C
/// method is shown.
fn outer_file<'f>(
    outer: &'f [Frame],
    infos: &[Option<&'f FrameInfo>],
) -> Option<(&'f Frame, &'f str)> {
    outer
        .iter()
        .zip(infos)
        .find_map(|(frame, info)| Some((frame, info.as_ref()?.filename.as_deref()?)))
}

struct ProfileBuilder<'a> {
    frames: &'a FastHashMap<FrameRef, FrameInfo>,
    classes: &'a FastHashMap<ClassRef, String>,
    strings: StringTable,
    /// By (name, file, first line) string indexes and line: a method seen
    /// both as a Ruby frame and, after an earlier flush named it, as a
    /// resolved frame is one function.
    functions: FastHashMap<(i64, i64, i64), u64>,
    locations: FastHashMap<(u64, i64), u64>,
    profile: crate::Profile,
    /// Samples folded into "(other)" by `fold_to_fit`.
    folded: usize,
    /// Names the blocks of methods that have some (see sampler::block_frames).
    blocks: BlockAttribution,
    /// One key per distinct method with blocks (equal frames of one method
    /// can have different handles: a method entry per including class).
    method_keys: FastHashMap<&'a FrameInfo, u32>,
    method_key_of_frame: FastHashMap<FrameRef, u32>,
    /// `stack_locations`' buffer: each position's info.
    infos: Vec<Option<&'a FrameInfo>>,
    /// A frame's function by what names it: the frame, the block of it
    /// that ran (`NO_BLOCK`: none), and for a C method the outer frame
    /// whose file it is shown in (`TRUNCATION_FRAME`, never a named
    /// frame: none, so a Ruby frame's own file, or "(C function)"). Saves
    /// hashing its strings again at every stack it is in.
    function_of_frame: FastHashMap<(FrameRef, usize, FrameRef), u64>,
    /// The last stack's location ids: merged samples come sorted by stack,
    /// and samples of one stack that differ by class, age or labels follow
    /// each other.
    last_stack: Option<(StackId, Vec<u64>)>,
}

/// `function_of_frame`'s key for a frame that ran none of its blocks.
const NO_BLOCK: usize = usize::MAX;

impl<'a> ProfileBuilder<'a> {
    fn new(
        frames: &'a FastHashMap<FrameRef, FrameInfo>,
        classes: &'a FastHashMap<ClassRef, String>,
    ) -> Self {
        ProfileBuilder {
            frames,
            classes,
            strings: StringTable::new(),
            functions: FastHashMap::default(),
            locations: FastHashMap::default(),
            profile: crate::Profile::default(),
            folded: 0,
            blocks: BlockAttribution::default(),
            method_keys: FastHashMap::default(),
            method_key_of_frame: FastHashMap::default(),
            infos: Vec::new(),
            function_of_frame: FastHashMap::default(),
            last_stack: None,
        }
    }

    fn function_id(&mut self, name: &str, filename: &str, start_line: i64) -> u64 {
        let filename_index = self.strings.intern(filename);
        let name = self.strings.intern(name);
        if let Some(&id) = self.functions.get(&(name, filename_index, start_line)) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        self.profile.function.push(crate::Function {
            id,
            name,
            // Left unset: pprof shows system_name when set, and demangling
            // turns labels such as `<main>` into `<unknown>`.
            system_name: 0,
            filename: filename_index,
            start_line,
        });
        self.functions
            .insert((name, filename_index, start_line), id);
        id
    }

    fn location_id(&mut self, function_id: u64, line: i64) -> u64 {
        if let Some(&id) = self.locations.get(&(function_id, line)) {
            return id;
        }
        let id = self.profile.location.len() as u64 + 1;
        self.profile.location.push(crate::Location {
            id,
            mapping_id: MAPPING_ID,
            address: 0,
            line: vec![crate::Line {
                function_id,
                line,
                column: 0,
            }],
            is_folded: false,
        });
        self.locations.insert((function_id, line), id);
        id
    }

    /// Location ids for a stack, leaf first.
    fn stack_locations(&mut self, frames: &[Frame]) -> Vec<u64> {
        if frames.is_empty() {
            // E.g. objects a new thread allocates before its block runs: shown
            // rather than left as a sample with no stack.
            let function = self.function_id("(no Ruby frames)", "", 0);
            return vec![self.location_id(function, 0)];
        }
        let frames = self.without_hidden_main_frame(frames);
        let frames_map = self.frames;
        // Each position's info, looked up once (a stack is walked twice,
        // and a C method's caller is searched for among the outer frames).
        let mut infos = std::mem::take(&mut self.infos);
        infos.clear();
        infos.extend(frames.iter().map(|frame| frames_map.get(&frame.frame)));
        let blocks_ran = self.blocks_ran(frames, &infos);
        let mut ids = Vec::with_capacity(frames.len());
        for (i, frame) in frames.iter().enumerate() {
            let id = if frame.frame == TRUNCATION_FRAME {
                let function = self.function_id("(truncated stack)", "", 0);
                self.location_id(function, 0)
            } else if let Some(info) = infos[i] {
                // A C method: its caller's file and line (the nearest
                // outer frame that has a file).
                let file_from = match info.filename {
                    Some(_) => None,
                    None => outer_file(&frames[i + 1..], &infos[i + 1..]),
                };
                let line = match file_from {
                    Some((outer, _)) => i64::from(outer.line),
                    None if info.filename.is_some() => i64::from(frame.line),
                    None => 0,
                };
                let block_index = blocks_ran.get(i).copied().flatten();
                let key = (
                    frame.frame,
                    block_index.unwrap_or(NO_BLOCK),
                    file_from.map_or(TRUNCATION_FRAME, |(outer, _)| outer.frame),
                );
                let function = match self.function_of_frame.get(&key) {
                    Some(&function) => function,
                    None => {
                        let filename = info
                            .filename
                            .as_deref()
                            .or(file_from.map(|(_, file)| file))
                            .unwrap_or("(C function)");
                        let block = block_index
                            .zip(info.blocks.as_deref())
                            .map(|(index, blocks)| blocks.block(index));
                        let function = match block {
                            Some(block) => {
                                self.function_id(&block.name, filename, block.start_line)
                            }
                            None => self.function_id(&info.name, filename, info.start_line),
                        };
                        self.function_of_frame.insert(key, function);
                        function
                    }
                };
                self.location_id(function, line)
            } else {
                let function = self.function_id("(unknown frame)", "", 0);
                self.location_id(function, 0)
            };
            ids.push(id);
        }
        self.infos = infos;
        ids
    }

    /// For each frame of a stack, the block of its method that ran there
    /// (see sampler::block_frames); empty if no frame's method has blocks.
    fn blocks_ran(
        &mut self,
        frames: &[Frame],
        infos: &[Option<&'a FrameInfo>],
    ) -> Vec<Option<usize>> {
        if !infos.iter().flatten().any(|info| info.blocks.is_some()) {
            return Vec::new();
        }
        let codes: Vec<FrameCode> = frames
            .iter()
            .zip(infos)
            .map(|(frame, info)| FrameCode {
                method: info.and_then(|info| {
                    let blocks = info.blocks.as_deref()?;
                    Some((self.method_key(frame.frame, info), blocks))
                }),
                line: frame.line,
            })
            .collect();
        self.blocks.attribute(&codes).to_vec()
    }

    /// The key of `info`'s method: the same for every handle of one method
    /// (a method entry per including class), hashed once per handle.
    fn method_key(&mut self, frame: FrameRef, info: &'a FrameInfo) -> u32 {
        if let Some(&key) = self.method_key_of_frame.get(&frame) {
            return key;
        }
        let next = self.method_keys.len() as u32;
        let key = *self.method_keys.entry(info).or_insert(next);
        self.method_key_of_frame.insert(frame, key);
        key
    }

    /// rb_profile_frames reports, under the main script's `<main>`, the
    /// script's top frame at line 0, which Ruby's own backtraces never show:
    /// it would only add a second `<main>` root to every stack.
    fn without_hidden_main_frame<'f>(&self, frames: &'f [Frame]) -> &'f [Frame] {
        match frames.split_last() {
            Some((outermost, inner)) if !inner.is_empty() && outermost.line == 0 => {
                let is_main = |frame: &Frame| {
                    self.frames
                        .get(&frame.frame)
                        .is_some_and(|info| info.name == "<main>")
                };
                if is_main(outermost) && inner.last().is_some_and(is_main) {
                    inner
                } else {
                    frames
                }
            }
            _ => frames,
        }
    }

    /// Builds everything but the samples into `self.profile`; each of
    /// `samples` goes to `emit` as soon as it is made, so a caller can
    /// encode it and drop it rather than hold every sample's location list
    /// at once. `folded` (how many samples, and their sums) becomes one
    /// "(other)" sample.
    fn build<'s>(
        mut self,
        snapshot: &FlushSnapshot,
        meta: &ProfileMeta,
        samples: impl IntoIterator<Item = &'s MergedSample>,
        folded: Option<(usize, [f64; 4])>,
        function_comments: &OnceCell<Vec<String>>,
        mut emit: impl FnMut(crate::Sample),
    ) -> crate::Profile {
        for (name, unit) in SAMPLE_TYPES {
            let value_type = crate::ValueType {
                r#type: self.strings.intern(name),
                unit: self.strings.intern(unit),
            };
            self.profile.sample_type.push(value_type);
        }

        // Interned only when used: a profile without labels names none.
        let (class_key, age_key, age_unit) = if meta.sample_labels == SampleLabels::Keep {
            (
                self.strings.intern(CLASS_LABEL),
                self.strings.intern(GC_AGE_LABEL),
                self.strings.intern(GC_AGE_UNIT),
            )
        } else {
            (0, 0, 0)
        };
        let mut function_keys = FunctionKeys::default();
        for &((stack, class, gc_age, labels), sums) in samples {
            let Some(frames) = snapshot.stacks.get(&stack) else {
                continue;
            };
            let mut location_id = match &self.last_stack {
                Some((last, ids)) if *last == stack => ids.clone(),
                _ => {
                    let ids = self.stack_locations(frames);
                    self.last_stack = Some((stack, ids.clone()));
                    ids
                }
            };
            if meta.function_spreads.is_some() && function_comments.get().is_none() {
                function_keys.add_stack(stack, &location_id, &self.profile, &self.strings);
            }
            let class_name = self
                .classes
                .get(&class)
                .map(String::as_str)
                .unwrap_or("(unknown class)");
            let mut label = Vec::new();
            match meta.sample_labels {
                SampleLabels::Keep => label.push(crate::Label {
                    key: class_key,
                    str: self.strings.intern(class_name),
                    num: 0,
                    num_unit: 0,
                }),
                SampleLabels::ClassFrame => {
                    let function = self.function_id(class_name, "", 0);
                    location_id.insert(0, self.location_id(function, 0));
                }
                SampleLabels::Drop => {}
            }
            if let Some(age) = gc_age {
                label.push(crate::Label {
                    key: age_key,
                    str: 0,
                    num: i64::from(age),
                    num_unit: age_unit,
                });
            }
            for (key, value) in meta
                .label_names
                .get(labels)
                .into_iter()
                .flat_map(|set| set.iter())
            {
                label.push(crate::Label {
                    key: self.strings.intern(key),
                    str: self.strings.intern(value),
                    num: 0,
                    num_unit: 0,
                });
            }
            emit(crate::Sample {
                location_id,
                value: sums.iter().map(|v| v.round() as i64).collect(),
                label,
            });
        }

        if let Some((count, sums)) = folded {
            let function = self.function_id("(other)", "", 0);
            let location_id = vec![self.location_id(function, 0)];
            let mut label = Vec::new();
            if meta.sample_labels == SampleLabels::Keep {
                label.push(crate::Label {
                    key: class_key,
                    str: self.strings.intern("(other)"),
                    num: 0,
                    num_unit: 0,
                });
            }
            emit(crate::Sample {
                location_id,
                value: sums.iter().map(|v| v.round() as i64).collect(),
                label,
            });
            self.folded = count;
        }

        if let Some(values) = meta.missed {
            let function = self.function_id(MISSED_FRAME, "", 0);
            let location_id = vec![self.location_id(function, 0)];
            emit(crate::Sample {
                location_id,
                value: values.iter().map(|v| v.round() as i64).collect(),
                label: Vec::new(),
            });
        }

        let program = if meta.program.is_empty() {
            "ruby"
        } else {
            meta.program.as_str()
        };
        self.profile.mapping.push(crate::Mapping {
            id: MAPPING_ID,
            memory_start: 0,
            memory_limit: 0,
            file_offset: 0,
            filename: self.strings.intern(program),
            build_id: 0,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: false,
        });

        self.profile.time_nanos = meta.time_nanos;
        self.profile.duration_nanos = meta.duration_nanos;
        self.profile.period_type = Some(crate::ValueType {
            r#type: self.strings.intern("space"),
            unit: self.strings.intern("bytes"),
        });
        self.profile.period = if meta.sample_rate > 0.0 {
            (1.0 / meta.sample_rate).round() as i64
        } else {
            0
        };
        let mut comments = vec![format!(
            "memprofiler_pprof_rs: sample_rate={}; one object in {} sampled on average, values scaled by 1/sample_rate; period is that number of objects",
            meta.sample_rate, self.profile.period
        )];
        comments.extend(meta.comments.iter().cloned());
        if let Some(inputs) = meta.function_spreads {
            let class_leaf = meta.sample_labels == SampleLabels::ClassFrame;
            let lines = function_comments.get_or_init(|| {
                function_keys.comments(snapshot, self.classes, class_leaf, inputs, meta.missed)
            });
            comments.extend(lines.iter().cloned());
        }
        if self.folded > 0 {
            let limits: Vec<String> = [
                meta.max_raw_bytes.map(|max| format!("{max} bytes")),
                meta.max_samples.map(|max| format!("{max} samples")),
            ]
            .into_iter()
            .flatten()
            .collect();
            comments.push(format!(
                "{} samples (the smallest) folded into one (other) sample to keep the profile within {}; totals unchanged",
                self.folded,
                limits.join(" and ")
            ));
        }
        for comment in comments {
            let index = self.strings.intern(&comment);
            self.profile.comment.push(index);
        }
        self.profile.default_sample_type = self.strings.intern("inuse_space");
        self.profile.string_table = self.strings.into_strings();
        self.profile
    }
}

/// The snapshot's samples merged by what the profile tells apart: the
/// stack, and the class (by name: classes of one name, such as anonymous
/// ones or a reloaded constant's, look alike) and GC age as `sample_labels`
/// says. Sorted for a deterministic profile.
fn merge_samples(
    snapshot: &FlushSnapshot,
    classes: &FastHashMap<ClassRef, String>,
    sample_labels: SampleLabels,
) -> Vec<MergedSample> {
    // Each class to the smallest handle of its name.
    let mut by_name: FastHashMap<&str, ClassRef> = FastHashMap::default();
    for (&class, name) in classes {
        let first = by_name.entry(name.as_str()).or_insert(class);
        *first = (*first).min(class);
    }
    let canonical = |class: ClassRef| {
        classes
            .get(&class)
            .and_then(|name| by_name.get(name.as_str()))
            .copied()
            .unwrap_or(class)
    };
    let mut merged: FastHashMap<SampleKey, [f64; 4]> = FastHashMap::default();
    for sample in &snapshot.samples {
        let key = match sample_labels {
            SampleLabels::Keep => (
                sample.stack,
                canonical(sample.class),
                sample.gc_age,
                sample.labels,
            ),
            SampleLabels::ClassFrame => {
                (sample.stack, canonical(sample.class), None, sample.labels)
            }
            SampleLabels::Drop => (sample.stack, NO_CLASS, None, sample.labels),
        };
        let sums = merged.entry(key).or_insert([0.0; 4]);
        for (sum, value) in sums.iter_mut().zip(sample.values) {
            *sum += value;
        }
    }
    let mut merged: Vec<_> = merged.into_iter().collect();
    merged.sort_by_key(|(key, _)| *key);
    merged
}

/// A profile's merged samples and the order they are folded into
/// "(other)" in: the fewest bytes (alloc_space + inuse_space) first, ties
/// in profile order.
struct Folding<'m> {
    merged: &'m [MergedSample],
    order: Vec<usize>,
}

impl<'m> Folding<'m> {
    fn new(merged: &'m [MergedSample]) -> Self {
        let mut order: Vec<usize> = (0..merged.len()).collect();
        let size = |i: usize| merged[i].1[1] + merged[i].1[3];
        order.sort_by(|&a, &b| size(a).total_cmp(&size(b)).then(a.cmp(&b)));
        Folding { merged, order }
    }

    /// The samples kept with the first `count` of the order folded, in
    /// profile order, and (how many, their sums) for one "(other)" sample.
    fn fold(&self, count: usize) -> (Vec<&'m MergedSample>, Option<(usize, [f64; 4])>) {
        if count == 0 {
            return (self.merged.iter().collect(), None);
        }
        let mut folded = vec![false; self.merged.len()];
        let mut sums = [0.0; 4];
        for &index in &self.order[..count] {
            folded[index] = true;
            for (sum, value) in sums.iter_mut().zip(&self.merged[index].1) {
                *sum += value;
            }
        }
        let kept = self
            .merged
            .iter()
            .zip(folded)
            .filter_map(|(sample, folded)| (!folded).then_some(sample))
            .collect();
        (kept, Some((count, sums)))
    }

    /// The fewest samples to fold for at most `meta.max_samples` samples,
    /// "(other)" included.
    fn min_count(&self, meta: &ProfileMeta) -> usize {
        let n = self.merged.len();
        match meta.max_samples {
            Some(max) if n > max => n - max.max(1) + 1,
            _ => 0,
        }
    }
}

/// Measuring builds of a profile a flush may make, when its first build is
/// over `max_raw_bytes`, to find how many samples to fold (each a full
/// build without gzip).
const MAX_SIZE_MEASUREMENTS: usize = 10;

/// What names a profile's frames and classes.
struct Names<'t> {
    frames: &'t FastHashMap<FrameRef, FrameInfo>,
    classes: &'t FastHashMap<ClassRef, String>,
    /// The functions' error comments, worked out by the first build (over
    /// every sample) and reused by the builds that fold some.
    function_comments: OnceCell<Vec<String>>,
}

impl Names<'_> {
    /// Builds the profile with `count` samples folded, giving `write` its
    /// encoding piece by piece: each sample as it is made, then the rest.
    fn encode(
        &self,
        snapshot: &FlushSnapshot,
        meta: &ProfileMeta,
        folding: &Folding,
        count: usize,
        mut write: impl FnMut(&[u8]),
    ) {
        let (kept, folded) = folding.fold(count);
        let mut buffer = Vec::new();
        let builder = ProfileBuilder::new(self.frames, self.classes);
        let comments = &self.function_comments;
        let profile = builder.build(snapshot, meta, kept, folded, comments, |sample| {
            buffer.clear();
            prost::encoding::message::encode(PROFILE_SAMPLE_FIELD, &sample, &mut buffer);
            write(&buffer);
        });
        buffer.clear();
        prost::Message::encode(&profile, &mut buffer).expect("a Vec grows as needed");
        write(&buffer);
    }

    fn measured_len(
        &self,
        snapshot: &FlushSnapshot,
        meta: &ProfileMeta,
        folding: &Folding,
        count: usize,
    ) -> usize {
        let mut len = 0;
        self.encode(snapshot, meta, folding, count, |bytes| len += bytes.len());
        len
    }

    /// How many samples to fold (the first of `folding`'s order) so that
    /// the profile fits in `max_bytes`, when folding `too_big` leaves it
    /// `too_big_len` bytes, more than that.
    ///
    /// Sizes are measured, not estimated: a profile's tables (functions,
    /// locations, strings) can outweigh its samples, and only a build tells
    /// how much folding a sample saves. An estimate made before (3 bytes a
    /// location, every frame's names counted once per frame) was several
    /// times too high with many methods: 8,000 methods in 5-frame stacks,
    /// 2.4 MB, folded into one "(other)" sample under a 2 MB limit.
    ///
    /// The count is searched between one that is too large and one that
    /// fits, by interpolation and halving in turn, to within 1/256 of the
    /// samples or MAX_SIZE_MEASUREMENTS builds; it errs on folding more.
    /// Folding everything is the smallest profile there is, taken even if it
    /// does not fit.
    fn fold_count_to_fit(
        &self,
        snapshot: &FlushSnapshot,
        meta: &ProfileMeta,
        folding: &Folding,
        (mut too_big, mut too_big_len): (usize, usize),
        max_bytes: usize,
    ) -> usize {
        let n = folding.merged.len();
        if too_big == n {
            return n;
        }
        let measure = |count| self.measured_len(snapshot, meta, folding, count);
        let (mut fits, mut fits_len) = (n, measure(n));
        if fits_len > max_bytes {
            return n;
        }
        for step in 0..MAX_SIZE_MEASUREMENTS {
            if fits - too_big <= (n / 256).max(1) {
                break;
            }
            let guess = if step % 2 == 0 {
                let share =
                    (too_big_len - max_bytes) as f64 / (too_big_len - fits_len).max(1) as f64;
                too_big + ((fits - too_big) as f64 * share).ceil() as usize
            } else {
                too_big + (fits - too_big) / 2
            };
            let count = guess.clamp(too_big + 1, fits - 1);
            let len = measure(count);
            if len <= max_bytes {
                (fits, fits_len) = (count, len);
            } else {
                (too_big, too_big_len) = (count, len);
            }
        }
        fits
    }

    /// How many samples to fold for `meta.max_samples` and
    /// `meta.max_raw_bytes`.
    fn fold_count(&self, snapshot: &FlushSnapshot, meta: &ProfileMeta, folding: &Folding) -> usize {
        let min_count = folding.min_count(meta);
        let Some(max_bytes) = meta.max_raw_bytes else {
            return min_count;
        };
        let len = self.measured_len(snapshot, meta, folding, min_count);
        if len <= max_bytes {
            return min_count;
        }
        self.fold_count_to_fit(snapshot, meta, folding, (min_count, len), max_bytes)
    }
}

/// Builds the profile for a flush. `frames` must describe every frame of
/// every stack in the snapshot (a missing one shows as "(unknown frame)").
/// `classes` names every class handle (a missing one shows as
/// "(unknown class)").
pub fn build_profile(
    snapshot: &FlushSnapshot,
    frames: &FastHashMap<FrameRef, FrameInfo>,
    classes: &FastHashMap<ClassRef, String>,
    meta: &ProfileMeta,
) -> crate::Profile {
    let merged = merge_samples(snapshot, classes, meta.sample_labels);
    let folding = Folding::new(&merged);
    let names = Names {
        frames,
        classes,
        function_comments: OnceCell::new(),
    };
    let count = names.fold_count(snapshot, meta, &folding);
    let (kept, folded) = folding.fold(count);
    let mut samples = Vec::new();
    let mut profile = ProfileBuilder::new(frames, classes).build(
        snapshot,
        meta,
        kept,
        folded,
        &names.function_comments,
        |sample| samples.push(sample),
    );
    profile.sample = samples;
    profile
}

/// Field number of `Profile.sample` in profile.proto.
const PROFILE_SAMPLE_FIELD: u32 = 2;

/// `build_profile` then `encode_gzipped`, the same bytes, but each sample
/// is encoded into the gzip stream as soon as it is built: a flush of
/// 200,000 samples with deep stacks no longer holds every sample's location
/// list (hundreds of bytes each) at once. Protobuf lets a message's fields
/// come in any order, so the samples go first and the tables they filled
/// (locations, functions, strings) after them.
///
/// With `meta.max_raw_bytes`, the first build is kept (up to that many
/// bytes) and gzipped if it fits: a profile under the limit is built once.
/// Only one over it is measured again (see `Names::fold_count_to_fit`).
///
/// Returns the gzipped bytes and how many samples were folded into
/// "(other)" to respect `meta.max_raw_bytes` and `meta.max_samples`.
pub fn build_profile_gzipped(
    snapshot: &FlushSnapshot,
    frames: &FastHashMap<FrameRef, FrameInfo>,
    classes: &FastHashMap<ClassRef, String>,
    meta: &ProfileMeta,
) -> (Vec<u8>, usize) {
    let names = Names {
        frames,
        classes,
        function_comments: OnceCell::new(),
    };
    let merged = merge_samples(snapshot, classes, meta.sample_labels);
    let folding = Folding::new(&merged);
    let min_count = folding.min_count(meta);
    let count = match meta.max_raw_bytes {
        None => min_count,
        Some(max_bytes) => {
            let (mut raw, mut len) = (Vec::new(), 0);
            names.encode(snapshot, meta, &folding, min_count, |bytes| {
                len += bytes.len();
                if len <= max_bytes {
                    raw.extend_from_slice(bytes);
                }
            });
            if len <= max_bytes {
                return (gzip_bytes(&raw), min_count);
            }
            drop(raw);
            names.fold_count_to_fit(snapshot, meta, &folding, (min_count, len), max_bytes)
        }
    };
    let mut out = GzipStream::new();
    names.encode(snapshot, meta, &folding, count, |bytes| {
        out.write_raw(bytes)
    });
    let (gz, _) = out.finish();
    (gz, count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode_gzipped;
    use flate2::read::GzDecoder;
    use prost::Message;
    use sampler::gaps::GapSampler;
    use sampler::label_sets::LabelSets;
    use sampler::state::{ObjectInfo, SamplerState};
    use sampler::types::ObjectAddress;
    use std::io::Read;

    fn info(name: &str, file: Option<&str>, start_line: i64) -> FrameInfo {
        FrameInfo {
            name: name.into(),
            filename: file.map(Into::into),
            start_line,
            blocks: None,
        }
    }

    fn frame(frame: u64, line: i32) -> Frame {
        Frame {
            frame: FrameRef(frame),
            line,
        }
    }

    /// Records a sampled allocation of `object` with `stack` (weight 1).
    fn record(state: &mut SamplerState, object: usize, stack: &[Frame]) {
        let admission = state.admission(1.0);
        state.record_allocation(
            ObjectAddress(object),
            ObjectInfo::default(),
            stack,
            admission,
        );
    }

    /// A profile with two samples of one stack, one of another, and a C frame.
    fn example() -> (FlushSnapshot, FastHashMap<FrameRef, FrameInfo>) {
        // leaf first: String#* (C) called from Foo#bar:12, called from <main>:30
        let leaf_c = [frame(24, 0), frame(8, 12), frame(16, 30)];
        let plain = [frame(8, 14), frame(16, 30)];
        (snapshot_of(&[&leaf_c, &leaf_c, &plain]), example_frames())
    }

    /// One 40-byte sample allocated at each stack, all still alive.
    fn snapshot_of(stacks: &[&[Frame]]) -> FlushSnapshot {
        let mut state = SamplerState::new(GapSampler::new(1.0, 1), 100, 100);
        for (i, stack) in stacks.iter().enumerate() {
            record(&mut state, 0x1000 + i * 40, stack);
        }
        state.measure_pending(|_| Some(40));
        state.take_snapshot(0, |_| Some(40))
    }

    /// `example`'s frames: Foo#bar and <main> in app.rb, String#* in C.
    fn example_frames() -> FastHashMap<FrameRef, FrameInfo> {
        let mut frames = FastHashMap::default();
        frames.insert(FrameRef(8), info("Foo#bar", Some("app.rb"), 10));
        frames.insert(FrameRef(16), info("<main>", Some("app.rb"), 1));
        frames.insert(FrameRef(24), info("String#*", None, 0));
        frames
    }

    fn classes() -> FastHashMap<ClassRef, String> {
        let mut classes = FastHashMap::default();
        classes.insert(ClassRef(0), "String".to_string());
        classes
    }

    fn meta() -> ProfileMeta {
        ProfileMeta {
            max_raw_bytes: None,
            max_samples: None,
            time_nanos: 1_700_000_000_000_000_000,
            duration_nanos: 5_000_000_000,
            sample_rate: 1.0,
            program: "ruby".into(),
            comments: vec![],
            sample_labels: SampleLabels::Keep,
            missed: None,
            label_names: LabelNames::default(),
            function_spreads: None,
        }
    }

    /// One stack; two Strings and an Array allocated there, the Array and
    /// one String still alive, at different GC ages.
    fn two_classes() -> (
        FlushSnapshot,
        FastHashMap<FrameRef, FrameInfo>,
        FastHashMap<ClassRef, String>,
    ) {
        let mut state = SamplerState::new(GapSampler::new(1.0, 1), 100, 100);
        let stack = [frame(8, 12), frame(16, 30)];
        for (i, (class, gc_count)) in [(1, 0), (1, 3), (2, 5)].into_iter().enumerate() {
            let admission = state.admission(1.0);
            let info = ObjectInfo::new(ClassRef(class), gc_count);
            state.record_allocation(ObjectAddress(0x1000 + i * 40), info, &stack, admission);
        }
        state.measure_pending(|_| Some(40));
        // The first String is freed.
        assert!(state.record_free(ObjectAddress(0x1000)));
        let snapshot = state.take_snapshot(9, |_| Some(40));
        let mut frames = FastHashMap::default();
        frames.insert(FrameRef(8), info("Foo#bar", Some("app.rb"), 10));
        frames.insert(FrameRef(16), info("<main>", Some("app.rb"), 1));
        let classes = [
            (ClassRef(1), "String".to_string()),
            (ClassRef(2), "Array".to_string()),
        ]
        .into_iter()
        .collect();
        (snapshot, frames, classes)
    }

    /// `two_classes`' profile with the class and age placed as asked.
    fn two_classes_profile(sample_labels: SampleLabels) -> crate::Profile {
        let (snapshot, frames, classes) = two_classes();
        let meta = ProfileMeta {
            sample_labels,
            ..meta()
        };
        build_profile(&snapshot, &frames, &classes, &meta)
    }

    /// The leading functions' errors, by the names `top` shows: the leaf
    /// (or, with the class as a frame, the class) flat, every function cum.
    #[test]
    fn functions_errors_name_the_rows_top_shows() {
        use crate::function_errors::parse_function_errors;
        for (sample_labels, flat_leaf) in [
            (SampleLabels::Keep, "Foo#bar"),
            (SampleLabels::ClassFrame, "String"),
        ] {
            let (snapshot, frames, classes) = two_classes();
            let with_errors = ProfileMeta {
                sample_labels,
                function_spreads: Some(FunctionSpreadInputs::default()),
                ..meta()
            };
            let profile = build_profile(&snapshot, &frames, &classes, &with_errors);
            let comments: Vec<String> = profile
                .comment
                .iter()
                .map(|&i| string(&profile, i).to_string())
                .collect();
            let errors = parse_function_errors(&comments);
            // Sampled at rate 1: exact.
            assert_eq!(errors[flat_leaf][0], [Some(0.0), Some(0.0)], "{comments:?}");
            // On every stack: the spine, whose error is the total's.
            assert!(!errors.contains_key("<main>"), "{comments:?}");
            if sample_labels == SampleLabels::ClassFrame {
                assert!(!errors.contains_key("Foo#bar"), "{comments:?}");
                assert_eq!(errors["Array"][3], [Some(0.0), Some(0.0)]);
            }
            let without = build_profile(
                &snapshot,
                &frames,
                &classes,
                &ProfileMeta {
                    sample_labels,
                    ..meta()
                },
            );
            assert_eq!(without.comment.len() + errors.len(), profile.comment.len());
        }
    }

    /// (stack as function names, values, label count) of each sample.
    fn samples_of(profile: &crate::Profile) -> Vec<(Vec<String>, Vec<i64>, usize)> {
        let mut samples: Vec<_> = profile
            .sample
            .iter()
            .map(|s| (function_names(profile, s), s.value.clone(), s.label.len()))
            .collect();
        samples.sort();
        samples
    }

    fn string(profile: &crate::Profile, index: i64) -> &str {
        &profile.string_table[index as usize]
    }

    fn function_names(profile: &crate::Profile, sample: &crate::Sample) -> Vec<String> {
        sample
            .location_id
            .iter()
            .map(|id| {
                let location = &profile.location[*id as usize - 1];
                let function = &profile.function[location.line[0].function_id as usize - 1];
                format!(
                    "{}@{}:{}",
                    string(profile, function.name),
                    string(profile, function.filename),
                    location.line[0].line
                )
            })
            .collect()
    }

    #[test]
    fn sample_types_and_defaults_are_go_heap_profile_shape() {
        let (snapshot, frames) = example();
        let profile = build_profile(&snapshot, &frames, &classes(), &meta());
        let types: Vec<_> = profile
            .sample_type
            .iter()
            .map(|t| (string(&profile, t.r#type), string(&profile, t.unit)))
            .collect();
        assert_eq!(types, SAMPLE_TYPES.to_vec());
        assert_eq!(string(&profile, profile.default_sample_type), "inuse_space");
        let period_type = profile.period_type.as_ref().expect("period type");
        assert_eq!(string(&profile, period_type.r#type), "space");
        assert_eq!(profile.period, 1);
        assert_eq!(profile.string_table[0], "");
        assert_eq!(profile.mapping.len(), 1);
        assert_eq!(profile.duration_nanos, 5_000_000_000);
    }

    #[test]
    fn allocations_windows_missed_are_one_sample_of_their_own() {
        let (snapshot, frames) = example();
        let with_missed = ProfileMeta {
            missed: Some([500.0, 20_000.0, 0.0, 0.0]),
            ..meta()
        };
        let profile = build_profile(&snapshot, &frames, &classes(), &with_missed);
        let missed: Vec<_> = profile
            .sample
            .iter()
            .filter(|s| function_names(&profile, s) == [format!("{MISSED_FRAME}@:0")])
            .collect();
        assert_eq!(missed.len(), 1);
        assert_eq!(missed[0].value, vec![500, 20_000, 0, 0]);
        let without = build_profile(&snapshot, &frames, &classes(), &meta());
        assert_eq!(without.sample.len() + 1, profile.sample.len());
    }

    #[test]
    fn samples_with_the_same_stack_are_merged_and_frames_resolved() {
        let (snapshot, frames) = example();
        let profile = build_profile(&snapshot, &frames, &classes(), &meta());
        // Two stacks, each as an allocation sample and an in-use sample (the
        // latter carries the gc_age label, so they are not merged).
        assert_eq!(profile.sample.len(), 4);
        let c_leaf: Vec<_> = profile
            .sample
            .iter()
            .filter(|s| s.location_id.len() == 3)
            .collect();
        let values: Vec<_> = c_leaf.iter().map(|s| s.value.clone()).collect();
        assert_eq!(values, vec![vec![2, 80, 0, 0], vec![0, 0, 2, 80]]);
        let merged = c_leaf[0];
        assert_eq!(
            function_names(&profile, merged),
            vec![
                "String#*@app.rb:12",
                "Foo#bar@app.rb:12",
                "<main>@app.rb:30"
            ]
        );
        // Foo#bar appears once as a function, with two locations (lines 12, 14).
        let foo_functions = profile
            .function
            .iter()
            .filter(|f| string(&profile, f.name) == "Foo#bar")
            .count();
        assert_eq!(foo_functions, 1);
        assert_eq!(profile.location.len(), 4);
        assert!(profile.function.iter().all(|f| f.system_name == 0));
    }

    #[test]
    fn a_c_method_is_named_at_its_caller_in_each_stack() {
        // One C method under two callers in two files, and under one caller
        // at two lines: names are looked up once per frame, but the file
        // and line stay each stack's own.
        let snapshot = snapshot_of(&[
            &[frame(24, 0), frame(8, 12), frame(16, 30)],
            &[frame(24, 0), frame(32, 5), frame(16, 31)],
            &[frame(24, 0), frame(8, 14), frame(16, 30)],
        ]);
        let mut frames = example_frames();
        frames.insert(FrameRef(32), info("Baz#qux", Some("lib.rb"), 3));
        let profile = build_profile(&snapshot, &frames, &classes(), &meta());
        let mut leaves: Vec<String> = profile
            .sample
            .iter()
            .filter(|s| s.value[0] > 0)
            .map(|s| function_names(&profile, s)[..2].join(" <- "))
            .collect();
        leaves.sort();
        assert_eq!(
            leaves,
            vec![
                "String#*@app.rb:12 <- Foo#bar@app.rb:12",
                "String#*@app.rb:14 <- Foo#bar@app.rb:14",
                "String#*@lib.rb:5 <- Baz#qux@lib.rb:5",
            ]
        );
        let c_functions = profile
            .function
            .iter()
            .filter(|f| string(&profile, f.name) == "String#*")
            .count();
        assert_eq!(c_functions, 2, "one function per file it is shown in");
    }

    #[test]
    fn frames_running_a_block_are_named_as_the_block() {
        use sampler::block_frames::{BlockCode, BlockKind, MethodBlocks};
        use std::sync::Arc;
        let mut state = SamplerState::new(GapSampler::new(1.0, 1), 100, 100);
        // Foo#bar (lines 10-20) has a one-line block on line 12
        // (`items.each { ... }`). Leaf first: the block at 12 <- Array#each
        // (C) <- Foo#bar at 12 <- <main>. The method has two handles (8 and
        // 40: a method entry per including class); only if they count as
        // one method is the leaf seen as a block of the frame below.
        let stack = [frame(40, 12), frame(24, 0), frame(8, 12), frame(16, 30)];
        record(&mut state, 0x1000, &stack);
        state.measure_pending(|_| Some(40));
        let snapshot = state.take_snapshot(0, |_| Some(40));
        let blocks = MethodBlocks::new(vec![BlockCode {
            name: "block in Foo#bar".into(),
            start_line: 12,
            end_line: 12,
            parent: None,
            kind: BlockKind::Block,
        }])
        .map(Arc::new);
        let bar = FrameInfo {
            blocks,
            ..info("Foo#bar", Some("app.rb"), 10)
        };
        let mut frames = FastHashMap::default();
        frames.insert(FrameRef(8), bar.clone());
        frames.insert(FrameRef(40), bar);
        frames.insert(FrameRef(16), info("<main>", Some("app.rb"), 1));
        frames.insert(FrameRef(24), info("Array#each", None, 0));
        let profile = build_profile(&snapshot, &frames, &classes(), &meta());
        assert_eq!(
            function_names(&profile, &profile.sample[0]),
            vec![
                "block in Foo#bar@app.rb:12",
                "Array#each@app.rb:12",
                "Foo#bar@app.rb:12",
                "<main>@app.rb:30"
            ]
        );
        let start_lines: Vec<(String, i64)> = profile
            .function
            .iter()
            .map(|f| (string(&profile, f.name).to_string(), f.start_line))
            .collect();
        assert!(start_lines.contains(&("block in Foo#bar".into(), 12)));
        assert!(start_lines.contains(&("Foo#bar".into(), 10)));
    }

    #[test]
    fn every_sample_has_a_class_label_and_live_ones_an_age() {
        let (snapshot, frames) = example();
        let profile = build_profile(&snapshot, &frames, &classes(), &meta());
        for sample in &profile.sample {
            let class = sample
                .label
                .iter()
                .find(|l| string(&profile, l.key) == CLASS_LABEL)
                .expect("class label");
            assert_eq!(string(&profile, class.str), "String");
            let age = sample
                .label
                .iter()
                .find(|l| string(&profile, l.key) == GC_AGE_LABEL);
            let in_use = sample.value[2] > 0;
            assert_eq!(age.is_some(), in_use);
            if let Some(age) = age {
                assert_eq!(age.num, 0);
                assert_eq!(string(&profile, age.num_unit), GC_AGE_UNIT);
            }
        }
    }

    #[test]
    fn sample_labels_keep_gives_a_sample_per_class_and_age() {
        let profile = two_classes_profile(SampleLabels::Keep);
        // Allocations: String, Array; live: String aged 6, Array aged 4.
        let mut labels: Vec<usize> = samples_of(&profile).iter().map(|s| s.2).collect();
        labels.sort();
        assert_eq!(labels, vec![1, 1, 2, 2]);
    }

    #[test]
    fn sample_labels_class_frame_puts_the_class_at_the_leaf_without_labels() {
        let profile = two_classes_profile(SampleLabels::ClassFrame);
        let stack = |class: &str| {
            vec![
                format!("{class}@:0"),
                "Foo#bar@app.rb:12".into(),
                "<main>@app.rb:30".into(),
            ]
        };
        // The two Strings (one still alive) are one sample, and the live
        // ones' ages are gone.
        assert_eq!(
            samples_of(&profile),
            vec![
                (stack("Array"), vec![1, 40, 1, 40], 0),
                (stack("String"), vec![2, 80, 1, 40], 0),
            ]
        );
        let strings = &profile.string_table;
        assert!(!strings
            .iter()
            .any(|s| s == CLASS_LABEL || s == GC_AGE_LABEL));
    }

    /// A sample's context labels and values.
    type LabelledValues = (Vec<(String, String)>, Vec<i64>);

    /// Three Strings at one stack: two under `endpoint=a` (one still
    /// alive), one under `endpoint=b`.
    fn labelled_profile(sample_labels: SampleLabels) -> crate::Profile {
        let mut sets = LabelSets::default();
        let a = sets.intern(&[("endpoint", "a")]).unwrap();
        let b = sets.intern(&[("endpoint", "b"), ("job", "j")]).unwrap();
        let mut state = SamplerState::new(GapSampler::new(1.0, 1), 100, 100);
        let stack = [frame(8, 12)];
        for (i, labels) in [a, a, b].into_iter().enumerate() {
            let admission = state.admission(1.0);
            let mut info = ObjectInfo::new(ClassRef(1), 0);
            info.labels = labels;
            state.record_allocation(ObjectAddress(0x1000 + i * 40), info, &stack, admission);
        }
        state.measure_pending(|_| Some(40));
        assert!(state.record_free(ObjectAddress(0x1000 + 80)));
        let snapshot = state.take_snapshot(0, |_| Some(40));
        let mut frames = FastHashMap::default();
        frames.insert(FrameRef(8), info("Foo#bar", Some("app.rb"), 10));
        let classes = [(ClassRef(1), "String".to_string())].into_iter().collect();
        let meta = ProfileMeta {
            sample_labels,
            label_names: sets.snapshot(),
            ..meta()
        };
        build_profile(&snapshot, &frames, &classes, &meta)
    }

    #[test]
    fn context_labels_split_samples_and_are_kept_in_every_shape() {
        for sample_labels in [
            SampleLabels::Keep,
            SampleLabels::ClassFrame,
            SampleLabels::Drop,
        ] {
            let profile = labelled_profile(sample_labels);
            let mut by_labels: Vec<LabelledValues> = profile
                .sample
                .iter()
                .map(|s| {
                    let labels = s
                        .label
                        .iter()
                        .filter(|l| l.str != 0)
                        .map(|l| {
                            (
                                string(&profile, l.key).into(),
                                string(&profile, l.str).into(),
                            )
                        })
                        .filter(|(k, _): &(String, String)| k != CLASS_LABEL)
                        .collect();
                    (labels, s.value.clone())
                })
                .collect();
            // Merged by what the shape keeps, then summed per label set.
            let mut sums: Vec<LabelledValues> = Vec::new();
            by_labels.sort();
            for (labels, values) in by_labels {
                match sums.last_mut() {
                    Some((last, sum)) if *last == labels => {
                        sum.iter_mut().zip(values).for_each(|(s, v)| *s += v)
                    }
                    _ => sums.push((labels, values)),
                }
            }
            let set = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
                pairs.iter().map(|&(k, v)| (k.into(), v.into())).collect()
            };
            assert_eq!(
                sums,
                vec![
                    (set(&[("endpoint", "a")]), vec![2, 80, 2, 80]),
                    (set(&[("endpoint", "b"), ("job", "j")]), vec![1, 40, 0, 0]),
                ],
                "{sample_labels:?}"
            );
        }
    }

    #[test]
    fn samples_without_context_labels_name_none() {
        let (snapshot, frames, classes) = two_classes();
        let profile = build_profile(&snapshot, &frames, &classes, &meta());
        for sample in &profile.sample {
            for label in &sample.label {
                let key = string(&profile, label.key);
                assert!(key == CLASS_LABEL || key == GC_AGE_LABEL, "{key}");
            }
        }
    }

    #[test]
    fn sample_labels_drop_merges_by_stack_alone() {
        let profile = two_classes_profile(SampleLabels::Drop);
        let stack = vec!["Foo#bar@app.rb:12".to_string(), "<main>@app.rb:30".into()];
        assert_eq!(samples_of(&profile), vec![(stack, vec![3, 120, 2, 80], 0)]);
        assert!(!profile
            .string_table
            .iter()
            .any(|s| s == "String" || s == CLASS_LABEL));
    }

    #[test]
    fn classes_of_one_name_make_one_sample() {
        let (snapshot, frames, _) = two_classes();
        // The String and the Array handles both named as anonymous classes
        // are (the profile cannot tell them apart).
        let anonymous = "(anonymous subclass of Object)".to_string();
        let classes = [(ClassRef(1), anonymous.clone()), (ClassRef(2), anonymous)]
            .into_iter()
            .collect();
        let profile_with = |sample_labels| {
            let meta = ProfileMeta {
                sample_labels,
                ..meta()
            };
            samples_of(&build_profile(&snapshot, &frames, &classes, &meta))
        };
        // Keep: the three allocations are one sample; the two live objects
        // stay apart by their GC ages (4 and 6).
        let keep = profile_with(SampleLabels::Keep);
        let allocations: Vec<_> = keep.iter().filter(|s| s.1[0] > 0).collect();
        assert_eq!(allocations.len(), 1);
        assert_eq!(allocations[0].1, vec![3, 120, 0, 0]);
        assert_eq!(keep.len(), 3);
        // ClassFrame: one sample in all.
        let class_frame = profile_with(SampleLabels::ClassFrame);
        assert_eq!(class_frame.len(), 1);
        assert_eq!(class_frame[0].1, vec![3, 120, 2, 80]);
    }

    #[test]
    fn label_keys_and_sample_types_have_no_dash() {
        let (snapshot, frames) = example();
        let profile = build_profile(&snapshot, &frames, &classes(), &meta());
        for sample in &profile.sample {
            for label in &sample.label {
                assert!(!string(&profile, label.key).contains('-'));
            }
        }
        for t in &profile.sample_type {
            assert!(!string(&profile, t.r#type).contains('-'));
        }
    }

    #[test]
    fn truncated_and_unknown_frames_are_visible() {
        let mut state = SamplerState::new(GapSampler::new(1.0, 1), 10, 10);
        let admission = state.admission(1.0);
        state.record_allocation(
            ObjectAddress(0x1000),
            ObjectInfo::default(),
            &[frame(8, 1), frame(99, 2), frame(TRUNCATION_FRAME.0, 0)],
            admission,
        );
        let snapshot = state.take_snapshot(0, |_| Some(40));
        let mut frames = FastHashMap::default();
        frames.insert(FrameRef(8), info("Foo#bar", Some("app.rb"), 1));
        let profile = build_profile(&snapshot, &frames, &classes(), &meta());
        let names = function_names(&profile, &profile.sample[0]);
        assert_eq!(names[1], "(unknown frame)@:0");
        assert_eq!(names[2], "(truncated stack)@:0");
    }

    #[test]
    fn the_hidden_bottom_main_frame_is_dropped_and_empty_stacks_are_named() {
        let mut state = SamplerState::new(GapSampler::new(1.0, 1), 10, 10);
        for (object, stack) in [
            (0x1000, vec![frame(8, 3), frame(16, 5), frame(16, 0)]),
            (0x2000, vec![frame(16, 0)]), // only frame: kept
            (0x3000, vec![]),
        ] {
            record(&mut state, object, &stack);
        }
        let snapshot = state.take_snapshot(0, |_| Some(40));
        let mut frames = FastHashMap::default();
        frames.insert(FrameRef(8), info("Foo#bar", Some("app.rb"), 1));
        frames.insert(FrameRef(16), info("<main>", Some("app.rb"), 0));
        let profile = build_profile(&snapshot, &frames, &classes(), &meta());
        let mut stacks: Vec<Vec<String>> = profile
            .sample
            .iter()
            .map(|sample| function_names(&profile, sample))
            .collect();
        stacks.sort();
        stacks.dedup();
        assert_eq!(
            stacks,
            vec![
                vec!["(no Ruby frames)@:0".to_string()],
                vec!["<main>@app.rb:0".to_string()],
                vec![
                    "Foo#bar@app.rb:3".to_string(),
                    "<main>@app.rb:5".to_string()
                ],
            ]
        );
    }

    #[test]
    fn streamed_encoding_gives_the_same_profile() {
        let (snapshot, frames) = example();
        let built = build_profile(&snapshot, &frames, &classes(), &meta());
        let (streamed, folded) = build_profile_gzipped(&snapshot, &frames, &classes(), &meta());
        assert_eq!(folded, 0);
        let mut raw = Vec::new();
        GzDecoder::new(&streamed[..])
            .read_to_end(&mut raw)
            .expect("gunzip");
        let decoded = crate::Profile::decode(&raw[..]).expect("decode");
        assert_eq!(decoded, built);
        assert!(!decoded.sample.is_empty());
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "thousands of samples through gzip, no unsafe code; too slow under Miri"
    )]
    fn samples_are_folded_into_other_to_fit_a_size_limit_with_totals_kept() {
        for sample_labels in [
            SampleLabels::Keep,
            SampleLabels::ClassFrame,
            SampleLabels::Drop,
        ] {
            folding_keeps_the_limit_and_totals(sample_labels);
        }
    }

    fn folding_keeps_the_limit_and_totals(sample_labels: SampleLabels) {
        let mut state = SamplerState::new(GapSampler::new(1.0, 1), 10_000, 10_000);
        let mut frames = FastHashMap::default();
        for i in 0..2_000u64 {
            let stack: Vec<Frame> = (0..40)
                .map(|d| frame(8 * (1 + (i * 40 + d) % 3_000), d as i32))
                .collect();
            let admission = state.admission(1.0);
            let object = ObjectInfo::new(ClassRef(i), 0);
            state.record_allocation(
                ObjectAddress(0x10_0000 + i as usize * 40),
                object,
                &stack,
                admission,
            );
        }
        for f in 1..=3_000u64 {
            frames.insert(FrameRef(8 * f), info(&format!("M{f}#m"), Some("app.rb"), 1));
        }
        state.measure_pending(|object| Some(40 + (object.0 as u64 % 1_000)));
        let snapshot = state.take_snapshot(0, |object| Some(40 + (object.0 as u64 % 1_000)));
        // Each stack's object of its own class: with a class frame, every
        // sample has a location more and a function of its own.
        let classes: FastHashMap<ClassRef, String> = (0..2_000)
            .map(|c| (ClassRef(c), format!("Widget{c}")))
            .collect();
        let meta = ProfileMeta {
            sample_labels,
            ..meta()
        };
        let unlimited = build_profile(&snapshot, &frames, &classes, &meta);
        let raw_unlimited = unlimited.encode_to_vec().len();
        let limit = raw_unlimited / 3;
        let limited_meta = ProfileMeta {
            max_raw_bytes: Some(limit),
            ..meta.clone()
        };
        let (gz, folded) = build_profile_gzipped(&snapshot, &frames, &classes, &limited_meta);
        let mut raw = Vec::new();
        GzDecoder::new(&gz[..])
            .read_to_end(&mut raw)
            .expect("gunzip");
        assert!(folded > 0, "{sample_labels:?}");
        assert!(
            raw.len() <= limit,
            "{sample_labels:?}: {} > {}",
            raw.len(),
            limit
        );
        let profile = crate::Profile::decode(&raw[..]).expect("decode");
        let total = |p: &crate::Profile, i: usize| p.sample.iter().map(|s| s.value[i]).sum::<i64>();
        for i in 0..4 {
            let difference = (total(&profile, i) - total(&unlimited, i)).abs();
            assert!(
                difference <= folded as i64,
                "{sample_labels:?}, sample type {i}: totals differ by {difference}"
            );
        }
        let names: Vec<String> = profile
            .sample
            .iter()
            .flat_map(|s| function_names(&profile, s))
            .collect();
        assert!(names.iter().any(|n| n.starts_with("(other)")));
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "thousands of samples through gzip, no unsafe code; too slow under Miri"
    )]
    fn the_size_limit_holds_when_methods_appear_at_many_lines() {
        let mut state = SamplerState::new(GapSampler::new(1.0, 1), 10_000, 10_000);
        let mut frames = FastHashMap::default();
        for i in 0..3_000u64 {
            // 20 methods only, but each sample at other lines: thousands of
            // locations for few functions.
            let stack: Vec<Frame> = (0..30)
                .map(|d| frame(8 * (1 + (d % 20)), (i * 31 + d) as i32))
                .collect();
            record(&mut state, 0x10_0000 + i as usize * 40, &stack);
        }
        for f in 1..=20u64 {
            frames.insert(FrameRef(8 * f), info(&format!("M{f}#m"), Some("app.rb"), 1));
        }
        state.measure_pending(|_| Some(40));
        let snapshot = state.take_snapshot(0, |_| Some(40));
        for limit in [100_000, 30_000] {
            let limited = ProfileMeta {
                max_raw_bytes: Some(limit),
                ..meta()
            };
            let (gz, folded) = build_profile_gzipped(&snapshot, &frames, &classes(), &limited);
            let mut raw = Vec::new();
            GzDecoder::new(&gz[..])
                .read_to_end(&mut raw)
                .expect("gunzip");
            assert!(folded > 0);
            assert!(raw.len() <= limit, "{} > {}", raw.len(), limit);
        }
    }

    /// `n` samples, each in a stack of `depth` methods of its own (so the
    /// tables outweigh the samples), with 40 + i % 1,000 bytes.
    fn many_methods(n: u64, depth: u64) -> (FlushSnapshot, FastHashMap<FrameRef, FrameInfo>) {
        let mut state = SamplerState::new(GapSampler::new(1.0, 1), 100_000, 100_000);
        let mut frames = FastHashMap::default();
        for i in 0..n {
            let stack: Vec<Frame> = (0..depth)
                .map(|d| frame(8 * (1 + i * depth + d), 3))
                .collect();
            for d in 0..depth {
                let name = format!("Generated::Module{i}#method_{d}_with_a_long_name");
                frames.insert(
                    FrameRef(8 * (1 + i * depth + d)),
                    info(&name, Some("app/generated.rb"), 1),
                );
            }
            record(&mut state, 0x10_0000 + i as usize * 40, &stack);
        }
        let size = |object: ObjectAddress| Some(40 + (object.0 as u64 / 40) % 1_000);
        state.measure_pending(size);
        let snapshot = state.take_snapshot(0, size);
        (snapshot, frames)
    }

    fn gunzip(gz: &[u8]) -> Vec<u8> {
        let mut raw = Vec::new();
        GzDecoder::new(gz).read_to_end(&mut raw).expect("gunzip");
        raw
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "thousands of samples through gzip, no unsafe code; too slow under Miri"
    )]
    fn folding_measures_sizes_so_tables_heavy_profiles_keep_most_samples() {
        let (snapshot, frames) = many_methods(4_000, 5);
        let unlimited = build_profile(&snapshot, &frames, &classes(), &meta())
            .encode_to_vec()
            .len();
        // A limit the profile already meets folds nothing.
        let at_size = ProfileMeta {
            max_raw_bytes: Some(unlimited),
            ..meta()
        };
        assert_eq!(
            build_profile_gzipped(&snapshot, &frames, &classes(), &at_size).1,
            0
        );
        // 80% of the size: about a fifth of the samples go, not all of them
        // (an estimate counting each frame's file name folded everything).
        let limit = unlimited * 4 / 5;
        let limited = ProfileMeta {
            max_raw_bytes: Some(limit),
            ..meta()
        };
        let (gz, folded) = build_profile_gzipped(&snapshot, &frames, &classes(), &limited);
        let raw = gunzip(&gz);
        assert!(raw.len() <= limit, "{} > {limit}", raw.len());
        assert!(
            raw.len() >= limit * 19 / 20,
            "{} bytes, far under {limit}: folded too much",
            raw.len()
        );
        // 8,000 samples: each object's allocation and its live sample.
        assert!(
            (1_200..=2_000).contains(&folded),
            "{folded} of 8,000 folded"
        );
        let profile = crate::Profile::decode(&raw[..]).expect("decode");
        assert_eq!(profile.sample.len(), 8_000 - folded + 1);
    }

    #[test]
    fn a_sample_cap_folds_the_smallest_samples_into_other() {
        let (snapshot, frames) = many_methods(100, 2);
        let all = build_profile(&snapshot, &frames, &classes(), &meta());
        // Each object's allocation and its live sample.
        assert_eq!(all.sample.len(), 200);
        for max_samples in [200, 199, 10, 1] {
            let capped = ProfileMeta {
                max_samples: Some(max_samples),
                ..meta()
            };
            let (gz, folded) = build_profile_gzipped(&snapshot, &frames, &classes(), &capped);
            let profile = crate::Profile::decode(&gunzip(&gz)[..]).expect("decode");
            assert!(
                profile.sample.len() <= max_samples,
                "{max_samples}: {}",
                profile.sample.len()
            );
            let expected_folded = if max_samples == 200 {
                0
            } else {
                201 - max_samples
            };
            assert_eq!(folded, expected_folded, "cap {max_samples}");
            for i in 0..4 {
                let total = |p: &crate::Profile| p.sample.iter().map(|s| s.value[i]).sum::<i64>();
                assert_eq!(
                    total(&profile),
                    total(&all),
                    "cap {max_samples}, sample type {i}"
                );
            }
            let is_other = |s: &crate::Sample| function_names(&profile, s) == ["(other)@:0"];
            assert_eq!(
                profile.sample.iter().filter(|s| is_other(s)).count(),
                usize::from(folded > 0),
                "cap {max_samples}"
            );
            if folded > 0 && folded < 200 {
                // The smallest went: no sample kept has fewer bytes than
                // the largest folded one.
                let bytes = |s: &crate::Sample| s.value[1] + s.value[3];
                let mut sizes: Vec<i64> = all.sample.iter().map(bytes).collect();
                sizes.sort();
                let smallest_kept = profile
                    .sample
                    .iter()
                    .filter(|s| !is_other(s))
                    .map(bytes)
                    .min();
                assert!(
                    smallest_kept >= Some(sizes[folded - 1]),
                    "cap {max_samples}"
                );
            }
        }
    }

    #[test]
    fn gzipped_profile_round_trips() {
        let (snapshot, frames) = example();
        let profile = build_profile(&snapshot, &frames, &classes(), &meta());
        let gz = encode_gzipped(&profile);
        assert_eq!(&gz[..2], &[0x1f, 0x8b], "gzip magic");
        let mut raw = Vec::new();
        GzDecoder::new(&gz[..])
            .read_to_end(&mut raw)
            .expect("valid gzip");
        let decoded = crate::Profile::decode(&raw[..]).expect("valid protobuf");
        assert_eq!(decoded, profile);
    }

    #[test]
    fn field_numbers_match_the_pprof_specification() {
        // Hand-encode a few fields with the spec's numbers and decode them.
        // Profile.time_nanos = 9 (varint), Profile.string_table = 6, Function.name = 2.
        let mut bytes = vec![9 << 3, 42];
        bytes.extend([6 << 3 | 2, 0]);
        bytes.extend([6 << 3 | 2, 3, b'f', b'o', b'o']);
        bytes.extend([5 << 3 | 2, 4, 1 << 3, 7, 2 << 3, 1]);
        bytes.extend([14 << 3, 1]);
        let profile = crate::Profile::decode(&bytes[..]).expect("decodes");
        assert_eq!(profile.time_nanos, 42);
        assert_eq!(profile.string_table, vec!["", "foo"]);
        assert_eq!(profile.function[0].id, 7);
        assert_eq!(profile.function[0].name, 1);
        assert_eq!(profile.default_sample_type, 1);
    }

    #[test]
    fn empty_snapshot_still_makes_a_valid_profile() {
        let profile = build_profile(
            &FlushSnapshot::default(),
            &FastHashMap::default(),
            &classes(),
            &meta(),
        );
        assert!(profile.sample.is_empty());
        assert_eq!(profile.sample_type.len(), 4);
        assert!(!encode_gzipped(&profile).is_empty());
    }
}
