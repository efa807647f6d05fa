//! Store-level tests: behaviour of each policy through the public API, the
//! event contract, and property tests against an independent O(n) model.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use proptest::prelude::*;

use crate::{
    AdmitError, EvictCause, InvalidateCause, MemoryStore, Replacement, StoreConfig, StoreEvent,
    StoreKey, Weigh,
};

/// A test value that weighs what it says.
#[derive(Debug, PartialEq, Eq)]
struct Blob(u64);

impl Weigh for Blob {
    fn weight(&self) -> u64 {
        self.0
    }
}

fn key(name: &str) -> StoreKey {
    StoreKey::get(&format!("http://test.example/{name}"))
}

fn store(capacity: u64, replacement: Replacement) -> MemoryStore<Blob> {
    MemoryStore::new(StoreConfig {
        capacity,
        max_object_size: capacity,
        replacement,
    })
}

/// Insert and return the events, panicking on refusal.
fn put(store: &mut MemoryStore<Blob>, name: &str, size: u64) -> Vec<StoreEvent> {
    let events = store
        .insert(key(name), Arc::new(Blob(size)))
        .expect("value fits");
    store.check_consistency();
    events
}

/// Keys evicted for capacity, in order.
fn victims(events: &[StoreEvent]) -> Vec<StoreKey> {
    events
        .iter()
        .filter_map(|event| match event {
            StoreEvent::Evicted {
                key,
                cause: EvictCause::Capacity,
                ..
            } => Some(*key),
            _ => None,
        })
        .collect()
}

fn hit(store: &mut MemoryStore<Blob>, name: &str, times: usize) {
    for _ in 0..times {
        assert!(store.get(&key(name)).is_some(), "{name} should be stored");
    }
    store.check_consistency();
}

#[test]
fn lru_evicts_least_recently_used() {
    let mut s = store(30, Replacement::Lru);
    for name in ["a", "b", "c"] {
        assert_eq!(victims(&put(&mut s, name, 10)), []);
    }
    assert_eq!(victims(&put(&mut s, "d", 10)), [key("a")]);
    assert_eq!(victims(&put(&mut s, "e", 10)), [key("b")]);
    // A value needing two victims takes the two least recently used.
    assert_eq!(victims(&put(&mut s, "f", 20)), [key("c"), key("d")]);
    assert_eq!(s.len(), 2);
    assert_eq!(s.bytes(), 30);
}

#[test]
fn lru_get_protects_an_entry_and_peek_does_not() {
    let mut s = store(30, Replacement::Lru);
    for name in ["a", "b", "c"] {
        put(&mut s, name, 10);
    }
    hit(&mut s, "a", 1);
    assert_eq!(victims(&put(&mut s, "d", 10)), [key("b")]);
    assert!(s.peek(&key("c")).is_some());
    assert!(s.contains(&key("c")));
    // peek and contains leave c the least recently used.
    assert_eq!(victims(&put(&mut s, "e", 10)), [key("c")]);
}

#[test]
fn gdsf_drops_one_large_object_before_many_small_popular_ones() {
    let mut s = store(100, Replacement::Gdsf);
    put(&mut s, "big", 60);
    for (i, name) in ["s1", "s2", "s3", "s4"].into_iter().enumerate() {
        assert_eq!(victims(&put(&mut s, name, 10)), []);
        hit(&mut s, name, i + 1);
    }
    // The big one was inserted first *and* is the largest; make it the most
    // recently used too, so only size explains its eviction.
    hit(&mut s, "big", 1);
    assert_eq!(victims(&put(&mut s, "s5", 10)), [key("big")]);
    for name in ["s1", "s2", "s3", "s4", "s5"] {
        assert!(s.contains(&key(name)), "{name} kept");
    }

    // Same sequence under LRU keeps the recently used big object and drops
    // the least recently used small ones instead.
    let mut lru = store(100, Replacement::Lru);
    put(&mut lru, "big", 60);
    for (i, name) in ["s1", "s2", "s3", "s4"].into_iter().enumerate() {
        put(&mut lru, name, 10);
        hit(&mut lru, name, i + 1);
    }
    hit(&mut lru, "big", 1);
    assert_eq!(victims(&put(&mut lru, "s5", 10)), [key("s1")]);
}

