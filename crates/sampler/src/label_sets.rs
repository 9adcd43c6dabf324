//! Label sets: the `key=value` labels (which request, which job) a sample
//! was taken under. Each distinct set is interned once, so the NEWOBJ hook
//! stores a 32-bit id with a sample and never a string or a Ruby object.
//!
//! The table is bounded three ways: keys are short identifiers, values are
//! truncated, and past `max_sets` distinct sets a new one folds into the
//! set with the same keys and every value "(other)" (counted), so an app
//! that labels by request id costs a bounded table, not unbounded memory.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// An interned label set; `NO_LABELS` (0) is the empty set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct LabelSetId(pub u32);

pub const NO_LABELS: LabelSetId = LabelSetId(0);

/// One set's labels, sorted by key.
pub type Labels = Arc<[(Arc<str>, Arc<str>)]>;

/// Label keys are identifiers of at most this many bytes (what Prometheus
/// and Pyroscope accept as label names).
pub const MAX_KEY_BYTES: usize = 64;
/// Values are cut to at most this many bytes (at a character boundary).
pub const MAX_VALUE_BYTES: usize = 200;
/// Labels in one set.
pub const MAX_LABELS: usize = 8;
/// Distinct sets before new ones fold, unless configured otherwise.
pub const DEFAULT_MAX_SETS: usize = 1_000;
/// Highest configurable `max_sets`: ids, folded sets included, stay below
/// 2^16, which is what a sample record keeps.
pub const MAX_MAX_SETS: usize = 50_000;
/// Folded sets (one per distinct key list) beyond `max_sets`; past this,
/// everything folds into the single `FOLDED_KEY=(other)` set.
const MAX_FOLDED_SETS: usize = 64;

/// The value folded labels read.
pub const OTHER_VALUE: &str = "(other)";
const FOLDED_KEY: &str = "labels";

/// Keys the profile itself uses for other labels.
pub const RESERVED_KEYS: [&str; 2] = ["class", "gc_age"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelError {
    BadKey(String),
    ReservedKey(String),
    DuplicateKey(String),
    TooMany(usize),
    BadMaxSets(usize),
}

impl fmt::Display for LabelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LabelError::BadKey(key) => write!(
                f,
                "label key {key:?} is not an identifier of 1-{MAX_KEY_BYTES} characters \
                 (letters, digits and _, not starting with a digit)"
            ),
            LabelError::ReservedKey(key) => write!(
                f,
                "label key {key:?} is reserved: the profile's own labels use {:?}",
                RESERVED_KEYS
            ),
            LabelError::DuplicateKey(key) => write!(f, "label key {key:?} given twice"),
            LabelError::TooMany(count) => {
                write!(f, "{count} labels: at most {MAX_LABELS} in one set")
            }
            LabelError::BadMaxSets(count) => {
                write!(f, "max_label_sets {count}: must be 1 to {MAX_MAX_SETS}")
            }
        }
    }
}

impl std::error::Error for LabelError {}

/// Whether `key` may be a label key.
pub fn check_key(key: &str) -> Result<(), LabelError> {
    let mut bytes = key.bytes();
    let identifier = key.len() <= MAX_KEY_BYTES
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !identifier {
        return Err(LabelError::BadKey(shorten(key, MAX_KEY_BYTES).into()));
    }
    if RESERVED_KEYS.contains(&key) {
        return Err(LabelError::ReservedKey(key.into()));
    }
    Ok(())
}

/// `value` cut to at most `max` bytes at a character boundary.
fn shorten(value: &str, max: usize) -> &str {
    if value.len() <= max {
        return value;
    }
    let mut end = max;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    &value[..end]
}

