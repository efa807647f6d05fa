//! Runtime tests with small modules written in the text format: the contract's edges
//! (outcomes, limits, commit-on-completion, bounds) one at a time. The example applets are
//! exercised end to end through the proxy in `meshcache-proxy`'s tests.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};

use crate::{
    Applet, AppletConfig, AppletError, Counter, Invocation, Item, Items, Reason, Runtime, Spent,
    Verdict,
};

struct NoItems;
impl Items for NoItems {
    fn open(&self, _url: &str, _request: &HeaderMap) -> Option<Item> {
        None
    }
}

struct OneItem;
impl Items for OneItem {
    fn open(&self, url: &str, _request: &HeaderMap) -> Option<Item> {
        (url == "http://o.test/part").then(|| Item {
            status: StatusCode::OK,
            headers: Arc::from(Vec::new()),
            body: Bytes::from_static(b"PART"),
        })
    }
}

fn inv(body: &'static [u8]) -> Invocation {
    let mut headers = HeaderMap::new();
    headers.insert("cookie", HeaderValue::from_static("a=1; b=2"));
    Invocation {
        method: Method::GET,
        url: "http://o.test/doc".into(),
        origin: "http://o.test".into(),
        headers,
        client: IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9)),
        document: Item {
            status: StatusCode::OK,
            headers: Arc::from(Vec::new()),
            body: Bytes::from_static(body),
        },
        log_to: Arc::from("http://o.test/log"),
    }
}

/// A module with the standard imports it needs, a memory of `pages`, and `body` as `run`.
fn module(imports: &str, data: &str, body: &str) -> Vec<u8> {
    let text = format!(
        r#"(module {imports}
             (memory (export "memory") 1)
             (data (i32.const 0) "{data}")
             (func (export "run") (result i32) {body}))"#
    );
    wat::parse_str(&text).expect("test module parses")
}

fn runtime() -> Runtime {
    Runtime::new(AppletConfig {
        cpu: std::time::Duration::from_millis(30),
        memory: 1 << 20,
        max_output: 1 << 10,
        kv_max: 64,
        instances: 8,
        ..AppletConfig::default()
    })
    .expect("runtime starts")
}

/// Runs `applet` for `inv` as the proxy does, lending the request's headers: the verdict, the
/// spent store and the headers as the run gave them back.
fn run_lent(rt: &Runtime, applet: &Applet, mut inv: Invocation) -> (Verdict, Spent, HeaderMap) {
    let items: Arc<dyn Items> = Arc::new(NoItems);
    let (verdict, spent) = rt.run_deferred(applet, inv.lend(), &items);
    (verdict, spent, inv.headers)
}

fn run(rt: &Runtime, wasm: &[u8], inv: Invocation) -> Verdict {
    let applet = rt.compile(wasm).expect("compiles");
    rt.run(&applet, inv, Arc::new(NoItems))
}

#[test]
fn the_three_outcomes_and_invalid_codes() {
    let rt = runtime();
    assert!(matches!(
        run(&rt, &module("", "", "i32.const 0"), inv(b"")),
        Verdict::Cached
    ));
    assert!(matches!(
        run(&rt, &module("", "", "i32.const 2"), inv(b"")),
        Verdict::Origin(Reason::Asked)
    ));
    // "Built" without building anything is not a response.
    assert!(matches!(
        run(&rt, &module("", "", "i32.const 1"), inv(b"")),
        Verdict::Origin(Reason::Invalid(1))
    ));
    assert!(matches!(
        run(&rt, &module("", "", "i32.const 7"), inv(b"")),
        Verdict::Origin(Reason::Invalid(7))
    ));
    assert_eq!(rt.counters.get(Counter::Runs), 4);
    assert_eq!(rt.counters.get(Counter::Invalid), 2);
}

#[test]
fn a_built_response_splices_the_document_and_its_own_bytes() {
    let rt = runtime();
    let wasm = module(
        r#"(import "meshcache" "set_status" (func $status (param i32) (result i32)))
           (import "meshcache" "add_header" (func $header (param i32 i32 i32 i32) (result i32)))
           (import "meshcache" "write" (func $write (param i32 i32) (result i32)))
           (import "meshcache" "write_item" (func $item (param i32 i32 i32) (result i32)))"#,
        "x-ayes<>",
        "(drop (call $status (i32.const 203)))
         (drop (call $header (i32.const 0) (i32.const 3) (i32.const 3) (i32.const 3)))
         (drop (call $write (i32.const 6) (i32.const 1)))
         (drop (call $item (i32.const 0) (i32.const 2) (i32.const 3)))
         (drop (call $write (i32.const 7) (i32.const 1)))
         i32.const 1",
    );
    let Verdict::Built(b) = run(&rt, &wasm, inv(b"0123456")) else {
        panic!("expected a built response");
    };
    assert_eq!(b.status, StatusCode::NON_AUTHORITATIVE_INFORMATION);
    assert_eq!(b.headers[0].0.as_str(), "x-a");
    assert_eq!(b.headers[0].1, "yes");
    assert_eq!(&b.body()[..], b"<234>");
}

