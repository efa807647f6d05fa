//! Rewinding an instance: putting it back exactly as instantiation left it, so that the next hit
//! can run in it without anything of the last run showing.
//!
//! A fresh instance per hit costs wasmtime a store, an instance from the pool, and resetting the
//! memory the run used when it goes back (about 2.6 µs for the `null` applet, twice that inside a
//! busy proxy). Most of that is undoing what a run *might* have changed. What it did change is
//! small and can be known exactly:
//!
//! - **Memory.** Before compiling, every instruction that writes the applet's memory (the
//!   stores, SIMD lane stores, `memory.fill`, `memory.copy`, `memory.init`) is followed by a few
//!   instructions that set, in a global the module cannot name (it is added after its own), the
//!   bit of each 4 KiB page written: page `p` is bit `p mod 64` ([`pages`] is the same mapping
//!   for the host's own writes). Rewinding copies back, from the image taken right after
//!   instantiation ([`Image`], sparse), every page whose bit is set (and, for a memory above
//!   256 KiB, the pages that share the bit). A memory that grew is not rewound.
//! - **Globals.** Every mutable global is exported under a reserved name and set back to its
//!   value after instantiation.
//! - **Everything else is left unchanged by construction.** A module qualifies only if nothing
//!   else in it can change: no table writes (`table.set`, `.grow`, `.fill`, `.copy`, `.init`),
//!   no `data.drop` / `elem.drop`, no threads or atomics, one 32-bit memory of its own, no
//!   imported globals, tables or memories, no mutable global of a reference type, no start
//!   function, and no export named with the reserved prefix. Other modules run in a fresh
//!   instance per hit, as before.
//!
//! The instrumentation costs the applet a few instructions per store; the applets this proxy
//! ships store little per run. Only a run that completed normally is rewound: a trap, a limit
//! or an invalid result releases the instance.

use std::sync::Arc;

use crate::abi;

use wasm_encoder::reencode::{self, Reencode, RoundtripReencoder};
use wasm_encoder::{ConstExpr, ExportKind, GlobalType, Instruction as I, SectionId, ValType};
use wasmtime::wasmparser::{
    self, FunctionBody, Operator, Parser, Payload, TypeRef, Validator, WasmFeatures,
};
#[cfg(test)]
use wasmtime::{Global, Val};
use wasmtime::{Instance, Memory, Store, TypedFunc};

/// Bytes per tracked page.
pub const PAGE: usize = 4096;
/// log2 of [`PAGE`].
const PAGE_SHIFT: i64 = 12;
/// The exported dirty-page mask.
pub const DIRTY: &str = "__meshcache_dirty";
/// The added entry point: calls the applet's [`abi::ENTRY`] and returns its result with the
/// dirty-page mask, having cleared the mask and set every mutable global back to its initial
/// value (`() -> (i32, i64)`).
pub const RUN: &str = "__meshcache_run";
/// Prefix of every name the instrumentation exports (a module exporting one is not rewound).
pub const RESERVED: &str = "__meshcache_";

/// The dirty-page mask of the bytes `start .. start + len`: bit `p mod 64` for every 4 KiB page
/// `p` they touch (all bits from 64 pages on). Zero bytes touch nothing.
pub fn pages(start: u64, len: u64) -> u64 {
    if len == 0 {
        return 0;
    }
    let first = start >> PAGE_SHIFT;
    let last = (start + (len - 1)) >> PAGE_SHIFT;
    let span = last - first;
    if span >= 63 {
        return u64::MAX;
    }
    ((2u64 << span) - 1).rotate_left((first % 64) as u32)
}

/// Why a module is run in a fresh instance per hit rather than rewound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotRewindable(pub String);

/// A module instrumented for rewinding: the bytes to compile, and the exports that name its
/// mutable globals.
#[derive(Debug)]
pub struct Instrumented {
    /// The module to compile instead of the original.
    pub bytes: Vec<u8>,
    /// Export names of the mutable globals, in index order.
    pub globals: Vec<String>,
}