#[test]
fn gdsf_frequency_matters_among_equal_sizes() {
    let mut s = store(30, Replacement::Gdsf);
    for name in ["a", "b", "c"] {
        put(&mut s, name, 10);
    }
    hit(&mut s, "a", 3);
    hit(&mut s, "c", 1);
    // b has the lowest K (1/10); a and c were hit.
    assert_eq!(victims(&put(&mut s, "d", 10)), [key("b")]);
    // L is now 0.1; d has K = 0.2 and c has K = 0.2 but c is older.
    assert_eq!(victims(&put(&mut s, "e", 10)), [key("c")]);
}

#[test]
fn lfuda_prefers_frequent_objects_then_ages_them_out() {
    let mut s = store(30, Replacement::Lfuda);
    for name in ["a", "b", "c"] {
        put(&mut s, name, 10);
    }
    hit(&mut s, "a", 3); // K = 4
    hit(&mut s, "b", 1); // K = 2
    hit(&mut s, "c", 1); // K = 2, touched after b
                         // LRU would drop a (least recently used); LFUDA drops b: lowest K, the
                         // tie with c going to the older access.
    assert_eq!(victims(&put(&mut s, "d", 10)), [key("b")]); // L = 2, d: K = 3
    assert_eq!(victims(&put(&mut s, "e", 10)), [key("c")]); // L = 2, e: K = 3
    assert_eq!(victims(&put(&mut s, "f", 10)), [key("d")]); // L = 3, f: K = 4
    assert_eq!(victims(&put(&mut s, "g", 10)), [key("e")]); // L = 3, g: K = 4
                                                            // Dynamic aging: a (K = 4, hit long ago) now ties with the newcomers f
                                                            // and g, which got K = L + 1 with a single reference, and goes first.
    assert_eq!(victims(&put(&mut s, "h", 10)), [key("a")]);

    let mut lru = store(30, Replacement::Lru);
    for name in ["a", "b", "c"] {
        put(&mut lru, name, 10);
    }
    hit(&mut lru, "a", 3);
    hit(&mut lru, "b", 1);
    hit(&mut lru, "c", 1);
    assert_eq!(victims(&put(&mut lru, "d", 10)), [key("a")]);
}

#[test]
fn lfuda_ignores_size() {
    let mut s = store(100, Replacement::Lfuda);
    put(&mut s, "big", 60);
    hit(&mut s, "big", 2);
    for name in ["s1", "s2", "s3", "s4"] {
        put(&mut s, name, 10);
    }
    // Unlike GDSF, the popular big object stays; the oldest small one goes.
    assert_eq!(victims(&put(&mut s, "s5", 10)), [key("s1")]);
    assert!(s.contains(&key("big")));
}

#[test]
fn replacing_a_key_emits_replaced_then_admitted() {
    for policy in Replacement::ALL {
        let mut s = store(100, policy);
        put(&mut s, "a", 40);
        let old = Arc::clone(s.peek(&key("a")).expect("stored"));
        let new = Arc::new(Blob(30));
        let events = s.insert(key("a"), Arc::clone(&new)).expect("fits");
        assert_eq!(
            events,
            [
                StoreEvent::Evicted {
                    key: key("a"),
                    size: 40,
                    cause: EvictCause::Replaced
                },
                StoreEvent::Admitted {
                    key: key("a"),
                    size: 30
                },
            ],
            "{policy}"
        );
        assert!(Arc::ptr_eq(s.get(&key("a")).expect("stored"), &new));
        assert!(!Arc::ptr_eq(&old, &new));
        assert_eq!((s.len(), s.bytes()), (1, 30));
        s.check_consistency();

        // Replacing with a larger value that also needs room: Replaced,
        // then Capacity victims, then Admitted.
        put(&mut s, "b", 50);
        let events = s.insert(key("a"), Arc::new(Blob(90))).expect("fits");
        assert_eq!(
            events,
            [
                StoreEvent::Evicted {
                    key: key("a"),
                    size: 30,
                    cause: EvictCause::Replaced
                },
                StoreEvent::Evicted {
                    key: key("b"),
                    size: 50,
                    cause: EvictCause::Capacity
                },
                StoreEvent::Admitted {
                    key: key("a"),
                    size: 90
                },
            ],
            "{policy}"
        );
        s.check_consistency();
    }
}