#[test]
fn inputs_and_request_headers_reach_the_applet() {
    let rt = runtime();
    // Copies the client address and the cookie into the built body.
    let wasm = module(
        r#"(import "meshcache" "input" (func $input (param i32 i32 i32) (result i32)))
           (import "meshcache" "request_header" (func $rh (param i32 i32 i32 i32) (result i32)))
           (import "meshcache" "write" (func $write (param i32 i32) (result i32)))"#,
        "cookie",
        "(local $n i32)
         (local.set $n (call $input (i32.const 3) (i32.const 100) (i32.const 100)))
         (drop (call $write (i32.const 100) (local.get $n)))
         (local.set $n (call $rh (i32.const 0) (i32.const 6) (i32.const 200) (i32.const 100)))
         (drop (call $write (i32.const 200) (local.get $n)))
         ;; an absent header is -1
         (if (i32.ne (call $rh (i32.const 1) (i32.const 3) (i32.const 200) (i32.const 100)) (i32.const -1))
           (then unreachable))
         i32.const 1",
    );
    let Verdict::Built(b) = run(&rt, &wasm, inv(b"")) else {
        panic!("expected a built response");
    };
    assert_eq!(&b.body()[..], b"127.0.0.9a=1; b=2");
}

#[test]
fn the_ticker_sleeps_when_idle_and_a_run_wakes_it() {
    use std::time::{Duration, Instant};
    let rt = runtime();
    let null = module("", "", "i32.const 0");
    assert!(matches!(run(&rt, &null, inv(b"")), Verdict::Cached));
    // No run for a while: the ticker goes to sleep (after 20 ticks of 5 ms).
    let until = Instant::now() + Duration::from_secs(5);
    while rt.ticker_sleeps() == 0 {
        assert!(Instant::now() < until, "the ticker never went to sleep");
        std::thread::sleep(Duration::from_millis(10));
    }
    // A run that never ends must still meet its deadline: beginning it wakes the ticker. (On
    // a thread of its own: without the wake-up it would spin for ever.)
    let rt = Arc::new(rt);
    let (tx, rx) = std::sync::mpsc::channel();
    let spinner = rt.clone();
    std::thread::spawn(move || {
        let spin = module("", "", "(loop $l (br $l)) i32.const 0");
        let _ = tx.send(run(&spinner, &spin, inv(b"")));
    });
    let verdict = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("a spinning run outlived its deadline by seconds");
    assert!(matches!(verdict, Verdict::Origin(Reason::Timeout)));
    // And it sleeps again afterwards.
    let slept = rt.ticker_sleeps();
    let until = Instant::now() + Duration::from_secs(5);
    while rt.ticker_sleeps() == slept {
        assert!(Instant::now() < until, "the ticker did not sleep again");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn hostile_runs_end_at_their_limits_and_are_counted() {
    let rt = runtime();
    let spin = module("", "", "(loop $l (br $l)) i32.const 0");
    let started = std::time::Instant::now();
    assert!(matches!(
        run(&rt, &spin, inv(b"")),
        Verdict::Origin(Reason::Timeout)
    ));
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    let bomb = module(
        "",
        "",
        "(loop $l (br_if $l (i32.ne (memory.grow (i32.const 16)) (i32.const -1)))) unreachable",
    );
    assert!(matches!(
        run(&rt, &bomb, inv(b"")),
        Verdict::Origin(Reason::Memory)
    ));
    let flood = module(
        r#"(import "meshcache" "write" (func $write (param i32 i32) (result i32)))"#,
        "",
        "(loop $l (br_if $l (i32.eq (call $write (i32.const 0) (i32.const 100)) (i32.const 0))))
         i32.const 1",
    );
    assert!(matches!(
        run(&rt, &flood, inv(b"")),
        Verdict::Origin(Reason::Output)
    ));
    let trap = module("", "", "unreachable");
    assert!(matches!(
        run(&rt, &trap, inv(b"")),
        Verdict::Origin(Reason::Trap(_))
    ));
    let wild = module(
        r#"(import "meshcache" "write" (func $write (param i32 i32) (result i32)))"#,
        "",
        "(drop (call $write (i32.const 65530) (i32.const 100))) i32.const 0",
    );
    assert!(matches!(
        run(&rt, &wild, inv(b"")),
        Verdict::Origin(Reason::Trap(_))
    ));
    let c = &rt.counters;
    assert_eq!(
        [
            Counter::Timeouts,
            Counter::Memory,
            Counter::Output,
            Counter::Traps
        ]
        .map(|k| c.get(k)),
        [1, 1, 1, 2]
    );
    // And the runtime still runs well-behaved applets.
    assert!(matches!(
        run(&rt, &module("", "", "i32.const 0"), inv(b"")),
        Verdict::Cached
    ));
}

#[test]
fn store_writes_and_logs_are_kept_only_when_the_run_completes() {
    let rt = runtime();
    let imports = r#"(import "meshcache" "kv_put" (func $put (param i32 i32 i32 i32) (result i32)))
                     (import "meshcache" "kv_get" (func $get (param i32 i32 i32 i32) (result i32)))
                     (import "meshcache" "log" (func $log (param i32 i32) (result i32)))"#;
    let put_then = |end: &str| {
        module(
            imports,
            "kv",
            &format!(
                "(drop (call $put (i32.const 0) (i32.const 1) (i32.const 1) (i32.const 1)))
                 (drop (call $log (i32.const 0) (i32.const 2)))
                 ;; the run sees its own write
                 (if (i32.ne (call $get (i32.const 0) (i32.const 1) (i32.const 10) (i32.const 4)) (i32.const 1))
                   (then unreachable))
                 {end}"
            ),
        )
    };
    assert!(matches!(
        run(&rt, &put_then("unreachable"), inv(b"")),
        Verdict::Origin(Reason::Trap(_))
    ));
    assert_eq!(rt.kv_bytes("http://o.test"), 0);
    assert_eq!(rt.logs.pending("http://o.test/log"), 0);
    assert!(matches!(
        run(&rt, &put_then("i32.const 0"), inv(b"")),
        Verdict::Cached
    ));
    assert_eq!(rt.kv_bytes("http://o.test"), 2);
    assert_eq!(rt.logs.pending("http://o.test/log"), 1);
    // Over the origin's bound (64 bytes): the put fails, nothing is stored.
    let big = module(
        imports,
        "",
        "(if (i32.ne (call $put (i32.const 0) (i32.const 1) (i32.const 0) (i32.const 100)) (i32.const -1))
           (then unreachable))
         i32.const 0",
    );
    assert!(matches!(run(&rt, &big, inv(b"")), Verdict::Cached));
    assert_eq!(rt.kv_bytes("http://o.test"), 2);
}

#[test]
fn a_kept_instance_uses_the_store_of_each_runs_origin() {
    // Each run writes back the value of "k" it read, then sets "k" to its URL. One applet,
    // run in turn for two origins: the instance (and its state) is kept between the runs.
    let rt = runtime();
    let wasm = module(
        r#"(import "meshcache" "kv_get" (func $get (param i32 i32 i32 i32) (result i32)))
           (import "meshcache" "kv_put" (func $put (param i32 i32 i32 i32) (result i32)))
           (import "meshcache" "input" (func $input (param i32 i32 i32) (result i32)))
           (import "meshcache" "write" (func $write (param i32 i32) (result i32)))"#,
        "k",
        "(local $n i32)
         (local.set $n (call $get (i32.const 0) (i32.const 1) (i32.const 100) (i32.const 40)))
         (drop (call $write (i32.const 100) (i32.const 0)))
         (if (i32.ge_s (local.get $n) (i32.const 0))
           (then (drop (call $write (i32.const 100) (local.get $n)))))
         (local.set $n (call $input (i32.const 1) (i32.const 200) (i32.const 40)))
         (drop (call $put (i32.const 0) (i32.const 1) (i32.const 200) (local.get $n)))
         i32.const 1",
    );
    let applet = rt.compile(&wasm).expect("compiles");
    // The origins' names are shared between runs, as the proxy shares a document's; the last
    // run's is another copy of a name already seen.
    let (a, b) = (Arc::from("http://a.test"), Arc::from("http://b.test"));
    let at = |origin: &Arc<str>, path: &str| {
        let mut i = inv(b"");
        i.origin = origin.clone();
        i.url = format!("{origin}{path}");
        i
    };
    let mut bodies = Vec::new();
    for (origin, path) in [
        (&a, "/1"),
        (&b, "/2"),
        (&b, "/3"),
        (&a, "/4"),
        (&Arc::from("http://a.test"), "/5"),
    ] {
        let Verdict::Built(b) = rt.run(&applet, at(origin, path), Arc::new(NoItems)) else {
            panic!("expected a built response");
        };
        bodies.push(String::from_utf8(b.body().to_vec()).expect("text"));
    }
    assert_eq!(
        bodies,
        [
            "",
            "",
            "http://b.test/2",
            "http://a.test/1",
            "http://a.test/4"
        ]
    );
    assert!(
        rt.counters.get(Counter::Rewound) >= 4,
        "the instance was kept"
    );
    assert_eq!(
        rt.kv_bytes("http://a.test"),
        1 + "http://a.test/5".len() as u64
    );
}

#[test]
fn the_request_headers_come_back_whatever_the_run_does() {
    let rt = runtime();
    for body in [
        "i32.const 0",
        "unreachable",
        "(drop (call $rh (i32.const 0) (i32.const 6) (i32.const 100) (i32.const 100))) i32.const 0",
        // A header copied past the end of memory traps in the host function, holding them.
        "(drop (call $rh (i32.const 0) (i32.const 6) (i32.const 70000) (i32.const 100))) i32.const 0",
    ] {
        let wasm = module(
            r#"(import "meshcache" "request_header" (func $rh (param i32 i32 i32 i32) (result i32)))"#,
            "cookie",
            body,
        );
        let applet = rt.compile(&wasm).expect("compiles");
        let sent = inv(b"").headers;
        assert!(!sent.is_empty());
        for i in 0..3 {
            let (verdict, spent, back) = run_lent(&rt, &applet, inv(b""));
            assert_eq!(back, sent, "{body}, run {i}: {verdict:?}");
            rt.replenish(&applet, spent);
        }
    }
}

#[test]
fn items_are_read_from_the_documents_origin_only() {
    let rt = runtime();
    let wasm = module(
        r#"(import "meshcache" "item_open" (func $open (param i32 i32) (result i32)))
           (import "meshcache" "write_item" (func $item (param i32 i32 i32) (result i32)))"#,
        "/parthttp://x.test/part",
        "(local $h i32)
         (if (i32.ne (call $open (i32.const 5) (i32.const 18)) (i32.const -1)) (then unreachable))
         (local.set $h (call $open (i32.const 0) (i32.const 5)))
         (drop (call $item (local.get $h) (i32.const 0) (i32.const 4)))
         i32.const 1",
    );
    let applet = rt.compile(&wasm).expect("compiles");
    let Verdict::Built(b) = rt.run(&applet, inv(b""), Arc::new(OneItem)) else {
        panic!("expected a built response");
    };
    assert_eq!(&b.body()[..], b"PART");
}

#[test]
fn signatures_are_checked_for_real() {
    use ed25519_dalek::{Signer, SigningKey};
    let key = SigningKey::from_bytes(&[7; 32]);
    let sig = key.sign(b"msg").to_bytes();
    let pk = key.verifying_key().to_bytes();
    assert!(crate::host::verify(&pk, &sig, b"msg"));
    assert!(!crate::host::verify(&pk, &sig, b"msh"));
    let mut bad = sig;
    bad[3] ^= 1;
    assert!(!crate::host::verify(&pk, &bad, b"msg"));
    // Remembered results are the same results, asked in any order.
    let memo = crate::host::VerifyMemo::default();
    let other = SigningKey::from_bytes(&[8; 32]).verifying_key().to_bytes();
    let long = vec![b'm'; 5000];
    let long_sig = key.sign(&long).to_bytes();
    for _ in 0..2 {
        assert!(memo.verify(&pk, &sig, b"msg"));
        assert!(!memo.verify(&pk, &sig, b"msh"));
        assert!(!memo.verify(&pk, &bad, b"msg"));
        // The same signature under another key, or with a message it is a prefix of.
        assert!(!memo.verify(&other, &sig, b"msg"));
        assert!(!memo.verify(&pk, &sig, b"msgs"));
        assert!(!memo.verify(&pk, &sig[..63], b"msg"));
        // Too long to be remembered: checked each time, with the same answers.
        assert!(memo.verify(&pk, &long_sig, &long));
        assert!(!memo.verify(&pk, &long_sig, &long[1..]));
    }
}

#[test]
fn modules_that_do_not_fit_the_interface_are_refused() {
    let rt = runtime();
    let wasi = wat::parse_str(
        r#"(module (import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32)))
                   (memory (export "memory") 1) (func (export "run") (result i32) i32.const 0))"#,
    )
    .expect("parses");
    assert!(matches!(rt.compile(&wasi), Err(AppletError::Link(_))));
    let no_run = wat::parse_str(r#"(module (memory (export "memory") 1))"#).expect("parses");
    assert!(matches!(rt.compile(&no_run), Err(AppletError::Link(_))));
    assert!(matches!(
        rt.compile(b"not wasm"),
        Err(AppletError::Compile(_))
    ));
    assert_eq!(rt.counters.get(Counter::CompileFailed), 3);
    // The same bytes compile once.
    let ok = module("", "", "i32.const 0");
    let a = rt.compile(&ok).expect("compiles");
    let b = rt.compile(&ok).expect("compiles");
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(rt.modules(), 1);
}

/// Every shipped module fits the interface, and every one is rewound between hits (none needs a
/// fresh instance per hit).
#[test]
fn the_shipped_modules_fit_the_interface() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../applets");
    let rt = Runtime::new(AppletConfig::default()).expect("runtime starts");
    let mut n = 0;
    for name in [
        "null", "log", "ads", "apc", "ssi", "csid", "spin", "balloon", "flood", "crash", "putcrash",
    ] {
        let bytes = std::fs::read(dir.join(format!("{name}.wasm")))
            .unwrap_or_else(|e| panic!("applets/{name}.wasm: {e}"));
        let applet = rt
            .compile(&bytes)
            .unwrap_or_else(|e| panic!("applets/{name}.wasm: {e}"));
        assert!(
            applet.rewindable(),
            "applets/{name}.wasm is not rewound: {:?}",
            applet.not_rewound
        );
        n += 1;
    }
    assert_eq!(n, 11);
}