/// What the pre-scan learned.
struct Shape {
    /// Parameter counts by type index (`None`: not a function type).
    params: Vec<Option<u32>>,
    /// By type index: whether it is the entry point's type, `() -> i32`.
    entry_typed: Vec<bool>,
    /// Functions imported (they come first in the function index space).
    imported_functions: u32,
    /// Type index of each defined function, in order.
    defined: Vec<u32>,
    /// Defined globals: whether each is mutable.
    mutable: Vec<bool>,
    /// The initializer of each mutable global (index, constant expression without its `end`).
    initial: Vec<(u32, Vec<u8>)>,
    /// The function exported as [`abi::ENTRY`], if the module exports one.
    entry: Option<u32>,
}

/// The features a rewindable module may use: WebAssembly 2.0 without threads, several or
/// 64-bit memories, exceptions, GC or memory control.
fn features() -> WasmFeatures {
    WasmFeatures::MUTABLE_GLOBAL
        | WasmFeatures::SATURATING_FLOAT_TO_INT
        | WasmFeatures::SIGN_EXTENSION
        | WasmFeatures::REFERENCE_TYPES
        | WasmFeatures::MULTI_VALUE
        | WasmFeatures::BULK_MEMORY
        | WasmFeatures::SIMD
        | WasmFeatures::RELAXED_SIMD
        | WasmFeatures::TAIL_CALL
        | WasmFeatures::FLOATS
        | WasmFeatures::EXTENDED_CONST
}

fn no(why: impl Into<String>) -> NotRewindable {
    NotRewindable(why.into())
}

/// Checks that nothing but memory and mutable globals can change in an instance of `bytes`, and
/// learns what the rewrite needs.
fn scan(bytes: &[u8]) -> Result<Shape, NotRewindable> {
    Validator::new_with_features(features())
        .validate_all(bytes)
        .map_err(|e| no(format!("uses more than the rewindable subset: {e}")))?;
    let mut shape = Shape {
        params: Vec::new(),
        entry_typed: Vec::new(),
        imported_functions: 0,
        defined: Vec::new(),
        mutable: Vec::new(),
        initial: Vec::new(),
        entry: None,
    };
    let mut memories = 0;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(|e| no(e.to_string()))? {
            Payload::TypeSection(types) => {
                for group in types.into_iter_err_on_gc_types() {
                    let ty = group.map_err(|e| no(e.to_string()))?;
                    shape.params.push(Some(ty.params().len() as u32));
                    shape
                        .entry_typed
                        .push(ty.params().is_empty() && ty.results() == [wasmparser::ValType::I32]);
                }
            }
            Payload::ImportSection(imports) => {
                for import in imports.into_imports() {
                    let import = import.map_err(|e| no(e.to_string()))?;
                    if !matches!(import.ty, TypeRef::Func(_)) {
                        return Err(no("it imports something other than functions"));
                    }
                    shape.imported_functions += 1;
                }
            }
            Payload::FunctionSection(funcs) => {
                for f in funcs {
                    shape.defined.push(f.map_err(|e| no(e.to_string()))?);
                }
            }
            Payload::TableSection(tables) => {
                for t in tables {
                    t.map_err(|e| no(e.to_string()))?;
                }
            }
            Payload::MemorySection(mems) => {
                for m in mems {
                    let m = m.map_err(|e| no(e.to_string()))?;
                    if m.memory64 || m.shared {
                        return Err(no("its memory is 64-bit or shared"));
                    }
                    memories += 1;
                }
            }
            Payload::GlobalSection(globals) => {
                for g in globals {
                    let g = g.map_err(|e| no(e.to_string()))?;
                    let numeric = matches!(
                        g.ty.content_type,
                        wasmparser::ValType::I32
                            | wasmparser::ValType::I64
                            | wasmparser::ValType::F32
                            | wasmparser::ValType::F64
                            | wasmparser::ValType::V128
                    );
                    if g.ty.mutable && !numeric {
                        return Err(no("it has a mutable global of a reference type"));
                    }
                    if g.ty.mutable {
                        let mut init = g.init_expr.get_binary_reader();
                        let expr = init
                            .read_bytes(init.bytes_remaining())
                            .map_err(|e| no(e.to_string()))?;
                        // A constant expression ends with `end` (0x0b); the rest are
                        // instructions a function body may hold as they are.
                        let Some((0x0b, ops)) = expr.split_last() else {
                            return Err(no("a global's initializer does not end with end"));
                        };
                        shape
                            .initial
                            .push((shape.mutable.len() as u32, ops.to_vec()));
                    }
                    shape.mutable.push(g.ty.mutable);
                }
            }
            Payload::ExportSection(exports) => {
                for e in exports {
                    let e = e.map_err(|e| no(e.to_string()))?;
                    if e.name.starts_with(RESERVED) {
                        return Err(no(format!("it exports the reserved name {}", e.name)));
                    }
                    if e.name == abi::ENTRY && e.kind == wasmparser::ExternalKind::Func {
                        shape.entry = Some(e.index);
                    }
                }
            }
            Payload::StartSection { .. } => return Err(no("it has a start function")),
            Payload::CodeSectionEntry(body) => {
                let mut ops = body.get_operators_reader().map_err(|e| no(e.to_string()))?;
                while !ops.eof() {
                    let op = ops.read().map_err(|e| no(e.to_string()))?;
                    if let Some(what) = forbidden(&op) {
                        return Err(no(format!("it uses {what}")));
                    }
                }
            }
            _ => {}
        }
    }
    if memories != 1 {
        return Err(no("it does not define exactly one memory"));
    }
    Ok(shape)
}

