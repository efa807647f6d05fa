//! The rewrite checked against instances run fresh, and the page marks against a reference.

use proptest::prelude::*;
use wasmtime::wasmparser::{Parser, Payload};
use wasmtime::{Store, Val};

use super::image::*;
use super::instrument::*;
use super::*;

/// The reference for the instrumented sequence and the host's marks.
fn pages_slow(start: u64, len: u64) -> u64 {
    let mut m = 0u64;
    for b in start..start + len {
        m |= 1 << ((b >> PAGE_SHIFT) % 64);
    }
    m
}

#[test]
fn images_keep_only_the_pages_with_data() {
    let mut memory = vec![0u8; 16 * PAGE];
    memory[5] = 1;
    memory[9 * PAGE + 100] = 2;
    let image = Image::of(&memory);
    assert_eq!(image.kept(), 2 * PAGE + 16 * 4);
    assert!(image.matches(&memory));
    let mut scribbled = vec![7u8; 16 * PAGE];
    for p in 0..16 {
        image.restore(&mut scribbled, p);
    }
    assert_eq!(scribbled, memory);
    scribbled[3 * PAGE] = 1;
    assert!(!image.matches(&scribbled));
}

#[test]
fn page_masks() {
    assert_eq!(pages(0, 0), 0);
    assert_eq!(pages(0, 1), 1);
    assert_eq!(pages(4095, 2), 0b11);
    assert_eq!(pages(4096 * 63, 4097), 1 << 63 | 1);
    assert_eq!(pages(0, 64 * 4096), u64::MAX);
    assert_eq!(pages(5, 200 * 4096), u64::MAX);
}

proptest! {
    #[test]
    fn page_masks_match_the_bytes(start in 0u64..(1 << 20), len in 0u64..(80 * 4096)) {
        prop_assert_eq!(pages(start, len), pages_slow(start, len));
    }
}

#[test]
fn modules_that_could_keep_state_elsewhere_are_not_rewound() {
    let cases = [
        (
            r#"(module (memory (export "memory") 1) (table 1 funcref)
                (func (export "run") (result i32) (table.set (i32.const 0) (ref.null func)) (i32.const 0)))"#,
            "table.set",
        ),
        (
            r#"(module (memory (export "memory") 1) (data "x")
                (func (export "run") (result i32) (data.drop 0) (i32.const 0)))"#,
            "data.drop",
        ),
        (
            r#"(module (memory (export "memory") 1) (func $s) (start $s)
                (func (export "run") (result i32) (i32.const 0)))"#,
            "start function",
        ),
        (
            r#"(module (memory (export "memory") 1 1 shared)
                (func (export "run") (result i32) (i32.const 0)))"#,
            "subset",
        ),
        (
            r#"(module (memory (export "memory") 1) (global (export "__meshcache_dirty") i32 (i32.const 0))
                (func (export "run") (result i32) (i32.const 0)))"#,
            "reserved",
        ),
        (
            r#"(module (import "meshcache" "m" (memory 1)) (export "memory" (memory 0))
                (func (export "run") (result i32) (i32.const 0)))"#,
            "imports something",
        ),
        (
            r#"(module (memory (export "memory") 1) (global (mut funcref) (ref.null func))
                (func (export "run") (result i32) (i32.const 0)))"#,
            "reference type",
        ),
    ];
    for (text, why) in cases {
        let wasm = wat::parse_str(text).expect("parses");
        let err = instrument(&wasm).expect_err(why);
        assert!(err.0.contains(why), "{why}: {}", err.0);
    }
}

/// A random module in the rewindable subset, every function exported.
fn random_module(seed: &[u8]) -> Option<Vec<u8>> {
    let mut config = wasm_smith::Config {
        min_memories: 1,
        max_memories: 1,
        max_memory32_bytes: 8 << 16,
        memory64_enabled: false,
        threads_enabled: false,
        exceptions_enabled: false,
        gc_enabled: false,
        relaxed_simd_enabled: false,
        // `externref` needs GC types, which the applet engine does not enable.
        reference_types_enabled: false,
        max_imports: 0,
        min_types: 1,
        min_funcs: 2,
        max_funcs: 8,
        max_instructions: 200,
        allow_start_export: false,
        export_everything: true,
        canonicalize_nans: true,
        disallow_traps: true,
        ..wasm_smith::Config::default()
    };
    // Half the modules without bulk memory: with it, most also drop a segment, which keeps
    // them from being rewound at all.
    config.bulk_memory_enabled = seed.first().is_some_and(|b| b & 1 == 0);
    let mut u = arbitrary::Unstructured::new(seed);
    wasm_smith::Module::new(config, &mut u)
        .ok()
        .map(|m| m.to_bytes())
}