#[test]
fn an_applet_that_keeps_faulting_is_quarantined() {
    let rt = Runtime::new(AppletConfig {
        quarantine_after: 2,
        quarantine: std::time::Duration::from_secs(3600),
        instances: 8,
        ..AppletConfig::default()
    })
    .expect("runtime starts");
    // Traps when the request carries a cookie, else serves the cached copy.
    let wasm = module(
        r#"(import "meshcache" "request_header" (func $rh (param i32 i32 i32 i32) (result i32)))"#,
        "cookie",
        "(if (i32.ne (call $rh (i32.const 0) (i32.const 6) (i32.const 100) (i32.const 0)) (i32.const -1))
           (then unreachable))
         i32.const 0",
    );
    let applet = rt.compile(&wasm).expect("compiles");
    let with_cookie = || inv(b"");
    let without_cookie = || {
        let mut i = inv(b"");
        i.headers = HeaderMap::new();
        i
    };
    let run = |i: Invocation| rt.run(&applet, i, Arc::new(NoItems));
    assert!(matches!(
        run(with_cookie()),
        Verdict::Origin(Reason::Trap(_))
    ));
    // A completed run starts the count again.
    assert!(matches!(run(without_cookie()), Verdict::Cached));
    assert!(matches!(
        run(with_cookie()),
        Verdict::Origin(Reason::Trap(_))
    ));
    assert!(matches!(
        run(with_cookie()),
        Verdict::Origin(Reason::Trap(_))
    ));
    // Two in a row: resting now, whatever the request.
    assert!(matches!(
        run(without_cookie()),
        Verdict::Origin(Reason::Quarantined)
    ));
    assert_eq!(rt.counters.get(Counter::Quarantines), 1);
    assert_eq!(rt.counters.get(Counter::Quarantined), 1);
    assert_eq!(rt.counters.get(Counter::Runs), 4);
    // Other modules are not affected.
    assert!(matches!(
        rt.run(
            &rt.compile(&module("", "", "i32.const 0"))
                .expect("compiles"),
            inv(b""),
            Arc::new(NoItems)
        ),
        Verdict::Cached
    ));
}