/// The process's label sets. Ids are never reused, so an id read from a
/// fiber at any time names the set it was given for.
#[derive(Debug)]
pub struct LabelSets {
    /// Set `id` at index `id - 1`.
    sets: Vec<Labels>,
    /// Keyed by the sets' contents. SipHash: values can come from requests.
    ids: HashMap<Labels, LabelSetId>,
    /// How many sets (folded ones aside) may be added.
    max_sets: usize,
    unfolded: usize,
    folded_sets: usize,
    /// Sets refused by the cap and folded, since the process started.
    folds: u64,
}

impl Default for LabelSets {
    fn default() -> Self {
        LabelSets::new(DEFAULT_MAX_SETS)
    }
}

impl LabelSets {
    pub fn new(max_sets: usize) -> Self {
        LabelSets {
            sets: Vec::new(),
            ids: HashMap::new(),
            max_sets,
            unfolded: 0,
            folded_sets: 0,
            folds: 0,
        }
    }

    pub fn max_sets(&self) -> usize {
        self.max_sets
    }

    /// Sets from now on fold beyond `max_sets` distinct ones (sets already
    /// interned keep their ids).
    pub fn set_max_sets(&mut self, max_sets: usize) -> Result<(), LabelError> {
        if !(1..=MAX_MAX_SETS).contains(&max_sets) {
            return Err(LabelError::BadMaxSets(max_sets));
        }
        self.max_sets = max_sets;
        Ok(())
    }

    /// How many times a new set was folded because the table was full.
    pub fn folds(&self) -> u64 {
        self.folds
    }

    /// Distinct sets interned, folded ones included.
    pub fn len(&self) -> usize {
        self.sets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }

    /// The id of the set of `labels` (pairs in any order; values longer than
    /// `MAX_VALUE_BYTES` are cut, empty ones drop their key). An empty set
    /// is `NO_LABELS`.
    pub fn intern<K: AsRef<str>, V: AsRef<str>>(
        &mut self,
        labels: &[(K, V)],
    ) -> Result<LabelSetId, LabelError> {
        if labels.len() > MAX_LABELS {
            return Err(LabelError::TooMany(labels.len()));
        }
        let mut pairs: Vec<(&str, &str)> = Vec::with_capacity(labels.len());
        for (key, value) in labels {
            let key = key.as_ref();
            check_key(key)?;
            let value = shorten(value.as_ref(), MAX_VALUE_BYTES);
            if !value.is_empty() {
                pairs.push((key, value));
            }
        }
        pairs.sort_unstable();
        if let Some(pair) = pairs.windows(2).find(|pair| pair[0].0 == pair[1].0) {
            return Err(LabelError::DuplicateKey(pair[0].0.into()));
        }
        if pairs.is_empty() {
            return Ok(NO_LABELS);
        }
        let labels: Labels = pairs
            .iter()
            .map(|&(key, value)| (Arc::from(key), Arc::from(value)))
            .collect();
        if let Some(&id) = self.ids.get(&labels) {
            return Ok(id);
        }
        if self.unfolded < self.max_sets {
            self.unfolded += 1;
            return Ok(self.add(labels));
        }
        self.folds += 1;
        let folded: Labels = pairs
            .iter()
            .map(|&(key, _)| (Arc::from(key), Arc::from(OTHER_VALUE)))
            .collect();
        if let Some(&id) = self.ids.get(&folded) {
            return Ok(id);
        }
        if self.folded_sets < MAX_FOLDED_SETS {
            self.folded_sets += 1;
            return Ok(self.add(folded));
        }
        let catch_all: Labels = Arc::new([(Arc::from(FOLDED_KEY), Arc::from(OTHER_VALUE))]);
        match self.ids.get(&catch_all) {
            Some(&id) => Ok(id),
            None => Ok(self.add(catch_all)),
        }
    }

    fn add(&mut self, labels: Labels) -> LabelSetId {
        let id = LabelSetId(u32::try_from(self.sets.len() + 1).expect("fewer than 2^32 sets"));
        self.sets.push(labels.clone());
        self.ids.insert(labels, id);
        id
    }

