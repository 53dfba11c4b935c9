//! A route's state and its connections: accepting, connecting to the target, and the reader
//! and writer threads of each direction that carry bytes with their delay.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use super::*;

/// What a route does with its traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Pass = 0,
    Cut = 1,
    Blackhole = 2,
}

impl Mode {
    pub(super) fn from_u8(v: u8) -> Mode {
        match v {
            1 => Mode::Cut,
            2 => Mode::Blackhole,
            _ => Mode::Pass,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Mode::Pass => "pass",
            Mode::Cut => "cut",
            Mode::Blackhole => "blackhole",
        }
    }
}

/// Which way bytes go: up from the client to the target, or down back to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dir {
    Up,
    Down,
}

/// One route's settings, counters and open connections, shared by all its threads.
pub(super) struct RouteState {
    pub(super) listen: SocketAddr,
    /// The target as given, for `status`.
    pub(super) target: String,
    pub(super) target_addrs: Vec<SocketAddr>,
    /// Read on every chunk without a lock; written only under `gate`, so a thread that checks
    /// it under `gate` and then waits on `changed` cannot miss a change.
    pub(super) mode: AtomicU8,
    pub(super) gate: Mutex<()>,
    pub(super) changed: Condvar,
    pub(super) delay_us: AtomicU64,
    /// Bytes delivered (written), not read: a blackholed route's counters stand still.
    pub(super) bytes_up: AtomicU64,
    pub(super) bytes_down: AtomicU64,
    pub(super) conns: Mutex<HashMap<u64, Arc<Conn>>>,
    pub(super) next_id: AtomicU64,
}

impl RouteState {
    pub(super) fn new(
        listen: SocketAddr,
        target: String,
        target_addrs: Vec<SocketAddr>,
        delay: u64,
    ) -> Self {
        RouteState {
            listen,
            target,
            target_addrs,
            mode: AtomicU8::new(Mode::Pass as u8),
            gate: Mutex::new(()),
            changed: Condvar::new(),
            delay_us: AtomicU64::new(delay),
            bytes_up: AtomicU64::new(0),
            bytes_down: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
        }
    }

    pub(super) fn port(&self) -> u16 {
        self.listen.port()
    }

    pub(super) fn mode(&self) -> Mode {
        Mode::from_u8(self.mode.load(Ordering::SeqCst))
    }

    pub(super) fn delay(&self) -> Duration {
        Duration::from_micros(self.delay_us.load(Ordering::Relaxed))
    }

    pub(super) fn set_delay(&self, us: u64) {
        self.delay_us.store(us, Ordering::Relaxed);
    }

    pub(super) fn counter(&self, dir: Dir) -> &AtomicU64 {
        match dir {
            Dir::Up => &self.bytes_up,
            Dir::Down => &self.bytes_down,
        }
    }

    pub(super) fn set_mode(&self, mode: Mode) {
        {
            let _gate = lock(&self.gate);
            self.mode.store(mode as u8, Ordering::SeqCst);
        }
        self.changed.notify_all();
        // After the store: a connection registered after this sweep sees `Cut` in `admit`.
        if mode == Mode::Cut {
            for conn in lock(&self.conns).values() {
                conn.close();
            }
        }
    }

    /// Waits while the route is blackholed (unless `conn` gets closed meanwhile); then whether
    /// `conn` may go on: the route passes and the connection is open.
    pub(super) fn wait_passable(&self, conn: &Conn) -> bool {
        if self.mode() == Mode::Blackhole {
            let mut gate = lock(&self.gate);
            while self.mode() == Mode::Blackhole && !conn.is_closed() {
                gate = self
                    .changed
                    .wait(gate)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        }
        self.mode() == Mode::Pass && !conn.is_closed()
    }

    /// Closes `conn` and wakes its threads that wait out a blackhole.
    pub(super) fn close_conn(&self, conn: &Conn) {
        conn.close();
        // Taking the gate orders this after any waiter's check of `is_closed`: it is either
        // waiting already (and woken) or will see the connection closed.
        drop(lock(&self.gate));
        self.changed.notify_all();
    }

    /// Counts a newly accepted connection in.
    pub(super) fn register(self: &Arc<Self>, client: TcpStream) -> Arc<Link> {
        let conn = Arc::new(Conn::new(client));
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.conns).insert(id, Arc::clone(&conn));
        Arc::new(Link {
            route: Arc::clone(self),
            id,
            conn,
        })
    }

    pub(super) fn status_line(&self) -> String {
        format!(
            "{} {} mode={} delay_us={} connections={} bytes_up={} bytes_down={}",
            self.listen,
            self.target,
            self.mode().name(),
            self.delay_us.load(Ordering::Relaxed),
            lock(&self.conns).len(),
            self.bytes_up.load(Ordering::Relaxed),
            self.bytes_down.load(Ordering::Relaxed),
        )
    }
}

/// The two sockets of one proxied connection.
pub(super) struct Conn {
    pub(super) client: TcpStream,
    pub(super) upstream: OnceLock<TcpStream>,
    /// Guards the upstream's arrival against a close, so neither can miss the other.
    pub(super) closed: Mutex<bool>,
}

impl Conn {
    pub(super) fn new(client: TcpStream) -> Self {
        Conn {
            client,
            upstream: OnceLock::new(),
            closed: Mutex::new(false),
        }
    }

    pub(super) fn is_closed(&self) -> bool {
        *lock(&self.closed)
    }

    /// Shuts both sockets down: blocked reads return 0 and writes fail, so every thread of the
    /// connection ends; the descriptors close when the last of them lets go.
    pub(super) fn close(&self) {
        let mut closed = lock(&self.closed);
        if *closed {
            return;
        }
        *closed = true;
        let _ = self.client.shutdown(Shutdown::Both);
        if let Some(up) = self.upstream.get() {
            let _ = up.shutdown(Shutdown::Both);
        }
    }