#[test]
fn the_compiled_module_cache_is_bounded() {
    let rt = Runtime::new(AppletConfig {
        max_modules: 2,
        instances: 8,
        ..AppletConfig::default()
    })
    .expect("runtime starts");
    let m = |n: i32| module("", "", &format!("i32.const 0 i32.const {n} drop"));
    let first = rt.compile(&m(1)).expect("compiles");
    rt.compile(&m(2)).expect("compiles");
    rt.compile(&m(3)).expect("compiles");
    assert_eq!(rt.modules(), 2);
    // The oldest was forgotten by the cache, not taken from its user: it still runs.
    assert!(matches!(
        rt.run(&first, inv(b""), Arc::new(NoItems)),
        Verdict::Cached
    ));
    let again = rt.compile(&m(1)).expect("compiles");
    assert!(!Arc::ptr_eq(&first, &again), "compiled anew");
    assert_eq!(rt.modules(), 2);
}

/// Runs `applet` for one hit that serves the cached copy, checks the request's headers came back
/// as they were and the spent run holds on to nothing of the document, and hands it to
/// `replenish`.
fn run_holding_nothing(rt: &Runtime, applet: &crate::Applet, i: usize) {
    let inv = inv(b"doc");
    let sent = inv.headers.clone();
    let document = inv.document.headers.clone();
    let (verdict, spent, headers) = run_lent(rt, applet, inv);
    assert!(matches!(verdict, Verdict::Cached), "run {i}: {verdict:?}");
    assert_eq!(headers, sent, "run {i}: headers given back");
    assert_eq!(Arc::strong_count(&document), 1, "run {i}: document held");
    rt.replenish(applet, spent);
}