#[test]
fn oversize_is_refused_and_changes_nothing() {
    for policy in Replacement::ALL {
        let mut s = MemoryStore::new(StoreConfig {
            capacity: 100,
            max_object_size: 50,
            replacement: policy,
        });
        assert_eq!(s.admission_limit(), 50);
        put(&mut s, "a", 50);
        put(&mut s, "b", 40);
        let a = Arc::clone(s.peek(&key("a")).expect("stored"));
        let err = s
            .insert(key("a"), Arc::new(Blob(51)))
            .expect_err("over max_object_size");
        assert_eq!(err, AdmitError::TooLarge { size: 51, max: 50 });
        assert_eq!(
            err.to_string(),
            "object of 51 bytes exceeds the maximum object size of 50 bytes"
        );
        // The old value under the same key is still there, and nothing moved.
        assert!(Arc::ptr_eq(s.peek(&key("a")).expect("kept"), &a));
        assert_eq!((s.len(), s.bytes()), (2, 90));
        s.check_consistency();

        // max_object_size larger than capacity: capacity is the limit.
        let mut small = MemoryStore::new(StoreConfig {
            capacity: 10,
            max_object_size: 1000,
            replacement: policy,
        });
        assert_eq!(
            small.insert(key("x"), Arc::new(Blob(11))),
            Err(AdmitError::TooLarge { size: 11, max: 10 })
        );
        assert!(small.is_empty());
        assert!(small.insert(key("x"), Arc::new(Blob(10))).is_ok());
    }
}

#[test]
fn invalidate_reports_cause_or_none() {
    for policy in Replacement::ALL {
        let mut s = store(100, policy);
        put(&mut s, "a", 25);
        put(&mut s, "b", 5);
        assert_eq!(s.invalidate(&key("zz"), InvalidateCause::Explicit), None);
        assert_eq!(
            s.invalidate(&key("a"), InvalidateCause::Stale),
            Some(StoreEvent::Invalidated {
                key: key("a"),
                size: 25,
                cause: InvalidateCause::Stale
            })
        );
        assert_eq!(s.invalidate(&key("a"), InvalidateCause::Stale), None);
        assert!(s.get(&key("a")).is_none());
        assert_eq!((s.len(), s.bytes()), (1, 5));
        s.check_consistency();
        // The vacated slot is reused.
        put(&mut s, "c", 1);
        put(&mut s, "d", 1);
        let keys: HashSet<_> = s.keys().copied().collect();
        assert_eq!(keys, HashSet::from([key("b"), key("c"), key("d")]));
        let mut iterated: Vec<_> = s.iter().map(|(k, v)| (*k, v.0)).collect();
        iterated.sort();
        let mut expected = vec![(key("b"), 5), (key("c"), 1), (key("d"), 1)];
        expected.sort();
        assert_eq!(iterated, expected);
    }
}

#[test]
fn zero_sized_values_and_zero_capacity() {
    for policy in Replacement::ALL {
        let mut s = store(0, policy);
        assert_eq!(
            s.insert(key("a"), Arc::new(Blob(1))),
            Err(AdmitError::TooLarge { size: 1, max: 0 })
        );
        put(&mut s, "a", 0);
        put(&mut s, "b", 0);
        assert_eq!((s.len(), s.bytes()), (2, 0));

        let mut s = store(10, policy);
        put(&mut s, "empty", 0);
        put(&mut s, "full", 10);
        hit(&mut s, "empty", 2);
        assert_eq!((s.len(), s.bytes()), (2, 10));
    }
}

#[test]
fn entry_count_limit_evicts_for_capacity() {
    for policy in Replacement::ALL {
        let config = StoreConfig {
            capacity: 1000,
            max_object_size: 1000,
            replacement: policy,
        };
        let mut s = MemoryStore::with_entry_limit(config, 2);
        put(&mut s, "a", 1);
        put(&mut s, "b", 1);
        assert_eq!(victims(&put(&mut s, "c", 1)), [key("a")], "{policy}");
        assert_eq!(s.len(), 2);
        // Replacing does not count against the limit.
        assert_eq!(victims(&put(&mut s, "c", 2)), [], "{policy}");
    }
}