/// Instructions that change an instance's state other than memory and globals.
fn forbidden(op: &Operator<'_>) -> Option<&'static str> {
    Some(match op {
        Operator::TableSet { .. } => "table.set",
        Operator::TableGrow { .. } => "table.grow",
        Operator::TableFill { .. } => "table.fill",
        Operator::TableCopy { .. } => "table.copy",
        Operator::TableInit { .. } => "table.init",
        Operator::ElemDrop { .. } => "elem.drop",
        Operator::DataDrop { .. } => "data.drop",
        _ => return None,
    })
}

/// What an instruction writes to memory, for the rewrite.
enum Write {
    /// A store of `width` bytes at the address below a value of `value` type.
    Store {
        value: ValType,
        width: u64,
        offset: u64,
    },
    /// `memory.fill` / `.copy` / `.init`: destination, one more operand, length.
    Range,
}

fn write_of(op: &Operator<'_>) -> Option<Write> {
    use ValType::{F32, F64, I32, I64, V128};
    let (value, width, memarg) = match op {
        Operator::I32Store { memarg } => (I32, 4, memarg),
        Operator::I64Store { memarg } => (I64, 8, memarg),
        Operator::F32Store { memarg } => (F32, 4, memarg),
        Operator::F64Store { memarg } => (F64, 8, memarg),
        Operator::I32Store8 { memarg } => (I32, 1, memarg),
        Operator::I32Store16 { memarg } => (I32, 2, memarg),
        Operator::I64Store8 { memarg } => (I64, 1, memarg),
        Operator::I64Store16 { memarg } => (I64, 2, memarg),
        Operator::I64Store32 { memarg } => (I64, 4, memarg),
        Operator::V128Store { memarg } => (V128, 16, memarg),
        Operator::V128Store8Lane { memarg, .. } => (V128, 1, memarg),
        Operator::V128Store16Lane { memarg, .. } => (V128, 2, memarg),
        Operator::V128Store32Lane { memarg, .. } => (V128, 4, memarg),
        Operator::V128Store64Lane { memarg, .. } => (V128, 8, memarg),
        Operator::MemoryFill { .. } | Operator::MemoryCopy { .. } | Operator::MemoryInit { .. } => {
            return Some(Write::Range)
        }
        _ => return None,
    };
    Some(Write::Store {
        value,
        width,
        offset: memarg.offset,
    })
}

/// Rewrites `bytes` for rewinding, or says why it cannot be.
pub fn instrument(bytes: &[u8]) -> Result<Instrumented, NotRewindable> {
    let shape = scan(bytes)?;
    let dirty = shape.mutable.len() as u32;
    let globals: Vec<String> = shape
        .mutable
        .iter()
        .enumerate()
        .filter(|(_, m)| **m)
        .map(|(i, _)| format!("{RESERVED}global_{i}"))
        .collect();
    // The added entry point, for a module whose entry point is one of its own functions.
    let run = shape
        .entry
        .filter(|&f| f >= shape.imported_functions)
        .and_then(|f| {
            let ty = *shape.defined.get((f - shape.imported_functions) as usize)?;
            shape.entry_typed.get(ty as usize)?.then_some(f)
        })
        .map(|entry| Run {
            entry,
            ty: shape.params.len() as u32,
            index: shape.imported_functions + shape.defined.len() as u32,
        });
    let mut rewriter = Rewriter {
        shape: &shape,
        dirty,
        run,
        next_function: 0,
        globals_done: false,
        exports_done: false,
    };
    let mut module = wasm_encoder::Module::new();
    rewriter
        .parse_core_module(&mut module, Parser::new(0), bytes)
        .map_err(|e| no(format!("cannot rewrite it: {e}")))?;
    let bytes = module.finish();
    // The rewrite must itself be valid: a rewrite the compiler would refuse is a bug here, and
    // the module is then run without it.
    Validator::new_with_features(features())
        .validate_all(&bytes)
        .map_err(|e| no(format!("the rewrite is invalid: {e}")))?;
    Ok(Instrumented { bytes, globals })
}

struct Rewriter<'s> {
    shape: &'s Shape,
    /// Index of the added dirty-page global.
    dirty: u32,
    /// The added entry point, if the module has an entry point of its own.
    run: Option<Run>,
    next_function: usize,
    globals_done: bool,
    exports_done: bool,
}

