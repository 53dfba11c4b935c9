//! `loadgen proxy`: a user-space TCP proxy that puts a slow, cut or dead link between two
//! processes on one machine, for fault and latency experiments where netem and network
//! namespaces are out of reach (between the routers and the Postgres servers, or between
//! loadgen and the routers).
//!
//! One process serves many routes (`--route LISTEN=TARGET`) and one control port that takes
//! line commands (`delay`, `cut`, `blackhole`, `heal`, `status`), so a script can change a
//! route while traffic flows through it.
//!
//! It runs on plain threads and blocking sockets rather than tokio because tokio's timer ticks
//! in milliseconds and a 500 µs delay must be 500 µs. Each connection has, for each direction,
//! a reader that stamps what it reads with the instant it is due and a writer that sleeps until
//! then: bytes in flight overlap as on a long wire, so pipelined messages pay the delay once
//! each way, not once each.
//!
//! `link` holds a route's state and the threads that carry its connections; `control` the
//! control port's commands.

use std::collections::HashSet;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::Duration;

mod control;
mod link;
#[cfg(test)]
mod tests;

use self::control::control_loop;
use self::link::{accept_loop, RouteState};

/// Longest delay `--delay-us` and `delay` take: an hour (it keeps instants far from overflow).
const MAX_DELAY_US: u64 = 3_600_000_000;

/// What one read takes at most; a chunk is handed to the writer as it was read.
const READ_BUF: usize = 64 * 1024;

/// Stack of each connection thread: there are four a connection and none recurses or keeps
/// big buffers on the stack, so the default 2 MiB would only cost address space.
const THREAD_STACK: usize = 128 * 1024;

/// Longest wait for the target to take a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Pause after a failed accept (out of file descriptors, say) so it does not become a busy loop.
const ACCEPT_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// `loadgen proxy` options.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Control commands, one a line, each answered by one line `ok` or `error: SENTENCE` (`status` \
first prints one line per route); ROUTE is a route's listen port or `all`:
  delay ROUTE MICROS   deliver each byte MICROS µs after it is read, each way (new bytes)
  cut ROUTE            close the route's connections, and new ones as soon as they are accepted
  blackhole ROUTE      deliver nothing and close nothing; new connections wait to reach the target
  heal ROUTE           pass again, with the route's delay
  status [ROUTE]       a line per route: LISTEN TARGET mode=pass|cut|blackhole delay_us=N
                       connections=N bytes_up=N bytes_down=N (bytes delivered each way)
Example:
  loadgen proxy --route 127.0.0.1:8400=127.0.0.1:7400 --route 127.0.0.1:8401=127.0.0.1:7401 \\
      --control 127.0.0.1:8499 --delay-us 500
  exec 3<>/dev/tcp/127.0.0.1/8499; echo \"cut 8400\" >&3; read -r reply <&3; exec 3>&-
It prints `proxy ready: N routes, control on ADDR` once every port listens, and runs until \
killed.")]
pub struct ProxyArgs {
    /// A route: listen on LISTEN (HOST:PORT) and forward each connection to TARGET (HOST:PORT),
    /// e.g. 127.0.0.1:8400=127.0.0.1:7400. Repeat for more routes. Control commands name a
    /// route by its listen port, so no two routes may share a port.
    #[arg(long = "route", required = true, value_name = "LISTEN=TARGET")]
    pub routes: Vec<String>,
    /// Address (HOST:PORT) of the control port, which takes the commands below from any
    /// client that connects; bind it to a loopback address.
    #[arg(long, value_name = "ADDR")]
    pub control: String,
    /// Initial delay of every route in microseconds, each way (a request and its reply pay
    /// it twice). Change it per route with the `delay` command.
    #[arg(long, default_value_t = 0, value_name = "MICROS")]
    pub delay_us: u64,
}