#[test]
fn accessors_report_configuration() {
    let config = StoreConfig {
        capacity: 1 << 20,
        max_object_size: 4096,
        replacement: Replacement::Gdsf,
    };
    let s = MemoryStore::<Blob>::new(config);
    assert_eq!(s.capacity(), 1 << 20);
    assert_eq!(s.max_object_size(), 4096);
    assert_eq!(s.replacement(), Replacement::Gdsf);
    assert_eq!(s.config(), config);
    assert!(s.is_empty());
    assert_eq!(s.len(), 0);
    assert_eq!(s.keys().count(), 0);
    let debug = format!("{s:?}");
    assert!(debug.contains("gdsf") || debug.contains("Gdsf"), "{debug}");
}

#[test]
fn metadata_overhead_is_small() {
    let mut sizes = Vec::new();
    for policy in Replacement::ALL {
        let bytes = MemoryStore::<Blob>::metadata_bytes_per_entry_for(policy);
        eprintln!("metadata_bytes_per_entry_for({policy}) = {bytes}");
        assert!(bytes <= 128, "{policy}: {bytes} bytes per entry");
        sizes.push(bytes);
    }
    let worst = MemoryStore::<Blob>::metadata_bytes_per_entry();
    eprintln!("metadata_bytes_per_entry() = {worst}");
    assert!(worst <= 128, "{worst} bytes per entry");
    assert_eq!(Some(&worst), sizes.iter().max());
    // The value type does not matter: values sit behind an Arc.
    assert_eq!(worst, MemoryStore::<Vec<u8>>::metadata_bytes_per_entry());
    if cfg!(target_pointer_width = "64") {
        // index slot 4 + ctrl 1 + slab entry 32 + policy (LRU 8, heap item 16 + per slot 8).
        assert_eq!(sizes, [45, 61, 61]);
    }
}

// ---------------------------------------------------------------------------
// Property tests against an independent O(n) reference model.
// ---------------------------------------------------------------------------

/// Per-entry state of the reference model.
#[derive(Clone, Debug)]
struct ModelEntry {
    size: u64,
    freq: u32,
    priority: f64,
    seq: u64,
}

/// A straightforward O(n) implementation of the three policies: the victim
/// is the entry with the smallest (priority, seq), where LRU uses a constant
/// priority so that only recency (seq) counts.
struct Model {
    replacement: Replacement,
    capacity: u64,
    limit: u64,
    entries: HashMap<StoreKey, ModelEntry>,
    age: f64,
    seq: u64,
}

impl Model {
    fn new(config: StoreConfig) -> Self {
        Model {
            replacement: config.replacement,
            capacity: config.capacity,
            limit: config.capacity.min(config.max_object_size),
            entries: HashMap::new(),
            age: 0.0,
            seq: 0,
        }
    }

    fn priority(&self, freq: u32, size: u64) -> f64 {
        match self.replacement {
            Replacement::Lru => 0.0,
            Replacement::Gdsf => self.age + f64::from(freq) / size.max(1) as f64,
            Replacement::Lfuda => self.age + f64::from(freq),
        }
    }

    fn bytes(&self) -> u64 {
        self.entries.values().map(|e| e.size).sum()
    }

    fn insert(&mut self, key: StoreKey, size: u64) -> Result<Vec<StoreEvent>, AdmitError> {
        if size > self.limit {
            return Err(AdmitError::TooLarge {
                size,
                max: self.limit,
            });
        }
        let mut events = Vec::new();
        if let Some(old) = self.entries.remove(&key) {
            events.push(StoreEvent::Evicted {
                key,
                size: old.size,
                cause: EvictCause::Replaced,
            });
        }
        while self.bytes() + size > self.capacity {
            let (&victim, entry) = self
                .entries
                .iter()
                .min_by(|a, b| {
                    a.1.priority
                        .total_cmp(&b.1.priority)
                        .then(a.1.seq.cmp(&b.1.seq))
                })
                .expect("non-empty when over budget");
            let entry = entry.clone();
            self.entries.remove(&victim);
            self.age = self.age.max(entry.priority);
            events.push(StoreEvent::Evicted {
                key: victim,
                size: entry.size,
                cause: EvictCause::Capacity,
            });
        }
        let priority = self.priority(1, size);
        self.seq += 1;
        self.entries.insert(
            key,
            ModelEntry {
                size,
                freq: 1,
                priority,
                seq: self.seq,
            },
        );
        events.push(StoreEvent::Admitted { key, size });
        Ok(events)
    }