/// Sections in the order the binary format requires.
fn rank(id: Option<SectionId>) -> u8 {
    match id {
        Some(SectionId::Custom) => 0,
        Some(SectionId::Type) => 1,
        Some(SectionId::Import) => 2,
        Some(SectionId::Function) => 3,
        Some(SectionId::Table) => 4,
        Some(SectionId::Memory) => 5,
        Some(SectionId::Tag) => 6,
        Some(SectionId::Global) => 7,
        Some(SectionId::Export) => 8,
        Some(SectionId::Start) => 9,
        Some(SectionId::Element) => 10,
        Some(SectionId::DataCount) => 11,
        Some(SectionId::Code) => 12,
        Some(SectionId::Data) => 13,
        None => 14,
    }
}

/// Where the added entry point [`RUN`] goes.
#[derive(Clone, Copy)]
struct Run {
    /// The function it calls, the module's [`abi::ENTRY`].
    entry: u32,
    /// Its type index, `() -> (i32, i64)`, added after the module's types.
    ty: u32,
    /// Its function index, after the module's functions.
    index: u32,
}

impl Rewriter<'_> {
    /// The body of [`RUN`]: the entry point's result, then the mask taken and cleared, then
    /// every mutable global set to its initializer's value again (the initializers are
    /// constants: they may read only imported globals, and a rewindable module imports none).
    fn run_body(&self, run: Run) -> wasm_encoder::Function {
        let mut f = wasm_encoder::Function::new([]);
        f.instruction(&I::Call(run.entry));
        f.instruction(&I::GlobalGet(self.dirty));
        f.instruction(&I::I64Const(0));
        f.instruction(&I::GlobalSet(self.dirty));
        for (global, ops) in &self.shape.initial {
            f.raw(ops.iter().copied());
            f.instruction(&I::GlobalSet(*global));
        }
        f.instruction(&I::End);
        f
    }

    fn add_globals(&mut self, globals: &mut wasm_encoder::GlobalSection) {
        globals.global(
            GlobalType {
                val_type: ValType::I64,
                mutable: true,
                shared: false,
            },
            &ConstExpr::i64_const(0),
        );
        self.globals_done = true;
    }

    fn add_exports(&mut self, exports: &mut wasm_encoder::ExportSection) {
        exports.export(DIRTY, ExportKind::Global, self.dirty);
        if let Some(run) = self.run {
            exports.export(RUN, ExportKind::Func, run.index);
        }
        for (i, m) in self.shape.mutable.iter().enumerate() {
            if *m {
                exports.export(
                    &format!("{RESERVED}global_{i}"),
                    ExportKind::Global,
                    i as u32,
                );
            }
        }
        self.exports_done = true;
    }
}