/// Runs the proxy until the process is killed; returns only when an argument is bad or an
/// address cannot be bound.
pub fn run(args: ProxyArgs) -> Result<i32, crate::Error> {
    let proxy = start(&args)?;
    let mut out = io::stdout().lock();
    writeln!(
        out,
        "proxy ready: {} routes, control on {}",
        proxy.routes.len(),
        proxy.control
    )
    .and_then(|()| out.flush())
    .map_err(|e| format!("cannot write to stdout: {e}"))?;
    drop(out);
    loop {
        thread::park();
    }
}

/// A proxy whose ports all listen and whose threads run.
struct Started {
    control: SocketAddr,
    routes: Vec<Arc<RouteState>>,
}

/// Binds every route and the control port (all or nothing), then starts their threads.
fn start(args: &ProxyArgs) -> Result<Started, crate::Error> {
    check_delay(args.delay_us).map_err(|e| format!("--delay-us {}: {e}", args.delay_us))?;
    let mut bound = Vec::with_capacity(args.routes.len());
    for text in &args.routes {
        bound.push(bind_route(text, args.delay_us)?);
    }
    check_ports(&bound)?;
    let control = TcpListener::bind(&args.control)
        .map_err(|e| format!("--control {}: cannot listen there: {e}", args.control))?;
    let control_addr = control
        .local_addr()
        .map_err(|e| format!("--control {}: {e}", args.control))?;
    let routes: Vec<Arc<RouteState>> = bound.iter().map(|(r, _)| Arc::clone(r)).collect();
    for (route, listener) in bound {
        spawn("proxy-accept", move || accept_loop(route, listener))
            .map_err(|e| format!("cannot start a thread: {e}"))?;
    }
    let shared = Arc::new(routes.clone());
    spawn("proxy-control", move || control_loop(shared, control))
        .map_err(|e| format!("cannot start a thread: {e}"))?;
    Ok(Started {
        control: control_addr,
        routes,
    })
}

/// Parses one `--route LISTEN=TARGET`, resolves the target and binds the listen address.
fn bind_route(text: &str, delay_us: u64) -> Result<(Arc<RouteState>, TcpListener), crate::Error> {
    let (listen, target) = text
        .split_once('=')
        .filter(|(l, t)| !l.is_empty() && !t.is_empty())
        .ok_or_else(|| {
            format!("--route {text:?}: expected LISTEN=TARGET, e.g. 127.0.0.1:8400=127.0.0.1:7400")
        })?;
    // Resolved once: a name lookup on every connection would add its own latency and faults.
    let targets: Vec<SocketAddr> = target
        .to_socket_addrs()
        .map_err(|e| format!("--route {text}: cannot resolve the target {target:?}: {e}"))?
        .collect();
    if targets.is_empty() {
        return Err(format!(
            "--route {text}: the target {target:?} has no address"
        ));
    }
    let listener = TcpListener::bind(listen)
        .map_err(|e| format!("--route {text}: cannot listen on {listen:?}: {e}"))?;
    let listen = listener
        .local_addr()
        .map_err(|e| format!("--route {text}: {e}"))?;
    let route = RouteState::new(listen, target.to_string(), targets, delay_us);
    Ok((Arc::new(route), listener))
}

/// Control commands name a route by its listen port, so each port must be a route's own.
fn check_ports(bound: &[(Arc<RouteState>, TcpListener)]) -> Result<(), crate::Error> {
    let mut seen = HashSet::new();
    for (route, _) in bound {
        if !seen.insert(route.port()) {
            return Err(format!(
                "two --route listen on port {}: control commands name a route by its listen \
                 port, so give each route a port of its own",
                route.port()
            ));
        }
    }
    Ok(())
}

fn check_delay(us: u64) -> Result<(), String> {
    if us > MAX_DELAY_US {
        return Err(format!(
            "{us} µs is longer than the longest delay, {MAX_DELAY_US} µs (an hour)"
        ));
    }
    Ok(())
}

/// Starts a named thread with a small stack.
fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> io::Result<()> {
    thread::Builder::new()
        .name(name.to_string())
        .stack_size(THREAD_STACK)
        .spawn(f)
        .map(drop)
}

/// A lock whose data stays usable when another thread panicked holding it (counters and a
/// mode: nothing a half-done update could leave inconsistent).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