    fn get(&mut self, key: &StoreKey) -> bool {
        let Some(entry) = self.entries.get(key) else {
            return false;
        };
        let (freq, size) = (entry.freq.saturating_add(1), entry.size);
        let priority = self.priority(freq, size);
        self.seq += 1;
        let seq = self.seq;
        let entry = self.entries.get_mut(key).expect("present");
        entry.freq = freq;
        entry.priority = priority;
        entry.seq = seq;
        true
    }

    fn invalidate(&mut self, key: &StoreKey, cause: InvalidateCause) -> Option<StoreEvent> {
        let entry = self.entries.remove(key)?;
        Some(StoreEvent::Invalidated {
            key: *key,
            size: entry.size,
            cause,
        })
    }
}

#[derive(Clone, Debug)]
enum Op {
    Insert(u8, u64),
    Get(u8),
    Peek(u8),
    Invalidate(u8, InvalidateCause),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let cause = prop_oneof![
        Just(InvalidateCause::UnsafeMethod),
        Just(InvalidateCause::Stale),
        Just(InvalidateCause::NoStore),
        Just(InvalidateCause::Explicit),
    ];
    let size = prop_oneof![3 => 0u64..=40, 1 => 0u64..=400];
    prop_oneof![
        4 => (0u8..24, size).prop_map(|(k, s)| Op::Insert(k, s)),
        4 => (0u8..24).prop_map(Op::Get),
        1 => (0u8..24).prop_map(Op::Peek),
        1 => (0u8..24, cause).prop_map(|(k, c)| Op::Invalidate(k, c)),
    ]
}

fn config_strategy() -> impl Strategy<Value = StoreConfig> {
    (
        0u64..=300,
        0u64..=350,
        prop_oneof![
            Just(Replacement::Lru),
            Just(Replacement::Gdsf),
            Just(Replacement::Lfuda),
        ],
    )
        .prop_map(|(capacity, max_object_size, replacement)| StoreConfig {
            capacity,
            max_object_size,
            replacement,
        })
}

fn model_key(k: u8) -> StoreKey {
    StoreKey::get(&format!("http://prop.example/{k}"))
}

/// Apply `events` to the replayed view of the store, checking that each one
/// makes sense against it (admissions of absent keys, removals of present
/// keys with their recorded size).
fn replay(view: &mut HashMap<StoreKey, u64>, events: &[StoreEvent]) -> Result<(), TestCaseError> {
    for event in events {
        match *event {
            StoreEvent::Admitted { key, size } => {
                prop_assert!(view.insert(key, size).is_none(), "admitted twice: {event}");
            }
            StoreEvent::Evicted { key, size, .. } | StoreEvent::Invalidated { key, size, .. } => {
                prop_assert_eq!(view.remove(&key), Some(size), "removed unknown: {}", event);
            }
        }
    }
    Ok(())
}