type Failed = reencode::Error<std::convert::Infallible>;

impl Reencode for Rewriter<'_> {
    type Error = std::convert::Infallible;

    fn intersperse_section_hook(
        &mut self,
        module: &mut wasm_encoder::Module,
        _after: Option<SectionId>,
        before: Option<SectionId>,
    ) -> Result<(), Failed> {
        if !self.globals_done && rank(before) > rank(Some(SectionId::Global)) {
            let mut globals = wasm_encoder::GlobalSection::new();
            self.add_globals(&mut globals);
            module.section(&globals);
        }
        if !self.exports_done && rank(before) > rank(Some(SectionId::Export)) {
            let mut exports = wasm_encoder::ExportSection::new();
            self.add_exports(&mut exports);
            module.section(&exports);
        }
        Ok(())
    }

    fn parse_type_section(
        &mut self,
        types: &mut wasm_encoder::TypeSection,
        section: wasmparser::TypeSectionReader<'_>,
    ) -> Result<(), Failed> {
        reencode::utils::parse_type_section(self, types, section)?;
        if self.run.is_some() {
            types.ty().function([], [ValType::I32, ValType::I64]);
        }
        Ok(())
    }

    fn parse_function_section(
        &mut self,
        functions: &mut wasm_encoder::FunctionSection,
        section: wasmparser::FunctionSectionReader<'_>,
    ) -> Result<(), Failed> {
        reencode::utils::parse_function_section(self, functions, section)?;
        if let Some(run) = self.run {
            functions.function(run.ty);
        }
        Ok(())
    }

    fn parse_code_section(
        &mut self,
        code: &mut wasm_encoder::CodeSection,
        section: wasmparser::CodeSectionReader<'_>,
    ) -> Result<(), Failed> {
        reencode::utils::parse_code_section(self, code, section)?;
        if let Some(run) = self.run {
            code.function(&self.run_body(run));
        }
        Ok(())
    }

    fn parse_global_section(
        &mut self,
        globals: &mut wasm_encoder::GlobalSection,
        section: wasmparser::GlobalSectionReader<'_>,
    ) -> Result<(), Failed> {
        reencode::utils::parse_global_section(self, globals, section)?;
        self.add_globals(globals);
        Ok(())
    }

    fn parse_export_section(
        &mut self,
        exports: &mut wasm_encoder::ExportSection,
        section: wasmparser::ExportSectionReader<'_>,
    ) -> Result<(), Failed> {
        reencode::utils::parse_export_section(self, exports, section)?;
        self.add_exports(exports);
        Ok(())
    }

    fn parse_function_body(
        &mut self,
        code: &mut wasm_encoder::CodeSection,
        func: FunctionBody<'_>,
    ) -> Result<(), Failed> {
        let ty = self.shape.defined[self.next_function];
        self.next_function += 1;
        let params = self.shape.params[ty as usize].unwrap_or(0);
        let mut locals = Vec::new();
        let mut declared = 0u32;
        for pair in func.get_locals_reader()? {
            let (n, ty) = pair?;
            declared += n;
            locals.push((n, RoundtripReencoder.val_type(ty)?));
        }
        // The scratch locals, after the function's own: three i32, two i64, then one of each
        // other value type a store can take.
        let base = params + declared;
        let scratch = Scratch {
            a: base,
            b: base + 1,
            n: base + 2,
            e: base + 3,
            f: base + 4,
            i64v: base + 5,
            f32v: base + 6,
            f64v: base + 7,
            v128v: base + 8,
        };
        let simd = {
            let mut ops = func.get_operators_reader()?;
            let mut any = false;
            while !ops.eof() {
                if let Some(Write::Store {
                    value: ValType::V128,
                    ..
                }) = write_of(&ops.read()?)
                {
                    any = true;
                }
            }
            any
        };
        locals.push((3, ValType::I32));
        locals.push((3, ValType::I64));
        locals.push((1, ValType::F32));
        locals.push((1, ValType::F64));
        if simd {
            locals.push((1, ValType::V128));
        }
        let mut f = wasm_encoder::Function::new(locals);
        let mut ops = func.get_operators_reader()?;
        while !ops.eof() {
            let op = ops.read()?;
            let write = write_of(&op);
            let ins = RoundtripReencoder.instruction(op)?;
            match write {
                None => {
                    f.instruction(&ins);
                }
                Some(Write::Store {
                    value,
                    width,
                    offset,
                }) => {
                    let v = scratch.value(value);
                    f.instruction(&I::LocalSet(v));
                    f.instruction(&I::LocalTee(scratch.a));
                    f.instruction(&I::LocalGet(v));
                    f.instruction(&ins);
                    self.mark_store(&mut f, &scratch, width, offset);
                }
                Some(Write::Range) => {
                    f.instruction(&I::LocalSet(scratch.n));
                    f.instruction(&I::LocalSet(scratch.b));
                    f.instruction(&I::LocalTee(scratch.a));
                    f.instruction(&I::LocalGet(scratch.b));
                    f.instruction(&I::LocalGet(scratch.n));
                    f.instruction(&ins);
                    self.mark_range(&mut f, &scratch);
                }
            }
        }
        code.function(&f);
        Ok(())
    }
}

