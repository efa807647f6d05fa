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

mod image;
mod instrument;
mod qualify;
#[cfg(test)]
mod tests;

pub use image::{Image, Rewind};
pub use instrument::instrument;