/// What an instance's exports hold: results of calling every exported function once (with
/// zero arguments), then every global and the memory.
struct Observed {
    results: Vec<Option<Vec<u128>>>,
    globals: Vec<Option<u128>>,
    memory: Vec<u8>,
}

/// The first page of `memory` that differs from `image` without its bit in `dirty`.
fn unmarked_page(memory: &[u8], image: &[u8], dirty: u64) -> Option<usize> {
    memory
        .chunks(PAGE)
        .zip(image.chunks(PAGE))
        .enumerate()
        .find(|(p, (now, was))| now != was && dirty & (1 << (p % 64)) == 0)
        .map(|(p, _)| p)
}

/// Instantiates `bytes` and runs its exports (the original module's names only), bounded
/// by `fuel` (0: an engine without fuel). `None` if it cannot be instantiated or a call
/// runs out of fuel.
fn observe(
    engine: &wasmtime::Engine,
    bytes: &[u8],
    names: &[String],
    fuel: u64,
) -> Option<(Observed, Option<u64>, Vec<u8>)> {
    let module = wasmtime::Module::new(engine, bytes).ok()?;
    let mut store = Store::new(engine, ());
    if fuel > 0 {
        store.set_fuel(fuel).ok()?;
    }
    let instance = wasmtime::Instance::new(&mut store, &module, &[]).ok()?;
    let memory = instance.exports(&mut store).find_map(|e| e.into_memory())?;
    let image = memory.data(&store).to_vec();
    let mut results = Vec::new();
    for name in names {
        if let Some(f) = instance.get_func(&mut store, name) {
            let ty = f.ty(&store);
            let params: Vec<Val> = ty
                .params()
                .map(|t| Val::default_for_ty(&t).unwrap_or(Val::I32(0)))
                .collect();
            let mut out: Vec<Val> = ty.results().map(|_| Val::I32(0)).collect();
            if f.call(&mut store, &params, &mut out).is_err() {
                if fuel > 0 && store.get_fuel().ok()? == 0 {
                    return None;
                }
                results.push(None);
                continue;
            }
            results.push(Some(out.iter().map(|v| bits(v).unwrap_or(0)).collect()));
        }
    }
    let mut globals = Vec::new();
    for name in names {
        if let Some(g) = instance.get_global(&mut store, name) {
            globals.push(bits(&g.get(&mut store)));
        }
    }
    let dirty = instance
        .get_global(&mut store, DIRTY)
        .and_then(|g| match g.get(&mut store) {
            Val::I64(m) => Some(m as u64),
            _ => None,
        });
    let memory = memory.data(&store).to_vec();
    Some((
        Observed {
            results,
            globals,
            memory,
        },
        dirty,
        image,
    ))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// For random modules: the rewrite never fails on a module the scan accepts, the
    /// instrumented module computes exactly what the original does, and every 4 KiB page
    /// its memory differs in afterwards has its bit in the dirty mask.
    #[test]
    fn instrumented_modules_compute_the_same_and_mark_every_page_they_change(
        seed in proptest::collection::vec(any::<u8>(), 4096..16384)
    ) {
        let Some(original) = random_module(&seed) else { return Ok(()) };
        let out = match instrument(&original) {
            Ok(out) => out,
            Err(why) => {
                prop_assert!(!why.0.contains("rewrite"), "{}", why.0);
                return Ok(());
            }
        };
        let names: Vec<String> = Parser::new(0)
            .parse_all(&original)
            .filter_map(|p| match p {
                Ok(Payload::ExportSection(e)) => Some(
                    e.into_iter()
                        .filter_map(|e| e.ok().map(|e| e.name.to_owned()))
                        .collect::<Vec<_>>(),
                ),
                _ => None,
            })
            .flatten()
            .collect();
        let mut config = wasmtime::Config::new();
        config.consume_fuel(true);
        let engine = wasmtime::Engine::new(&config).expect("engine");
        let Some((plain, _, _)) = observe(&engine, &original, &names, 200_000) else {
            return Ok(());
        };
        let (marked, dirty, image) = observe(&engine, &out.bytes, &names, 10_000_000)
            .expect("the instrumented module runs wherever the original does");
        prop_assert_eq!(&plain.results, &marked.results);
        prop_assert_eq!(&plain.globals, &marked.globals);
        prop_assert!(plain.memory == marked.memory, "memories differ");
        let dirty = dirty.expect("the dirty mask is exported");
        let unmarked = unmarked_page(&marked.memory, &image, dirty);
        prop_assert!(
            unmarked.is_none(),
            "page {:?} changed but its bit is not set (mask {:#x})", unmarked, dirty
        );
    }
}