/// A module that cannot be rewound (here: it drops a data segment, state no rewind restores) gets
/// its next instance made ahead once a hit is answered, and each run still starts from an
/// instance nothing has run in: a run that finds the mark an earlier run left in memory returns
/// an invalid code. The spent run holds on to nothing of the request while it waits to be
/// released.
#[test]
fn instances_made_ahead_are_fresh_and_used_once() {
    let rt = runtime();
    let wasm = wat::parse_str(
        r#"(module
             (memory (export "memory") 1)
             (data $unused "x")
             (func (export "run") (result i32)
               (data.drop $unused)
               (if (result i32) (i32.load8_u (i32.const 0))
                 (then (i32.const 7))
                 (else (i32.store8 (i32.const 0) (i32.const 1)) (i32.const 0)))))"#,
    )
    .expect("parses");
    let applet = rt.compile(&wasm).expect("compiles");
    assert!(!applet.rewindable());
    assert!(applet.not_rewound.as_deref().unwrap().contains("data.drop"));
    for i in 0..5 {
        run_holding_nothing(&rt, &applet, i);
    }
    assert_eq!(rt.counters.get(Counter::MadeAhead), 4);
    // A run whose store is simply dropped takes the one made ahead and leaves none.
    assert!(matches!(run(&rt, &wasm, inv(b"doc")), Verdict::Cached));
    assert!(matches!(run(&rt, &wasm, inv(b"doc")), Verdict::Cached));
    assert_eq!(rt.counters.get(Counter::MadeAhead), 5);
    assert_eq!(rt.counters.get(Counter::Invalid), 0);
    assert_eq!(rt.counters.get(Counter::Rewound), 0);
}