    /// Adds the upstream socket; false (and the socket shut) when the connection was closed
    /// while it connected.
    pub(super) fn attach(&self, upstream: TcpStream) -> bool {
        let closed = lock(&self.closed);
        if *closed {
            let _ = upstream.shutdown(Shutdown::Both);
            return false;
        }
        self.upstream.set(upstream).is_ok()
    }

    /// The socket `dir` reads from and the one it writes to.
    pub(super) fn ends(&self, dir: Dir) -> Option<(&TcpStream, &TcpStream)> {
        let up = self.upstream.get()?;
        Some(match dir {
            Dir::Up => (&self.client, up),
            Dir::Down => (up, &self.client),
        })
    }
}

/// A connection as its threads share it: the last one to finish closes it and takes it off
/// the route's list, so `connections=` counts connections with a thread still running.
pub(super) struct Link {
    pub(super) route: Arc<RouteState>,
    pub(super) id: u64,
    pub(super) conn: Arc<Conn>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.route.close_conn(&self.conn);
        lock(&self.route.conns).remove(&self.id);
    }
}

pub(super) fn accept_loop(route: Arc<RouteState>, listener: TcpListener) {
    for client in listener.incoming() {
        match client {
            Ok(client) => admit(&route, client),
            Err(e) => {
                eprintln!("loadgen proxy: {}: cannot accept: {e}", route.listen);
                thread::sleep(ACCEPT_RETRY_PAUSE);
            }
        }
    }
}

/// Takes a new connection in (or closes it at once if the route is cut) and starts the
/// thread that connects it to the target.
pub(super) fn admit(route: &Arc<RouteState>, client: TcpStream) {
    let _ = client.set_nodelay(true);
    // Registered before the check: a cut landing in between closes it in its sweep.
    let link = route.register(client);
    if route.mode() == Mode::Cut {
        return;
    }
    // On failure the closure, and with it the link, is dropped: the connection closes.
    if let Err(e) = spawn("proxy-conn", move || open_upstream(link)) {
        eprintln!(
            "loadgen proxy: {}: cannot start a thread: {e}",
            route.listen
        );
    }
}

/// Connects to the target once the route lets it (a blackhole holds the connect back), then
/// starts the reader and writer of each direction.
pub(super) fn open_upstream(link: Arc<Link>) {
    let route = &link.route;
    if !route.wait_passable(&link.conn) {
        return;
    }
    let upstream = match connect(&route.target_addrs) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "loadgen proxy: {}: cannot connect to {}: {e}",
                route.listen, route.target
            );
            return;
        }
    };
    let _ = upstream.set_nodelay(true);
    if !link.conn.attach(upstream) {
        return;
    }
    for dir in [Dir::Up, Dir::Down] {
        let (tx, rx) = mpsc::channel();
        let (reader, writer) = (Arc::clone(&link), Arc::clone(&link));
        let started = spawn("proxy-read", move || pump_in(reader, dir, tx))
            .and_then(|()| spawn("proxy-write", move || pump_out(writer, dir, rx)));
        if let Err(e) = started {
            eprintln!(
                "loadgen proxy: {}: cannot start a thread: {e}",
                route.listen
            );
            route.close_conn(&link.conn);
            return;
        }
    }
}

pub(super) fn connect(addrs: &[SocketAddr]) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::InvalidInput, "no address to connect to");
    for addr in addrs {
        match TcpStream::connect_timeout(addr, CONNECT_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Reads one direction and hands each chunk to its writer with the instant it is due.
pub(super) fn pump_in(link: Arc<Link>, dir: Dir, tx: Sender<(Instant, Vec<u8>)>) {
    let Some((mut from, _)) = link.conn.ends(dir) else {
        return;
    };
    let mut buf = vec![0u8; READ_BUF];
    // A blackhole stops the reading too: the sender's socket buffers fill as on a dead link,
    // and what the proxy holds stays bounded.
    while link.route.wait_passable(&link.conn) {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let due = Instant::now() + link.route.delay();
        if tx.send((due, buf[..n].to_vec())).is_err() {
            break;
        }
    }
    // Dropping `tx` lets the writer deliver what is queued and then close the connection.
}

/// Writes one direction: each chunk when it is due and the route passes, in order.
pub(super) fn pump_out(link: Arc<Link>, dir: Dir, rx: Receiver<(Instant, Vec<u8>)>) {
    tighten_timer_slack();
    if let Some((_, mut to)) = link.conn.ends(dir) {
        let delivered = link.route.counter(dir);
        while let Ok((due, bytes)) = rx.recv() {
            sleep_until(due, &link.conn);
            if !link.route.wait_passable(&link.conn) || to.write_all(&bytes).is_err() {
                break;
            }
            delivered.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        }
    }
    // A side closed or failed, or the route was cut: end the whole connection, which ends the
    // other direction's threads too.
    link.route.close_conn(&link.conn);
}

/// Longest single sleep of a writer: a connection cut meanwhile ends within this much, whatever
/// the delay.
const SLEEP_SLICE: Duration = Duration::from_millis(50);

/// Sleeps until `due` (one sleep for a short delay, so its precision is the kernel's), or
/// until `conn` is closed.
fn sleep_until(due: Instant, conn: &Conn) {
    loop {
        let now = Instant::now();
        if due <= now || conn.is_closed() {
            return;
        }
        thread::sleep((due - now).min(SLEEP_SLICE));
    }
}

/// Linux wakes a sleeping thread up to its timer slack (50 µs by default) late, a tenth of a
/// 500 µs delay; writers ask for the least.
pub(super) fn tighten_timer_slack() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK only sets a property of the calling thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
    }
}