/// One memory write of the property below, as text: an instruction of every kind that
/// writes, at a random address, with a random memarg offset, width and value.
fn write_text(kind: u8, at: u32, offset: u32, n: u32, value: i64) -> String {
    let v32 = format!("(i32.const {})", value as i32);
    let v64 = format!("(i64.const {value})");
    let vf32 = format!("(f32.reinterpret_i32 {v32})");
    let vf64 = format!("(f64.reinterpret_i64 {v64})");
    let vv = format!("(v128.const i64x2 {value} {})", !value);
    let (op, v) = match kind % 17 {
        0 => ("i32.store", v32),
        1 => ("i64.store", v64),
        2 => ("f32.store", vf32),
        3 => ("f64.store", vf64),
        4 => ("i32.store8", v32),
        5 => ("i32.store16", v32),
        6 => ("i64.store8", v64),
        7 => ("i64.store16", v64),
        8 => ("i64.store32", v64),
        9 => ("v128.store", vv),
        10 => ("v128.store8_lane 3", vv),
        11 => ("v128.store16_lane 1", vv),
        12 => ("v128.store32_lane 2", vv),
        13 => ("v128.store64_lane 1", vv),
        14 => {
            return format!(
                "(memory.fill (i32.const {at}) (i32.const {}) (i32.const {n}))",
                value as u8
            )
        }
        15 => {
            return format!("(memory.copy (i32.const {at}) (i32.const {offset}) (i32.const {n}))")
        }
        _ => {
            return format!(
                "(memory.init $p (i32.const {at}) (i32.const 0) (i32.const {}))",
                n % 17
            )
        }
    };
    let (op, lane) = op.split_once(' ').map_or((op, ""), |(o, l)| (o, l));
    format!("({op} offset={offset} {lane} (i32.const {at}) {v})")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    /// Random writes of every kind, wherever the memory allows (six 64 KiB pages, so above
    /// 256 KiB pages share bits): the instrumented module leaves memory exactly as the
    /// original does, and marks every page that differs from the image afterwards. Writes
    /// out of bounds trap in both alike.
    #[test]
    fn instrumented_writes_do_what_the_originals_do_and_mark_their_pages(
        writes in proptest::collection::vec(
            (any::<u8>(), 0u32..(6 << 16), 0u32..70_000, 0u32..80_000, any::<i64>()),
            1..12,
        )
    ) {
        let body: String = writes
            .iter()
            .map(|&(k, at, offset, n, v)| write_text(k, at, offset, n, v))
            .collect();
        let text = format!(
            r#"(module (memory (export "memory") 6)
                 (data (i32.const 100) "initial bytes")
                 (data (i32.const 300000) "above 256 KiB")
                 (data $p "passive segment!")
                 (func (export "go") {body}))"#
        );
        let original = wat::parse_str(&text).expect("parses");
        let out = instrument(&original).expect("rewindable");
        let engine = wasmtime::Engine::default();
        let names = ["go".to_string()];
        let (plain, _, _) = observe(&engine, &original, &names, 0).expect("runs");
        let (marked, dirty, image) = observe(&engine, &out.bytes, &names, 0).expect("runs");
        prop_assert_eq!(&plain.results, &marked.results);
        prop_assert!(plain.memory == marked.memory, "memories differ");
        let dirty = dirty.expect("the dirty mask is exported");
        let unmarked = unmarked_page(&marked.memory, &image, dirty);
        prop_assert!(
            unmarked.is_none(),
            "page {:?} changed but its bit is not set (mask {:#x})", unmarked, dirty
        );
    }
}