/// The same marking module, rewindable: after each run its instance is rewound and kept, the next
/// run takes it and does not see the mark, and nothing of the request stays behind in it.
#[test]
fn a_rewound_instance_starts_as_a_fresh_one() {
    let rt = runtime();
    let wasm = module(
        "",
        "",
        "(if (result i32) (i32.load8_u (i32.const 0))
            (then (i32.const 7))
            (else (i32.store8 (i32.const 0) (i32.const 1)) (i32.const 0)))",
    );
    let applet = rt.compile(&wasm).expect("compiles");
    assert!(applet.rewindable(), "{:?}", applet.not_rewound);
    for i in 0..5 {
        run_holding_nothing(&rt, &applet, i);
        assert_eq!(applet.ready_as_made(), (1, true), "run {i}");
    }
    // Dropping what the run hands back changes nothing: the instance was kept already.
    assert!(matches!(run(&rt, &wasm, inv(b"doc")), Verdict::Cached));
    assert_eq!(rt.counters.get(Counter::MadeAhead), 5);
    assert_eq!(rt.counters.get(Counter::Rewound), 6);
    assert_eq!(rt.counters.get(Counter::Invalid), 0);
}

/// Every way an applet can write its memory or globals, and the host's own writes, undone: each
/// run first checks what it can see is as instantiation left it (else it returns 7, invalid),
/// then writes everywhere. The memory is six 64 KiB pages, so writes above 256 KiB share their
/// dirty bit with pages below; the writes are placed so that each 4 KiB page written has no
/// other reason to be restored than the write that touched it (the second page of a straddling
/// store included). After every run the kept instance is compared with the image,
/// byte for byte. A run that grows its memory, traps or returns an invalid code releases its
/// instance instead.
#[test]
fn rewinding_undoes_every_kind_of_write() {
    let rt = runtime();
    let wasm = wat::parse_str(
        r#"(module
             (import "meshcache" "input" (func $input (param i32 i32 i32) (result i32)))
             (memory (export "memory") 6)
             (global $g (mut i32) (i32.const 5))
             (global $h (mut i64) (i64.const 7))
             (global $k (mut f64) (f64.const 1.5))
             (global $v (mut v128) (v128.const i64x2 1 2))
             (global $fixed i32 (i32.const 9))
             (data (i32.const 0) "ABCDEFGH")
             (data (i32.const 300000) "xyz")
             (data $passive "passive!")
             (func $fresh (result i32)
               (i32.and
                 (i32.and
                   (i32.and (i32.eq (global.get $g) (i32.const 5))
                            (i64.eq (global.get $h) (i64.const 7)))
                   (i32.and (f64.eq (global.get $k) (f64.const 1.5))
                            (i64x2.all_true (i64x2.eq (global.get $v) (v128.const i64x2 1 2)))))
                 (i32.and
                   (i32.and (i64.eq (i64.load (i32.const 0)) (i64.const 0x4847464544434241))
                            (i32.eq (i32.load8_u (i32.const 300002)) (i32.const 0x7a)))
                   (i32.and
                     (i32.and (i32.eqz (i32.load (i32.const 4094)))
                              (i64.eqz (i64.load offset=4092 (i32.const 327680))))
                     (i32.and
                       (i32.and (i32.eqz (i32.load8_u (i32.const 151171)))
                                (i32.eqz (i32.load8_u (i32.const 120000))))
                       (i32.and (i64.eqz (i64.load (i32.const 250000)))
                                (i32.eqz (v128.any_true (v128.load (i32.const 12286))))))))))
             (func (export "run") (result i32)
               (if (i32.eqz (call $fresh)) (then (return (i32.const 7))))
               (i32.store (i32.const 4094) (i32.const -1))
               (i64.store offset=4092 (i32.const 327680) (i64.const -1))
               (f32.store (i32.const 41060) (f32.const 3.25))
               (f64.store (i32.const 50000) (f64.const 6.5))
               (i32.store8 (i32.const 60000) (i32.const 1))
               (i32.store16 (i32.const 70000) (i32.const 2))
               (i64.store8 (i32.const 80000) (i64.const 3))
               (i64.store16 (i32.const 90000) (i64.const 4))
               (i64.store32 (i32.const 100000) (i64.const 5))
               (v128.store (i32.const 12286) (v128.const i64x2 -1 -1))
               (v128.store8_lane 3 (i32.const 110000) (v128.const i64x2 -1 -1))
               (v128.store64_lane 1 (i32.const 393208) (v128.const i64x2 -1 -1))
               (memory.fill (i32.const 131172) (i32.const 0xab) (i32.const 20000))
               (memory.copy (i32.const 200000) (i32.const 0) (i32.const 8))
               (memory.init $passive (i32.const 250000) (i32.const 0) (i32.const 8))
               (drop (call $input (i32.const 1) (i32.const 120000) (i32.const 64)))
               (i32.store (i32.const 0) (i32.const 0))
               (i32.store8 (i32.const 300002) (i32.const 0))
               (global.set $g (i32.const 6))
               (global.set $h (i64.const 8))
               (global.set $k (f64.const 2.5))
               (global.set $v (v128.const i64x2 3 4))
               (i32.const 0)))"#,
    )
    .expect("parses");
    let applet = rt.compile(&wasm).expect("compiles");
    assert!(applet.rewindable(), "{:?}", applet.not_rewound);
    for i in 0..10 {
        let (verdict, spent, _) = run_lent(&rt, &applet, inv(b"doc"));
        assert!(matches!(verdict, Verdict::Cached), "run {i}: {verdict:?}");
        rt.replenish(&applet, spent);
        assert_eq!(applet.ready_as_made(), (1, true), "run {i}");
    }
    assert_eq!(rt.counters.get(Counter::Rewound), 10);
    assert_eq!(rt.counters.get(Counter::MadeAhead), 9);

    // Runs that grow their memory, trap, or return an invalid code are not rewound.
    for (body, fault) in [
        ("(drop (memory.grow (i32.const 1))) (i32.const 0)", false),
        ("(i32.store (i32.const 8) (i32.const 1)) unreachable", true),
        (
            "(i32.store (i32.const 8) (i32.const 1)) (i32.const 9)",
            true,
        ),
    ] {
        let rt = runtime();
        let applet = rt.compile(&module("", "", body)).expect("compiles");
        assert!(applet.rewindable());
        let (verdict, spent, _) = run_lent(&rt, &applet, inv(b"doc"));
        assert_eq!(
            !matches!(verdict, Verdict::Cached),
            fault,
            "{body}: {verdict:?}"
        );
        rt.replenish(&applet, spent);
        assert_eq!(rt.counters.get(Counter::Rewound), 0, "{body}");
        // What is ready now was made ahead, fresh.
        assert_eq!(applet.ready_as_made(), (1, true), "{body}");
    }
}

