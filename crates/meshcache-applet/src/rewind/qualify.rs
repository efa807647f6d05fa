//! Which modules can be rewound: a pre-scan that checks nothing but memory and mutable
//! globals can change in an instance, and learns what the rewrite needs ([`Shape`]).

use wasm_encoder::ValType;
use wasmtime::wasmparser::{self, Operator, Parser, Payload, TypeRef, Validator, WasmFeatures};

use super::RESERVED;
use crate::abi;

/// Why a module is run in a fresh instance per hit rather than rewound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotRewindable(pub String);

/// What the pre-scan learned.
pub(super) struct Shape {
    /// Parameter counts by type index (`None`: not a function type).
    pub(super) params: Vec<Option<u32>>,
    /// By type index: whether it is the entry point's type, `() -> i32`.
    pub(super) entry_typed: Vec<bool>,
    /// Functions imported (they come first in the function index space).
    pub(super) imported_functions: u32,
    /// Type index of each defined function, in order.
    pub(super) defined: Vec<u32>,
    /// Defined globals: whether each is mutable.
    pub(super) mutable: Vec<bool>,
    /// The initializer of each mutable global (index, constant expression without its `end`).
    pub(super) initial: Vec<(u32, Vec<u8>)>,
    /// The function exported as [`abi::ENTRY`], if the module exports one.
    pub(super) entry: Option<u32>,
}

/// The features a rewindable module may use: WebAssembly 2.0 without threads, several or
/// 64-bit memories, exceptions, GC or memory control.
pub(super) fn features() -> WasmFeatures {
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

pub(super) fn no(why: impl Into<String>) -> NotRewindable {
    NotRewindable(why.into())
}

/// Checks that nothing but memory and mutable globals can change in an instance of `bytes`, and
/// learns what the rewrite needs.
pub(super) fn scan(bytes: &[u8]) -> Result<Shape, NotRewindable> {
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
pub(super) enum Write {
    /// A store of `width` bytes at the address below a value of `value` type.
    Store {
        value: ValType,
        width: u64,
        offset: u64,
    },
    /// `memory.fill` / `.copy` / `.init`: destination, one more operand, length.
    Range,
}

pub(super) fn write_of(op: &Operator<'_>) -> Option<Write> {
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