#[test]
fn a_module_without_globals_gets_the_sections_it_needs() {
    let wasm = wat::parse_str(
        r#"(module (memory (export "memory") 1)
             (func (export "run") (result i32) (i32.store (i32.const 8) (i32.const 1)) (i32.const 0)))"#,
    )
    .expect("parses");
    let out = instrument(&wasm).expect("rewindable");
    assert!(out.globals.is_empty());
    let exports: Vec<String> = Parser::new(0)
        .parse_all(&out.bytes)
        .filter_map(|p| match p {
            Ok(Payload::ExportSection(e)) => Some(
                e.into_iter()
                    .map(|e| e.unwrap().name.to_owned())
                    .collect::<Vec<_>>(),
            ),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(exports, ["memory", "run", DIRTY, RUN]);
}

/// A global of the property below: its type, whether mutable, and its initializer, which
/// may use the extended constant instructions.
fn global_text(i: usize, kind: u8, mutable: bool, seed: i64) -> String {
    let (ty, init) = match kind % 6 {
        0 => ("i32", format!("(i32.const {})", seed as i32)),
        1 => ("i64", format!("(i64.mul (i64.const {seed}) (i64.const 3))")),
        5 => (
            "i32",
            format!("(i32.sub (i32.const {}) (i32.const 9))", seed as i32),
        ),
        2 => ("f32", format!("(f32.const {})", seed as f32)),
        3 => ("f64", format!("(f64.const {})", seed as f64)),
        _ => ("v128", format!("(v128.const i64x2 {seed} {})", !seed)),
    };
    if i % 3 == 0 {
        return format!("(global i64 (i64.const {seed}))");
    }
    if mutable {
        format!("(global (mut {ty}) {init})")
    } else {
        format!("(global {ty} {init})")
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// The added entry point returns what the applet's own returns with the mask its writes
    /// set, clears the mask, and leaves every global as instantiation made it, whatever
    /// the run did to them.
    #[test]
    fn the_added_entry_point_reports_the_mask_and_resets_the_globals(
        globals in proptest::collection::vec((any::<u8>(), any::<bool>(), any::<i64>()), 0..10),
        writes in proptest::collection::vec((0u32..(4 << 16), any::<i64>()), 0..6),
        result in any::<i32>(),
    ) {
        let declared: String = globals
            .iter()
            .enumerate()
            .map(|(i, &(k, m, v))| global_text(i, k, m, v))
            .collect();
        // The run changes every mutable global (to a value of its type) and writes memory.
        let changes: String = globals
            .iter()
            .enumerate()
            .filter(|&(i, &(_, m, _))| m && i % 3 != 0)
            .map(|(i, &(k, _, v))| {
                let value = match k % 6 {
                    0 | 5 => format!("(i32.const {})", !(v as i32)),
                    1 => format!("(i64.const {})", !v),
                    2 => "(f32.const -7.5)".to_string(),
                    3 => "(f64.const 1e300)".to_string(),
                    _ => "(v128.const i64x2 1 2)".to_string(),
                };
                format!("(global.set {i} {value})")
            })
            .collect();
        let stores: String = writes
            .iter()
            .map(|&(at, v)| format!("(i64.store (i32.const {}) (i64.const {v}))", at & !7))
            .collect();
        let text = format!(
            r#"(module (memory (export "memory") 4) {declared}
                 (func (export "run") (result i32) {changes} {stores} (i32.const {result})))"#
        );
        let original = wat::parse_str(&text).expect("parses");
        let out = instrument(&original).expect("rewindable");
        let engine = wasmtime::Engine::default();
        let module = wasmtime::Module::new(&engine, &out.bytes).expect("compiles");

        // What the applet's own entry point leaves: the reference.
        let mut store = Store::new(&engine, ());
        let plain = wasmtime::Instance::new(&mut store, &module, &[]).expect("instantiates");
        let run = plain.get_typed_func::<(), i32>(&mut store, "run").expect("run");
        prop_assert_eq!(run.call(&mut store, ()).expect("runs"), result);
        let Val::I64(expected) = plain.get_global(&mut store, DIRTY).expect("mask").get(&mut store) else {
            panic!("the mask is an i64")
        };

        let mut store = Store::new(&engine, ());
        let instance = wasmtime::Instance::new(&mut store, &module, &[]).expect("instantiates");
        let memory = instance.get_memory(&mut store, "memory").expect("memory");
        let image = std::sync::OnceLock::new();
        let rewind = Rewind::new(&mut store, &instance, memory, &out.globals, &image)
            .expect("rewindable");
        for _ in 0..2 {
            let (code, marked) = rewind.run(&mut store).expect("runs");
            prop_assert_eq!(code, result);
            prop_assert_eq!(marked, expected as u64);
            prop_assert!(rewind.rewind(&mut store, marked));
            prop_assert!(rewind.is_as_made(&mut store), "not as made after a run");
        }
    }
}

#[test]
fn a_module_whose_entry_point_is_imported_gets_no_added_one() {
    let wasm = wat::parse_str(
        r#"(module (import "m" "f" (func $f (result i32))) (memory (export "memory") 1)
             (export "run" (func $f)))"#,
    )
    .expect("parses");
    let out = instrument(&wasm).expect("rewindable");
    let engine = wasmtime::Engine::default();
    let module = wasmtime::Module::new(&engine, &out.bytes).expect("compiles");
    assert!(module.get_export(RUN).is_none());
}