fn run_ops(config: StoreConfig, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut store = MemoryStore::<Blob>::new(config);
    let mut model = Model::new(config);
    let mut view: HashMap<StoreKey, u64> = HashMap::new();
    let mut latest: HashMap<StoreKey, Arc<Blob>> = HashMap::new();

    for op in ops {
        match op {
            Op::Insert(k, size) => {
                let key = model_key(k);
                let value = Arc::new(Blob(size));
                let (len_before, bytes_before) = (store.len(), store.bytes());
                let was_present = store.contains(&key);
                let result = store.insert(key, Arc::clone(&value));
                prop_assert_eq!(&result, &model.insert(key, size));
                match result {
                    Err(AdmitError::TooLarge { size: s, max }) => {
                        prop_assert_eq!(s, size);
                        prop_assert_eq!(max, config.capacity.min(config.max_object_size));
                        prop_assert!(size > max);
                        prop_assert_eq!((store.len(), store.bytes()), (len_before, bytes_before));
                    }
                    Ok(events) => {
                        // Shape: [Replaced?] Capacity* Admitted.
                        let (last, rest) = events.split_last().expect("at least Admitted");
                        prop_assert_eq!(*last, StoreEvent::Admitted { key, size });
                        let mut rest = rest;
                        let mut remaining = bytes_before;
                        if was_present {
                            let replaced = rest[0];
                            let is_replaced = matches!(
                                replaced,
                                StoreEvent::Evicted {
                                    cause: EvictCause::Replaced,
                                    ..
                                }
                            );
                            prop_assert!(is_replaced, "expected Replaced, got {}", replaced);
                            prop_assert_eq!(replaced.key(), key);
                            remaining -= replaced.size();
                            rest = &rest[1..];
                        }
                        // Every capacity victim was needed: before evicting
                        // the last one, the value still did not fit.
                        for (i, victim) in rest.iter().enumerate() {
                            let is_capacity = matches!(
                                victim,
                                StoreEvent::Evicted {
                                    cause: EvictCause::Capacity,
                                    ..
                                }
                            );
                            prop_assert!(is_capacity, "expected Capacity, got {}", victim);
                            prop_assert_ne!(victim.key(), key);
                            prop_assert!(
                                remaining + size > config.capacity,
                                "victim {} not needed",
                                i
                            );
                            remaining -= victim.size();
                        }
                        prop_assert!(remaining + size <= config.capacity);
                        replay(&mut view, &events)?;
                        let stored = store.peek(&key).expect("just admitted");
                        prop_assert!(Arc::ptr_eq(stored, &value));
                        for victim in rest {
                            latest.remove(&victim.key());
                        }
                        latest.insert(key, value);
                    }
                }
            }
            Op::Get(k) => {
                let key = model_key(k);
                let found = store.get(&key).cloned();
                prop_assert_eq!(found.is_some(), model.get(&key));
                if let Some(found) = found {
                    prop_assert!(Arc::ptr_eq(&found, &latest[&key]));
                }
            }
            Op::Peek(k) => {
                let key = model_key(k);
                prop_assert_eq!(store.peek(&key).is_some(), model.entries.contains_key(&key));
                prop_assert_eq!(store.contains(&key), view.contains_key(&key));
            }
            Op::Invalidate(k, cause) => {
                let key = model_key(k);
                let event = store.invalidate(&key, cause);
                prop_assert_eq!(event, model.invalidate(&key, cause));
                if let Some(event) = event {
                    replay(&mut view, &[event])?;
                    latest.remove(&key);
                }
            }
        }

        store.check_consistency();
        prop_assert!(store.bytes() <= store.capacity());
        prop_assert_eq!(store.len(), view.len());
        prop_assert_eq!(store.len(), model.entries.len());
        prop_assert_eq!(store.bytes(), view.values().sum::<u64>());
        let keys: HashSet<StoreKey> = store.keys().copied().collect();
        let replayed: HashSet<StoreKey> = view.keys().copied().collect();
        prop_assert_eq!(keys, replayed);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Random inserts, gets, peeks and invalidations of random sizes under a
    /// random policy and budget: the budget holds after every step, the
    /// events replay to the store's exact key set, and every decision matches
    /// the O(n) reference model.
    #[test]
    fn store_matches_model_and_events_replay(config in config_strategy(),
                                             ops in prop::collection::vec(op_strategy(), 1..200)) {
        run_ops(config, ops)?;
    }
}

/// The same property, once per policy, with a budget that forces frequent
/// evictions (so each policy is exercised regardless of the random config).
#[test]
fn each_policy_matches_model_under_pressure() {
    for replacement in Replacement::ALL {
        let config = StoreConfig {
            capacity: 120,
            max_object_size: 100,
            replacement,
        };
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(256));
        runner
            .run(&prop::collection::vec(op_strategy(), 1..300), |ops| {
                run_ops(config, ops)
            })
            .unwrap_or_else(|err| panic!("{replacement}: {err}"));
    }
}