/// Scratch locals of one function.
struct Scratch {
    /// i32: the address (destination).
    a: u32,
    /// i32: a bulk instruction's middle operand.
    b: u32,
    /// i32: a bulk instruction's length.
    n: u32,
    /// i64: the effective address.
    e: u32,
    /// i64: the first page of a range.
    f: u32,
    i64v: u32,
    f32v: u32,
    f64v: u32,
    v128v: u32,
}

impl Scratch {
    fn value(&self, ty: ValType) -> u32 {
        match ty {
            ValType::I32 => self.b,
            ValType::I64 => self.i64v,
            ValType::F32 => self.f32v,
            ValType::F64 => self.f64v,
            _ => self.v128v,
        }
    }
}

impl Rewriter<'_> {
    /// After a store of `width` bytes at `a + offset`: the bits of its first and last pages.
    fn mark_store(&self, f: &mut wasm_encoder::Function, s: &Scratch, width: u64, offset: u64) {
        f.instruction(&I::I64Const(1));
        f.instruction(&I::LocalGet(s.a));
        f.instruction(&I::I64ExtendI32U);
        if offset != 0 {
            f.instruction(&I::I64Const(offset as i64));
            f.instruction(&I::I64Add);
        }
        if width > 1 {
            f.instruction(&I::LocalTee(s.e));
        }
        f.instruction(&I::I64Const(PAGE_SHIFT));
        f.instruction(&I::I64ShrU);
        f.instruction(&I::I64Shl);
        if width > 1 {
            f.instruction(&I::I64Const(1));
            f.instruction(&I::LocalGet(s.e));
            f.instruction(&I::I64Const(width as i64 - 1));
            f.instruction(&I::I64Add);
            f.instruction(&I::I64Const(PAGE_SHIFT));
            f.instruction(&I::I64ShrU);
            f.instruction(&I::I64Shl);
            f.instruction(&I::I64Or);
        }
        self.or_into_dirty(f);
    }

    /// After a bulk write of `n` bytes at `a`: the bits of every page in between, as [`pages`].
    fn mark_range(&self, f: &mut wasm_encoder::Function, s: &Scratch) {
        // first = a >> 12
        f.instruction(&I::LocalGet(s.a));
        f.instruction(&I::I64ExtendI32U);
        f.instruction(&I::I64Const(PAGE_SHIFT));
        f.instruction(&I::I64ShrU);
        f.instruction(&I::LocalSet(s.f));
        // span = ((a + n - 1) >> 12) - first
        f.instruction(&I::LocalGet(s.a));
        f.instruction(&I::I64ExtendI32U);
        f.instruction(&I::LocalGet(s.n));
        f.instruction(&I::I64ExtendI32U);
        f.instruction(&I::I64Add);
        f.instruction(&I::I64Const(1));
        f.instruction(&I::I64Sub);
        f.instruction(&I::I64Const(PAGE_SHIFT));
        f.instruction(&I::I64ShrU);
        f.instruction(&I::LocalGet(s.f));
        f.instruction(&I::I64Sub);
        f.instruction(&I::LocalSet(s.e));
        // span < 63 ? rotl((2 << span) - 1, first) : all
        f.instruction(&I::I64Const(2));
        f.instruction(&I::LocalGet(s.e));
        f.instruction(&I::I64Shl);
        f.instruction(&I::I64Const(1));
        f.instruction(&I::I64Sub);
        f.instruction(&I::LocalGet(s.f));
        f.instruction(&I::I64Rotl);
        f.instruction(&I::I64Const(-1));
        f.instruction(&I::LocalGet(s.e));
        f.instruction(&I::I64Const(63));
        f.instruction(&I::I64LtU);
        f.instruction(&I::Select);
        // n == 0 writes nothing
        f.instruction(&I::I64Const(0));
        f.instruction(&I::LocalGet(s.n));
        f.instruction(&I::Select);
        self.or_into_dirty(f);
    }

    fn or_into_dirty(&self, f: &mut wasm_encoder::Function) {
        f.instruction(&I::GlobalGet(self.dirty));
        f.instruction(&I::I64Or);
        f.instruction(&I::GlobalSet(self.dirty));
    }
}

