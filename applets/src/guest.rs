//! The guest side of the meshcache applet interface (see `docs/applets.md`): safe wrappers over
//! the host functions an applet imports from the `meshcache` module. Each applet includes this
//! file with `#[path = "guest.rs"] mod guest;` and exports `run`.
#![allow(dead_code)]

#[link(wasm_import_module = "meshcache")]
extern "C" {
    fn input(which: i32, out: *mut u8, cap: i32) -> i32;
    fn request_header(name: *const u8, name_len: i32, out: *mut u8, cap: i32) -> i32;
    fn now_ms() -> i64;
    fn item_open(url: *const u8, url_len: i32) -> i32;
    fn item_len(handle: i32) -> i32;
    fn item_read(handle: i32, offset: i32, out: *mut u8, cap: i32) -> i32;
    fn item_header(handle: i32, name: *const u8, name_len: i32, out: *mut u8, cap: i32) -> i32;
    fn item_find(handle: i32, from: i32, needle: *const u8, needle_len: i32) -> i32;
    fn set_status(code: i32) -> i32;
    fn add_header(name: *const u8, name_len: i32, value: *const u8, value_len: i32) -> i32;
    fn write(ptr: *const u8, len: i32) -> i32;
    fn write_item(handle: i32, offset: i32, len: i32) -> i32;
    fn kv_get(key: *const u8, key_len: i32, out: *mut u8, cap: i32) -> i32;
    fn kv_put(key: *const u8, key_len: i32, value: *const u8, value_len: i32) -> i32;
    fn kv_delete(key: *const u8, key_len: i32) -> i32;
    fn log(ptr: *const u8, len: i32) -> i32;
    fn ed25519_verify(public_key: *const u8, signature: *const u8, msg: *const u8, msg_len: i32)
        -> i32;
}

/// A bump allocator over the instance's own memory. Every run gets a fresh instance, so
/// nothing needs freeing: allocation is a pointer increment, the last block can grow or shrink
/// in place (a `Vec` or `String` being built), and memory grows only when the free part of the
/// initial memory is used up. (The standard allocator asks the host for new pages on its first
/// allocation, which costs the host a page-protection change per run.)
mod bump {
    use std::alloc::{GlobalAlloc, Layout};
    use std::ptr::null_mut;

    extern "C" {
        static __heap_base: u8;
    }

    pub struct Bump;

    static mut NEXT: usize = 0;
    static mut END: usize = 0;

    const PAGE: usize = 65536;

    unsafe fn reserve(end: usize) -> bool {
        if NEXT == 0 {
            NEXT = &__heap_base as *const u8 as usize;
            END = core::arch::wasm32::memory_size(0) * PAGE;
        }
        if end > END {
            let pages = (end - END + PAGE - 1) / PAGE;
            if core::arch::wasm32::memory_grow(0, pages) == usize::MAX {
                return false;
            }
            END += pages * PAGE;
        }
        true
    }

    unsafe impl GlobalAlloc for Bump {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            if NEXT == 0 && !reserve(0) {
                return null_mut();
            }
            let start = (NEXT + layout.align() - 1) & !(layout.align() - 1);
            let end = match start.checked_add(layout.size()) {
                Some(end) => end,
                None => return null_mut(),
            };
            if !reserve(end) {
                return null_mut();
            }
            NEXT = end;
            start as *mut u8
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            if ptr as usize + layout.size() == NEXT {
                NEXT = ptr as usize;
            }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            let start = ptr as usize;
            if start + layout.size() == NEXT {
                // The last block: grow or shrink it where it is.
                match start.checked_add(new_size) {
                    Some(end) if reserve(end) => {
                        NEXT = end;
                        return ptr;
                    }
                    _ => return null_mut(),
                }
            }
            let new = self.alloc(Layout::from_size_align_unchecked(new_size, layout.align()));
            if !new.is_null() {
                core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
            }
            new
        }
    }
}

#[global_allocator]
static ALLOCATOR: bump::Bump = bump::Bump;

/// What `run` returns.
pub const CACHED: i32 = 0;
/// Serve the response built with [`set_status`], [`add_header`], [`write`].
pub const BUILT: i32 = 1;
/// Send the request to the origin.
pub const ORIGIN: i32 = 2;

/// Input selectors.
pub const METHOD: i32 = 0;
pub const URL: i32 = 1;
pub const REQUEST_HEADERS: i32 = 2;
pub const CLIENT_ADDR: i32 = 3;
pub const STATUS: i32 = 4;
pub const DOCUMENT_HEADERS: i32 = 5;