/// A start function runs at instantiation, before there is a hit to show it: such a module is
/// instantiated at its hit (here the start function reads the document's length, 3).
#[test]
fn a_module_with_a_start_function_is_instantiated_at_its_hit() {
    let rt = runtime();
    let wasm = wat::parse_str(
        r#"(module
             (import "meshcache" "item_len" (func $item_len (param i32) (result i32)))
             (memory (export "memory") 1)
             (global $len (mut i32) (i32.const -1))
             (func $init (global.set $len (call $item_len (i32.const 0))))
             (start $init)
             (func (export "run") (result i32)
               (if (result i32) (i32.eq (global.get $len) (i32.const 3))
                 (then (i32.const 0)) (else (i32.const 9)))))"#,
    )
    .expect("parses");
    let applet = rt.compile(&wasm).expect("compiles");
    for i in 0..3 {
        let (verdict, spent, _) = run_lent(&rt, &applet, inv(b"doc"));
        assert!(matches!(verdict, Verdict::Cached), "run {i}: {verdict:?}");
        rt.replenish(&applet, spent);
    }
    assert_eq!(rt.counters.get(Counter::MadeAhead), 0);
}

/// Instances made ahead hold at most a quarter of the pool (8 here: 2), one per module; a
/// faulted run is replenished like any other.
#[test]
fn instances_made_ahead_take_at_most_a_quarter_of_the_pool() {
    let rt = runtime();
    let applets: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|d| {
            rt.compile(&module("", d, "(i32.const 0)"))
                .expect("compiles")
        })
        .collect();
    for a in &applets {
        for _ in 0..2 {
            let (_, spent, _) = run_lent(&rt, a, inv(b"doc"));
            rt.replenish(a, spent);
        }
    }
    // The first module's second run found one; so did the second's; the third found none.
    assert_eq!(rt.counters.get(Counter::MadeAhead), 2);
    let trap = rt
        .compile(&module("", "t", "unreachable"))
        .expect("compiles");
    let (verdict, spent, _) = run_lent(&rt, &trap, inv(b"doc"));
    assert!(matches!(verdict, Verdict::Origin(Reason::Trap(_))));
    rt.replenish(&trap, spent);
    for a in &applets {
        assert!(matches!(
            rt.run(a, inv(b"doc"), Arc::new(NoItems)),
            Verdict::Cached
        ));
    }
    assert_eq!(rt.counters.get(Counter::MadeAhead), 4);
}

