//! Putting an instance back: the memory as instantiation left it ([`Image`]), and the
//! per-instance state that copies back the pages a run wrote and resets the globals ([`Rewind`]).

use std::sync::Arc;

#[cfg(test)]
use wasmtime::{Global, Val};
use wasmtime::{Instance, Memory, Store, TypedFunc};

#[cfg(test)]
use super::DIRTY;
use super::{PAGE, RUN};

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
    pub(super) fn restore(&self, memory: &mut [u8], p: usize) {
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
    pub(super) fn kept(&self) -> usize {
        self.pages.len() + self.index.len() * 4
    }

    /// Whether `memory` is exactly this image.
    #[cfg(test)]
    pub(super) fn matches(&self, memory: &[u8]) -> bool {
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

#[cfg(test)]
/// A numeric value's bits, for comparing values (NaNs included) in tests.
pub(super) fn bits(v: &Val) -> Option<u128> {
    Some(match v {
        Val::I32(x) => *x as u32 as u128,
        Val::I64(x) => *x as u64 as u128,
        Val::F32(x) => *x as u128,
        Val::F64(x) => *x as u128,
        Val::V128(x) => x.as_u128(),
        _ => return None,
    })
}