/// A memory as instantiation leaves it, kept sparse: only its pages that are not all zeros
/// (those of the data segments), so a module declaring a large memory costs no more to keep
/// than its data. Shared by all instances of the module: instantiating a module without a start
/// function always gives the same memory.
#[derive(Debug)]
pub struct Image {
    /// Bytes.
    len: usize,
    /// Per page: where its bytes are in `pages`, or [`ZERO`].
    index: Vec<u32>,
    /// The non-zero pages, one after the other.
    pages: Vec<u8>,
}

/// An all-zero page in [`Image::index`].
const ZERO: u32 = u32::MAX;

impl Image {
    /// The image of `memory` (whose length is a whole number of pages).
    pub fn of(memory: &[u8]) -> Self {
        let mut index = Vec::with_capacity(memory.len() / PAGE);
        let mut pages = Vec::new();
        for page in memory.chunks(PAGE) {
            if page.iter().all(|&b| b == 0) {
                index.push(ZERO);
            } else {
                index.push((pages.len() / PAGE) as u32);
                pages.extend_from_slice(page);
            }
        }
        Image {
            len: memory.len(),
            index,
            pages,
        }
    }

    /// Puts page `p` of `memory` back as it is here.
    fn restore(&self, memory: &mut [u8], p: usize) {
        let to = &mut memory[p * PAGE..(p + 1) * PAGE];
        match self.index[p] {
            ZERO => to.fill(0),
            i => {
                let at = i as usize * PAGE;
                to.copy_from_slice(&self.pages[at..at + PAGE]);
            }
        }
    }

    /// Bytes it keeps (the non-zero pages and the index).
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.pages.len() + self.index.len() * 4
    }

    /// Whether `memory` is exactly this image.
    #[cfg(test)]
    fn matches(&self, memory: &[u8]) -> bool {
        memory.len() == self.len
            && memory
                .chunks(PAGE)
                .enumerate()
                .all(|(p, page)| match self.index[p] {
                    ZERO => page.iter().all(|&b| b == 0),
                    i => page == &self.pages[i as usize * PAGE..(i as usize + 1) * PAGE],
                })
    }
}