/// One write of the property below: which instruction, where, and how many bytes for the bulk
/// ones.
#[derive(Clone, Debug)]
enum Poke {
    Store(&'static str, u32),
    Fill(u32, u32),
    Copy(u32, u32),
}

impl Poke {
    fn text(&self) -> String {
        match self {
            Poke::Store(op, at) => {
                let value = match op.split('.').next() {
                    Some("i64") => "(i64.const -1)",
                    Some("f32") => "(f32.const -1)",
                    Some("f64") => "(f64.const -1)",
                    Some("v128") => "(v128.const i64x2 -1 -1)",
                    _ => "(i32.const -1)",
                };
                format!("({op} (i32.const {at}) {value})")
            }
            Poke::Fill(at, n) => {
                format!("(memory.fill (i32.const {at}) (i32.const 0xee) (i32.const {n}))")
            }
            Poke::Copy(at, n) => {
                format!("(memory.copy (i32.const {at}) (i32.const 0) (i32.const {n}))")
            }
        }
    }
}

fn poke() -> impl proptest::strategy::Strategy<Value = Poke> {
    use proptest::prelude::*;
    const MEMORY: u32 = 6 << 16;
    let stores = prop::sample::select(vec![
        "i32.store",
        "i64.store",
        "f32.store",
        "f64.store",
        "i32.store8",
        "i32.store16",
        "i64.store8",
        "i64.store16",
        "i64.store32",
        "v128.store",
    ]);
    prop_oneof![
        (stores, 0..MEMORY - 16).prop_map(|(op, at)| Poke::Store(op, at)),
        (0..MEMORY, 0..MEMORY).prop_map(|(at, n)| Poke::Fill(at, n.min(MEMORY - at))),
        (0..MEMORY, 0u32..70_000).prop_map(|(at, n)| Poke::Copy(at, n.min(MEMORY - at))),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
    /// Whatever a run writes, wherever, its instance comes back byte for byte as it was made.
    #[test]
    fn any_writes_are_rewound(pokes in proptest::collection::vec(poke(), 1..8)) {
        let rt = runtime();
        let body: String = pokes.iter().map(Poke::text).collect();
        let wasm = wat::parse_str(format!(
            r#"(module (memory (export "memory") 6)
                 (data (i32.const 0) "0123456789abcdef")
                 (data (i32.const 262150) "above the first 256 KiB")
                 (func (export "run") (result i32) {body} (i32.const 0)))"#
        ))
        .expect("parses");
        let applet = rt.compile(&wasm).expect("compiles");
        let (verdict, spent, _) = run_lent(&rt, &applet, inv(b"doc"));
        proptest::prop_assert!(matches!(verdict, Verdict::Cached), "{:?}", verdict);
        rt.replenish(&applet, spent);
        proptest::prop_assert_eq!(rt.counters.get(Counter::Rewound), 1);
        proptest::prop_assert_eq!(applet.ready_as_made(), (1, true));
    }
}

/// Counts made on more threads than there are slots add up to the totals, counter by counter.
#[test]
fn counts_from_many_threads_add_up() {
    let c = crate::Counters::default();
    std::thread::scope(|s| {
        for _ in 0..11 {
            s.spawn(|| {
                for _ in 0..1000 {
                    c.add(Counter::Cached, 1);
                    c.add(Counter::Runs, 2);
                }
            });
        }
    });
    assert_eq!(c.get(Counter::Cached), 11_000);
    assert_eq!(c.get(Counter::Runs), 22_000);
    assert_eq!(c.get(Counter::Built), 0);
}