    /// The labels of `id`; none for `NO_LABELS` or an id never given out.
    pub fn get(&self, id: LabelSetId) -> Option<&Labels> {
        let index = (id.0 as usize).checked_sub(1)?;
        self.sets.get(index)
    }

    /// All sets, cheaply (shared), for a flush to name the ids it holds.
    pub fn snapshot(&self) -> LabelNames {
        LabelNames {
            sets: self.sets.clone(),
        }
    }

    /// Approximate bytes held.
    pub fn memory_bytes(&self) -> usize {
        let strings: usize = self
            .sets
            .iter()
            .flat_map(|set| set.iter())
            .map(|(key, value)| key.len() + value.len() + 32)
            .sum();
        // Strings are shared by `sets` and `ids`; the pointers are not.
        strings + self.sets.capacity() * 16 + self.ids.capacity() * 24
    }
}

/// The label sets as they were when a flush began.
#[derive(Debug, Clone, Default)]
pub struct LabelNames {
    sets: Vec<Labels>,
}

impl LabelNames {
    pub fn get(&self, id: LabelSetId) -> Option<&Labels> {
        let index = (id.0 as usize).checked_sub(1)?;
        self.sets.get(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(set: &LabelSets, id: LabelSetId) -> Vec<(String, String)> {
        set.get(id)
            .map(|labels| {
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn the_same_labels_in_any_order_are_one_set() {
        let mut sets = LabelSets::default();
        let a = sets
            .intern(&[("endpoint", "GET /users"), ("job", "Mailer")])
            .unwrap();
        let b = sets
            .intern(&[("job", "Mailer"), ("endpoint", "GET /users")])
            .unwrap();
        assert_eq!(a, b);
        assert_ne!(a, NO_LABELS);
        assert_eq!(
            pairs(&sets, a),
            vec![
                ("endpoint".into(), "GET /users".into()),
                ("job".into(), "Mailer".into())
            ]
        );
        let c = sets.intern(&[("endpoint", "GET /posts")]).unwrap();
        assert_ne!(a, c);
        assert_eq!(sets.len(), 2);
    }

    #[test]
    fn no_labels_and_empty_values_are_the_empty_set() {
        let mut sets = LabelSets::default();
        let empty: [(&str, &str); 0] = [];
        assert_eq!(sets.intern(&empty).unwrap(), NO_LABELS);
        assert_eq!(sets.intern(&[("endpoint", "")]).unwrap(), NO_LABELS);
        let id = sets.intern(&[("endpoint", "x"), ("job", "")]).unwrap();
        assert_eq!(pairs(&sets, id), vec![("endpoint".into(), "x".into())]);
        assert!(sets.get(NO_LABELS).is_none());
        assert!(sets.get(LabelSetId(999)).is_none());
    }

    #[test]
    fn bad_keys_are_refused_with_the_key_named() {
        let mut sets = LabelSets::default();
        for key in [
            "",
            "9lives",
            "with-dash",
            "with space",
            "é",
            &"k".repeat(65),
        ] {
            let error = sets.intern(&[(key, "v")]).unwrap_err();
            assert!(matches!(error, LabelError::BadKey(_)), "{key:?}: {error:?}");
        }
        assert!(sets.intern(&[(&*"k".repeat(64), "v")]).is_ok());
        assert_eq!(
            sets.intern(&[("class", "v")]).unwrap_err(),
            LabelError::ReservedKey("class".into())
        );
        assert_eq!(
            sets.intern(&[("a", "1"), ("a", "2")]).unwrap_err(),
            LabelError::DuplicateKey("a".into())
        );
        let nine: Vec<(String, &str)> = (0..9).map(|i| (format!("k{i}"), "v")).collect();
        assert_eq!(sets.intern(&nine).unwrap_err(), LabelError::TooMany(9));
        assert_eq!(sets.len(), 1, "only the 64-byte key's set");
        // A key a megabyte long is named by its start only.
        let long = "k-".repeat(500_000);
        let message = sets.intern(&[(&*long, "v")]).unwrap_err().to_string();
        assert!(message.len() < 300, "{}", message.len());
    }

    #[test]
    fn long_values_are_cut_at_a_character_boundary() {
        let mut sets = LabelSets::default();
        let value = "é".repeat(1_000_000); // 2 bytes each
        let id = sets.intern(&[("endpoint", value.as_str())]).unwrap();
        let kept = &pairs(&sets, id)[0].1;
        assert_eq!(kept.len(), MAX_VALUE_BYTES);
        assert!(value.starts_with(kept.as_str()));
        // Values that differ only past the cut are one set.
        let other = format!("{}x", &value[..MAX_VALUE_BYTES]);
        assert_eq!(sets.intern(&[("endpoint", other.as_str())]).unwrap(), id);
    }

    #[test]
    fn sets_beyond_the_cap_fold_by_key_list_and_are_counted() {
        let mut sets = LabelSets::new(3);
        let kept: Vec<_> = (0..3)
            .map(|i| sets.intern(&[("endpoint", format!("e{i}"))]).unwrap())
            .collect();
        let folded = sets.intern(&[("endpoint", "e3")]).unwrap();
        assert!(!kept.contains(&folded));
        assert_eq!(
            pairs(&sets, folded),
            vec![("endpoint".into(), OTHER_VALUE.into())]
        );
        assert_eq!(sets.intern(&[("endpoint", "e4")]).unwrap(), folded);
        // Sets interned before the cap keep their ids.
        assert_eq!(sets.intern(&[("endpoint", "e1")]).unwrap(), kept[1]);
        let job = sets.intern(&[("job", "A"), ("endpoint", "e9")]).unwrap();
        assert_eq!(
            pairs(&sets, job),
            vec![
                ("endpoint".into(), OTHER_VALUE.into()),
                ("job".into(), OTHER_VALUE.into())
            ]
        );
        assert_eq!(sets.folds(), 3);
        assert_eq!(sets.len(), 5);
    }

    #[test]
    fn a_million_distinct_values_and_key_lists_stay_bounded() {
        let mut sets = LabelSets::new(100);
        for i in 0..1_000_000u32 {
            let key = format!("k{}", i % 1_000);
            sets.intern(&[(key.as_str(), i.to_string())]).unwrap();
        }
        assert!(sets.len() <= 100 + MAX_FOLDED_SETS + 1, "{}", sets.len());
        assert_eq!(sets.folds(), 1_000_000 - 100);
        let catch_all = sets.intern(&[("k999", "new")]).unwrap();
        assert_eq!(
            pairs(&sets, catch_all),
            vec![(FOLDED_KEY.into(), OTHER_VALUE.into())]
        );
        assert!(sets.memory_bytes() < 100_000, "{}", sets.memory_bytes());
    }

    #[test]
    fn the_cap_is_checked_and_applies_from_then_on() {
        let mut sets = LabelSets::new(1);
        assert_eq!(sets.set_max_sets(0), Err(LabelError::BadMaxSets(0)));
        assert!(sets.set_max_sets(MAX_MAX_SETS + 1).is_err());
        let a = sets.intern(&[("a", "1")]).unwrap();
        let folded = sets.intern(&[("a", "2")]).unwrap();
        assert_eq!(pairs(&sets, folded)[0].1, OTHER_VALUE);
        sets.set_max_sets(2).unwrap();
        let b = sets.intern(&[("a", "3")]).unwrap();
        assert_eq!(pairs(&sets, b)[0].1, "3");
        assert_eq!(sets.max_sets(), 2);
        let names = sets.snapshot();
        assert_eq!(names.get(a).unwrap()[0].1.as_ref(), "1");
        assert!(names.get(NO_LABELS).is_none());
    }
}