/// The cached document's handle.
pub const DOCUMENT: i32 = 0;

/// Calls a "copy at most cap, return the full length" host function until the buffer fits.
fn fetch(mut f: impl FnMut(*mut u8, i32) -> i32) -> Option<Vec<u8>> {
    let mut buf = Vec::with_capacity(256);
    loop {
        let n = f(buf.as_mut_ptr(), buf.capacity() as i32);
        if n < 0 {
            return None;
        }
        let n = n as usize;
        if n <= buf.capacity() {
            unsafe { buf.set_len(n) };
            return Some(buf);
        }
        buf.reserve(n);
    }
}

/// A request or document field (see the selectors above), as bytes.
pub fn get_input(which: i32) -> Vec<u8> {
    fetch(|p, c| unsafe { input(which, p, c) }).unwrap_or_default()
}

/// A request or document field, as text (invalid UTF-8 replaced).
pub fn get_input_string(which: i32) -> String {
    String::from_utf8_lossy(&get_input(which)).into_owned()
}

/// A request header's value, if present.
pub fn header(name: &str) -> Option<String> {
    fetch(|p, c| unsafe { request_header(name.as_ptr(), name.len() as i32, p, c) })
        .map(|v| String::from_utf8_lossy(&v).into_owned())
}

/// A cookie of the request, by name.
pub fn cookie(name: &str) -> Option<String> {
    let all = header("cookie")?;
    all.split(';').find_map(|pair| {
        let (k, v) = pair.trim().split_once('=')?;
        (k.trim() == name).then(|| v.trim().to_string())
    })
}

/// Unix time in milliseconds, from the host.
pub fn now() -> i64 {
    unsafe { now_ms() }
}

/// Opens a cached object of the document's origin by URL (absolute, or a path of the origin).
pub fn open(url: &str) -> Option<i32> {
    let h = unsafe { item_open(url.as_ptr(), url.len() as i32) };
    (h >= 0).then_some(h)
}

/// Body length of an open object.
pub fn len(handle: i32) -> usize {
    unsafe { item_len(handle) }.max(0) as usize
}

/// The whole body of an open object.
pub fn read_all(handle: i32) -> Vec<u8> {
    let n = len(handle);
    let mut buf = Vec::with_capacity(n);
    let got = unsafe { item_read(handle, 0, buf.as_mut_ptr(), n as i32) };
    unsafe { buf.set_len(got.max(0) as usize) };
    buf
}

/// Where `needle` first occurs in an open object's body at or after `from` (searched by the
/// host, in place).
pub fn find_in(handle: i32, from: usize, needle: &[u8]) -> Option<usize> {
    let at = unsafe { item_find(handle, from as i32, needle.as_ptr(), needle.len() as i32) };
    (at >= 0).then(|| at as usize)
}

/// Up to `len` bytes of an open object's body from `offset` (fewer at its end).
pub fn read_at(handle: i32, offset: usize, len: usize) -> Vec<u8> {
    let mut buf = Vec::with_capacity(len);
    let got = unsafe { item_read(handle, offset as i32, buf.as_mut_ptr(), len as i32) };
    unsafe { buf.set_len(got.max(0) as usize) };
    buf
}

/// A stored response header of an open object.
pub fn item_header_value(handle: i32, name: &str) -> Option<String> {
    fetch(|p, c| unsafe { item_header(handle, name.as_ptr(), name.len() as i32, p, c) })
        .map(|v| String::from_utf8_lossy(&v).into_owned())
}

/// Status of the built response.
pub fn status(code: u16) -> bool {
    unsafe { set_status(code as i32) == 0 }
}

/// A header of the built response.
pub fn add(name: &str, value: &str) -> bool {
    unsafe { add_header(name.as_ptr(), name.len() as i32, value.as_ptr(), value.len() as i32) == 0 }
}

/// Appends bytes to the built body.
pub fn out(bytes: &[u8]) -> bool {
    unsafe { write(bytes.as_ptr(), bytes.len() as i32) == 0 }
}

/// Appends `len` bytes of an open object's body, from `offset`, to the built body.
pub fn out_item(handle: i32, offset: usize, len: usize) -> bool {
    unsafe { write_item(handle, offset as i32, len as i32) == 0 }
}

/// Reads a key of the origin's store.
pub fn get(key: &str) -> Option<Vec<u8>> {
    fetch(|p, c| unsafe { kv_get(key.as_ptr(), key.len() as i32, p, c) })
}

