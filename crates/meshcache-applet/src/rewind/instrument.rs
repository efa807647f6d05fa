//! The rewrite: every memory write followed by the marking of its pages, the mutable globals
//! exported, and the added entry point that clears the mask and resets the globals.

use wasm_encoder::reencode::{self, Reencode, RoundtripReencoder};
use wasm_encoder::{ConstExpr, ExportKind, GlobalType, Instruction as I, SectionId, ValType};
use wasmtime::wasmparser::{self, FunctionBody, Parser, Validator};

use super::qualify::{features, no, scan, write_of, NotRewindable, Shape, Write};
use super::{DIRTY, PAGE_SHIFT, RESERVED, RUN};

/// A module instrumented for rewinding: the bytes to compile, and the exports that name its
/// mutable globals.
#[derive(Debug)]
pub struct Instrumented {
    /// The module to compile instead of the original.
    pub bytes: Vec<u8>,
    /// Export names of the mutable globals, in index order.
    pub globals: Vec<String>,
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