/// What runs and rewinds one instance: its entry point [`RUN`] (which hands back the dirty
/// mask and resets the mutable globals itself, so that a run enters the instance once), its
/// memory and the module's memory image.
pub struct Rewind {
    run: TypedFunc<(), (i32, i64)>,
    memory: Memory,
    image: Arc<Image>,
    /// The mask and the mutable globals with their values after instantiation, to check that a
    /// rewound instance is as made.
    #[cfg(test)]
    dirty: Global,
    #[cfg(test)]
    globals: Vec<(Global, Val)>,
}

impl Rewind {
    /// Learns how to run and rewind a just-made instance. `image` is the module's memory
    /// image, taken from this instance if it is the module's first. `globals` names the
    /// exports of its mutable globals ([`Instrumented::globals`]): the added entry point resets
    /// them itself, so only tests read them, to check that a rewound instance is as made.
    pub fn new<T>(
        store: &mut Store<T>,
        instance: &Instance,
        memory: Memory,
        globals: &[String],
        image: &std::sync::OnceLock<Arc<Image>>,
    ) -> Option<Self> {
        let run = instance
            .get_typed_func::<(), (i32, i64)>(&mut *store, RUN)
            .ok()?;
        #[cfg(test)]
        let (dirty, globals) = {
            let dirty = instance.get_global(&mut *store, DIRTY)?;
            let mut saved = Vec::with_capacity(globals.len());
            for name in globals {
                let g = instance.get_global(&mut *store, name)?;
                let v = g.get(&mut *store);
                saved.push((g, v));
            }
            (dirty, saved)
        };
        #[cfg(not(test))]
        let _ = globals; // See above: read in tests only.
        let image = image
            .get_or_init(|| Arc::new(Image::of(memory.data(&*store))))
            .clone();
        if image.len != memory.data_size(&*store) {
            return None;
        }
        Some(Rewind {
            run,
            memory,
            image,
            #[cfg(test)]
            dirty,
            #[cfg(test)]
            globals,
        })
    }

    /// Runs the applet's entry point: its result, and the mask of the pages it wrote (its
    /// mutable globals are then back to their initial values already).
    pub fn run<T: 'static>(&self, store: &mut Store<T>) -> wasmtime::Result<(i32, u64)> {
        let (code, marked) = self.run.call(&mut *store, ())?;
        Ok((code, marked as u64))
    }

    /// Puts the memory of an instance that ran through [`run`](Self::run) back as it was made:
    /// the pages of `mask` (those the applet wrote, with those the host wrote). False if it
    /// cannot be (its memory grew): the instance must then be released.
    pub fn rewind<T>(&self, store: &mut Store<T>, mask: u64) -> bool {
        let data = self.memory.data_mut(&mut *store);
        if data.len() != self.image.len {
            return false;
        }
        let pages = data.len() / PAGE;
        let mut bits = mask;
        while bits != 0 {
            let bit = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            for p in (bit..pages).step_by(64) {
                self.image.restore(data, p);
            }
        }
        true
    }

    /// Whether the instance holds exactly what instantiation gave it: every byte of memory,
    /// every mutable global, and an empty dirty mask (for tests).
    #[cfg(test)]
    pub fn is_as_made<T>(&self, store: &mut Store<T>) -> bool {
        self.image.matches(self.memory.data(&*store))
            && matches!(self.dirty.get(&mut *store), Val::I64(0))
            && self.globals.iter().all(|(g, v)| {
                let now = g.get(&mut *store);
                bits(&now).is_some() && bits(&now) == bits(v)
            })
    }
}

/// A numeric value's bits, for comparing values (NaNs included) in tests.
#[cfg(test)]
fn bits(v: &Val) -> Option<u128> {
    Some(match v {
        Val::I32(x) => *x as u32 as u128,
        Val::I64(x) => *x as u64 as u128,
        Val::F32(x) => *x as u128,
        Val::F64(x) => *x as u128,
        Val::V128(x) => x.as_u128(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
                return format!(
                    "(memory.copy (i32.const {at}) (i32.const {offset}) (i32.const {n}))"
                )
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
}