/// Writes a key; committed when `run` returns normally.
pub fn put(key: &str, value: &[u8]) -> bool {
    unsafe { kv_put(key.as_ptr(), key.len() as i32, value.as_ptr(), value.len() as i32) == 0 }
}

/// Deletes a key; committed when `run` returns normally.
pub fn delete(key: &str) {
    unsafe { kv_delete(key.as_ptr(), key.len() as i32) };
}

/// Appends a record to the log object delivered to the origin.
pub fn log_record(record: &[u8]) -> bool {
    unsafe { log(record.as_ptr(), record.len() as i32) == 0 }
}

/// Checks an Ed25519 signature.
pub fn verify(public_key: &[u8; 32], signature: &[u8; 64], msg: &[u8]) -> bool {
    unsafe {
        ed25519_verify(public_key.as_ptr(), signature.as_ptr(), msg.as_ptr(), msg.len() as i32)
            == 1
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers shared by several applets.
/// The cached document's status code (200 if the host's text does not parse).
pub fn document_status() -> u16 {
    get_input_string(STATUS).trim().parse().unwrap_or(200)
}

/// A moment broken down into UTC calendar fields (proleptic Gregorian calendar).
pub struct UtcTime {
    pub year: i64,
    /// 1 = January.
    pub month: u32,
    /// Day of the month, from 1.
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    /// 0 = Sunday.
    pub weekday: u32,
}

const WEEKDAYS: [&str; 7] =
    ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
const MONTHS: [&str; 12] =
    ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

impl UtcTime {
    /// Breaks down a Unix time in milliseconds (as [`now`] returns it).
    pub fn from_unix_ms(ms: i64) -> UtcTime {
        let secs = ms.div_euclid(1000);
        let days = secs.div_euclid(86_400);
        let of_day = secs.rem_euclid(86_400) as u32;
        let (year, month, day) = civil_from_days(days);
        UtcTime {
            year,
            month,
            day,
            hour: of_day / 3600,
            minute: of_day / 60 % 60,
            second: of_day % 60,
            // 1970-01-01 was a Thursday.
            weekday: (days + 4).rem_euclid(7) as u32,
        }
    }

    /// The weekday's English name ("Tuesday").
    pub fn weekday_name(&self) -> &'static str {
        WEEKDAYS[self.weekday as usize]
    }

    /// The month's three-letter English abbreviation ("Nov").
    pub fn month_abbr(&self) -> &'static str {
        MONTHS[self.month as usize - 1]
    }

    /// RFC 9110 IMF-fixdate: `Tue, 24 Nov 2026 01:02:03 GMT`.
    pub fn imf_fixdate(&self) -> String {
        format!(
            "{}, {:02} {} {:04} {:02}:{:02}:{:02} GMT",
            &self.weekday_name()[..3],
            self.day,
            self.month_abbr(),
            self.year,
            self.hour,
            self.minute,
            self.second
        )
    }
}

/// Converts a count of days since 1970-01-01 to a (year, month, day) date.
///
/// The calendar is shifted to start on 1 March so that the leap day falls at the end of the
/// year; it then repeats exactly every 400 years (146 097 days). The day is located in its
/// 400-year cycle, then its year within the cycle, then its day within that March-based year,
/// from which the month follows by a linear formula (March..July and August..December both
/// have the 31-30-31-30-31 pattern, 153 days per five months).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    const DAYS_PER_CYCLE: i64 = 146_097;
    // Days from 0000-03-01 to 1970-01-01.
    let shifted = days + 719_468;
    let cycle = shifted.div_euclid(DAYS_PER_CYCLE);
    // 0..=146096
    let day_of_cycle = shifted.rem_euclid(DAYS_PER_CYCLE);
    // Remove the leap days that precede this day in the cycle (one every 4 years, except
    // every 100 years, except the cycle's very last day) to count whole 365-day years: 0..=399.
    let leap_days_before = day_of_cycle / 1460 - day_of_cycle / 36_524 + day_of_cycle / 146_096;
    let year_of_cycle = (day_of_cycle - leap_days_before) / 365;
    // 0..=365, counted from 1 March.
    let day_of_year =
        day_of_cycle - (365 * year_of_cycle + year_of_cycle / 4 - year_of_cycle / 100);
    // 0 = March .. 11 = February.
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_from_march + 2) / 5 + 1) as u32;
    let month = if month_from_march < 10 { month_from_march + 3 } else { month_from_march - 9 };
    // January and February belong to the next civil year.
    let year = cycle * 400 + year_of_cycle + if month <= 2 { 1 } else { 0 };
    (year, month as u32, day)
}
