//! RAM per disk-resident object, measured: a disk index of 1,000,000 objects (or `-- N`) for
//! each replacement policy, with every byte the index allocates counted by a counting global
//! allocator (the catalog's slab, hash table and policy nodes, and the slab's free-space bitmap
//! sized as a node sizes it for those objects). Not a timing benchmark.
//!
//! `cargo bench -p meshcache-disk --bench index_memory [-- N]`
#![allow(missing_docs)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use meshcache_disk::{DiskEntry, DiskIndex, Location};
use meshcache_store::{Replacement, StoreConfig, StoreKey};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

#[allow(unsafe_code)]
// SAFETY: forwards to the system allocator, counting the bytes it hands out and takes back.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Relaxed);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Relaxed);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Relaxed);
        LIVE.fetch_sub(layout.size(), Relaxed);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn main() {
    let n: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    // 1 KiB objects: records of about 1.3 KiB (six units) in a disk sized for them.
    let record = 6 * 256;
    let size = n * record;
    println!(
        "{n} objects of one 1.5 KiB slab record each, disk size {} MiB",
        size >> 20
    );
    println!();
    println!("| policy | bytes per object (all of the index) | of which the slab's bitmap | size_of estimate |");
    println!("| --- | ---: | ---: | ---: |");
    for replacement in Replacement::ALL {
        let before = LIVE.load(Relaxed);
        let units = (size + size / 4) / 256;
        let mut index = DiskIndex::new(
            StoreConfig {
                capacity: size,
                max_object_size: size,
                replacement,
            },
            units,
            false,
        );
        for i in 0..n {
            let key = StoreKey::get(&format!("http://bench.test/{i}"));
            let unit = index.allocate(6).expect("room");
            let entry =
                DiskEntry::new(key, Location::Slab { unit, len: 1300 }, false, 0).expect("entry");
            index.expect(key, i);
            assert!(index.commit(entry, i));
            let _ = index.take_changes();
        }
        assert_eq!(index.len() as u64, n);
        let bytes = LIVE.load(Relaxed) - before;
        let bitmap = index.space().memory_bytes();
        println!(
            "| {replacement} | {:.1} | {:.1} | {} |",
            bytes as f64 / n as f64,
            bitmap as f64 / n as f64,
            DiskIndex::bytes_per_entry(replacement)
        );
        drop(index);
    }
}
